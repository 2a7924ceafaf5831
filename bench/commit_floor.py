"""How fast can a durable small commit be on this filesystem? The floor of vrl's protocol.

    python bench/commit_floor.py [--runs 40] [--work DIR]

A durable commit that is safe against a power cut on any POSIX filesystem (the lazy-fsync
model of tests/test_powercut.py) needs, for a pack of new objects and a ref moved by
rename, three rounds of fsync, each waiting for the one before (fsyncs within one round run
concurrently and a journalling filesystem commits them together):

  1. the pack's temp file (its data must be durable before its name can appear);
  2. after its rename: the pack directory, the ref's temp file and the reflog lines
     (everything the ref will name is durable before the ref's rename);
  3. after the ref's rename: the ref directory (the commit is durable on return).

With the commit journal (vrl/journal.py, vrl's default on Linux) a commit is one round:
the record appended and fdatasynced, then the pack, reflog line and ref written without
fsync (a big pack: written to its own file, fsynced in that same round). vrl's commit
returns at the commit point and writes the rest in the background: the rows "to the commit
point" time only what it waits for (the rest runs untimed between rounds). Its records are
written in place, over space the journal has zero-filled and fsynced before ("written in
place"): the fdatasync then commits no file metadata.

This script times exactly those file operations with no vrl code around them (the floor),
one round fewer and one more (vrl before this change made four: the pack directory had a
round of its own), interleaved with the baselines of bench/store_bench.py (save_file /
torch.save of the same ~0.7 MB policy, then the file and its directory fsynced) and with
real vrl commits of that policy. All figures are medians of --runs rounds; each round runs
every contender once, so load changes hit them alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from store_bench import durable, small_policy  # noqa: E402

from vrl import Repo  # noqa: E402
from vrl.refs import _exchange  # noqa: E402

POOL = ThreadPoolExecutor(8)


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def protocol(root: str, payload: bytes, rounds: int, serial: list[int]) -> None:
    """The file operations of one small commit (pack temp file, rename, ref temp file,
    reflog line, ref rename) with `rounds` rounds of fsync: 4 (vrl before), 3 (vrl now,
    the minimum that is crash-safe), or 2 (NOT crash-safe: the pack is renamed before its
    data is durable; only shows what one round more costs)."""
    serial[0] += 1
    n = serial[0]
    tmp = f"{root}/pack/.tmp-{n}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, payload)
    if rounds >= 3:
        os.fsync(fd)  # round 1: the pack's data
        os.close(fd)
        fd = -1
    os.rename(tmp, f"{root}/pack/pack-{n}")
    ref_tmp = f"{root}/refs/.tmp-{n}"
    rfd = os.open(ref_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(rfd, b"0" * 64 + b"\n")
    lfd = os.open(f"{root}/logs/main", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(lfd, b"x" * 171 + b"\n")
    pfd = os.open(f"{root}/pack", os.O_RDONLY)
    fds = [pfd, rfd, lfd] + ([fd] if fd >= 0 else [])
    if rounds == 4:
        os.fsync(pfd)  # the pack directory in a round of its own
        list(POOL.map(os.fsync, [rfd, lfd]))
    else:
        list(POOL.map(os.fsync, fds))  # one round: pack directory, ref temp file, reflog
    for f in fds:
        os.close(f)
    os.rename(ref_tmp, f"{root}/refs/main")
    fsync_path(f"{root}/refs")  # last round: the ref's rename


def journaled(root: str, payload: bytes, jfd: int, serial: list[int], own_file: bool,
              stage: str = "all") -> None:
    """The file operations of a commit through the commit journal (vrl/journal.py): the
    record appended and fdatasynced (the commit point; with `own_file`, as for a big pack,
    the pack goes to its own file fsynced in the same round with its directory and a small
    record), then the pack, reflog line and ref written without fsync. `stage`: "point"
    does only what comes before commit() returns, "after" only what vrl's background
    thread does then (as a pack in the record, not in a file of its own)."""
    serial[0] += 1
    n = serial[0]
    pack_tmp = f"{root}/pack/.tmp-{n}"
    if stage == "point":
        os.write(jfd, payload)
        os.fdatasync(jfd)
        return
    if stage == "after":
        own_file = False
    if own_file:
        fd = os.open(pack_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        os.write(fd, payload)
        os.rename(pack_tmp, f"{root}/pack/pack-{n}")
        os.write(jfd, b"r" * 400)
        pfd = os.open(f"{root}/pack", os.O_RDONLY)
        list(POOL.map(os.fsync, [jfd, fd, pfd]))
        os.close(pfd)
        os.close(fd)
    else:
        if stage == "all":
            os.write(jfd, payload)
            os.fdatasync(jfd)
        fd = os.open(pack_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        os.write(fd, payload)
        os.close(fd)
        os.rename(pack_tmp, f"{root}/pack/pack-{n}")
    lfd = os.open(f"{root}/logs/main", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(lfd, b"x" * 171 + b"\n")
    os.close(lfd)
    ref_tmp = Path(f"{root}/refs/.tmp-{n}")
    rfd = os.open(ref_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(rfd, b"0" * 64 + b"\n")
    os.close(rfd)
    if not _exchange(ref_tmp, Path(f"{root}/refs/main")):
        os.rename(ref_tmp, f"{root}/refs/main")


def in_place(jfd: int, payload: bytes, at: list[int], room: int) -> None:
    """What vrl's commit now waits for: the record written over zero-filled, fsynced
    space the journal already has (its fdatasync commits no file metadata), wrapping
    around as a checkpoint does."""
    if at[0] + len(payload) > room:
        at[0] = 0
    os.pwrite(jfd, payload, at[0])
    os.fdatasync(jfd)
    at[0] += len(payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="vrl-floor-"))
    state = small_policy()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    first_pack = os.urandom(nbytes + 4096)
    incr_pack = os.urandom(70_000)  # one 64 KiB tensor + manifest + commit
    try:
        root = str(work / "proto")
        for sub in ("pack", "refs", "logs"):
            os.makedirs(f"{root}/{sub}")
        serial = [0]
        jfd = os.open(f"{root}/journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        room, at = 8 << 20, [0]
        ifd = os.open(f"{root}/journal-in-place", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(ifd, bytes(room))
        os.fsync(ifd)
        repos = work / "repos"
        repos.mkdir()
        incr_repo = Repo.init(work / "incr")
        incr_repo.commit(state, env=False)
        victim = next(iter(state.values()))
        holder: dict[str, Repo] = {}

        def fresh_repo() -> None:
            path = repos / str(len(list(repos.iterdir())))
            Repo.init(path)
            holder["repo"] = Repo(path)

        def incremental() -> None:
            victim.add_(0.001)
            incr_repo.commit(state, env=False)

        st, pt, one = work / "m.safetensors", work / "m.pt", work / "one"
        # name -> (timed, untimed before it); for the two "to the commit point" floors the
        # untimed one does the previous round's background part
        contenders: dict[str, tuple[Callable[[], object], Callable[[], object] | None]] = {
            "save_file + fsync (file, dir)":
                (lambda: durable(st, lambda: save_file(state, str(st))), None),
            "torch.save + fsync (file, dir)":
                (lambda: durable(pt, lambda: torch.save(state, pt)), None),
            "save_file, no fsync": (lambda: save_file(state, str(st)), None),
            "one 1-byte file rewritten + fsync (file, dir)":
                (lambda: durable(one, lambda: one.write_bytes(b"1")), None),
            "floor, 4 rounds, first-commit pack": (
                lambda: protocol(root, first_pack, 4, serial), None),
            "floor, 3 rounds, first-commit pack": (
                lambda: protocol(root, first_pack, 3, serial), None),
            "floor, 4 rounds, incremental pack": (
                lambda: protocol(root, incr_pack, 4, serial), None),
            "floor, 3 rounds, incremental pack": (
                lambda: protocol(root, incr_pack, 3, serial), None),
            "(unsafe) 2 rounds, incremental pack": (
                lambda: protocol(root, incr_pack, 2, serial), None),
            "floor, journal, first-commit pack in its own file": (
                lambda: journaled(root, first_pack, jfd, serial, True), None),
            "floor, journal, incremental pack in the record": (
                lambda: journaled(root, incr_pack, jfd, serial, False), None),
            # what vrl's commit now waits for: the rest is written in the background
            "floor, journal, first-commit pack in the record, to the commit point": (
                lambda: journaled(root, first_pack, jfd, serial, False, "point"),
                lambda: journaled(root, first_pack, jfd, serial, False, "after")),
            "floor, journal, incremental pack in the record, to the commit point": (
                lambda: journaled(root, incr_pack, jfd, serial, False, "point"),
                lambda: journaled(root, incr_pack, jfd, serial, False, "after")),
            "floor, journal, incremental pack in the record written in place, to the "
            "commit point": (lambda: in_place(ifd, incr_pack, at, room),
                             lambda: journaled(root, incr_pack, jfd, serial, False, "after")),
            "vrl first commit": (lambda: holder["repo"].commit(state, env=False),
                                 fresh_repo),
            "vrl incremental commit": (incremental, None),
        }
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(args.runs):
            for name, (fn, setup) in contenders.items():
                if setup:
                    setup()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
                for repo in (incr_repo, holder.get("repo")):  # a commit's background
                    if repo is not None:  # write-out is not timed with the next contender
                        repo.sync()
        base = statistics.median(times["save_file + fsync (file, dir)"])
        base_pt = statistics.median(times["torch.save + fsync (file, dir)"])
        print(f"load average: {os.getloadavg()[0]:.2f}; policy {nbytes / 1e6:.2f} MB; "
              f"medians of {args.runs}")
        print("| operation | median | / save_file+fsync | / torch.save+fsync |")
        print("|---|---|---|---|")
        for name, values in times.items():
            m = statistics.median(values)
            print(f"| {name} | {m * 1e3:.2f} ms | {m / base:.2f}x | {m / base_pt:.2f}x |")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
