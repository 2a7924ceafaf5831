"""The commit journal (vrl/journal.py): one fdatasync per durable commit, and recovery of
what a dead process or a power cut left behind. Every power cut of a scenario with the
journal is swept by tests/test_powercut.py and SIGKILLs by tests/test_crash.py; these pin
the pieces one by one."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from helpers import raw

import vrl.journal as journal
import vrl.journal_handles as journal_handles
from vrl import Repo
from vrl.errors import StorageError


def policy(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"actor.weight": torch.randn(64, 32, generator=g),
            "actor.bias": torch.randn(64, generator=g),
            "critic.weight": torch.randn(32, 32, generator=g)}


def assert_loads(repo: Repo, cid: str, state: dict[str, torch.Tensor]) -> None:
    got = repo.load(cid)
    assert {k: raw(v) for k, v in got.items()} == {k: raw(v) for k, v in state.items()}


def records(repo: Repo) -> list[journal.Record]:
    """The journal's records since its last checkpoint (all materialised: synced first)."""
    repo.sync()
    data = (repo.vrl_dir / "journal").read_bytes()
    found, end = journal.parse(data)
    assert end == journal.read_header(data).applied
    return found


def test_a_small_commit_is_one_fdatasync_written_in_place(tmp_path, monkeypatch):
    """No fsync, one fdatasync, and the record overwrites room the journal already has
    (zero-filled at init, and after a second record in the background): the fdatasync
    then commits no file metadata. The first commit too."""
    repo = Repo.init(tmp_path)
    path = repo.vrl_dir / "journal"
    size = path.stat().st_size
    assert size >= journal.HEADER.size + journal.INIT_ROOM
    calls: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, n=name, r=real: (
            calls.append(f"{n} {os.path.basename(os.readlink(f'/proc/self/fd/{fd}'))}"),
            r(fd))[1])
    for i in range(3):
        calls.clear()
        cid = repo.commit(policy(i), env=False, message=f"commit {i}")
        repo.journal.wait()  # (its files are written in the background)
        assert calls == ["fdatasync journal"]
        assert path.stat().st_size == size  # written in place
    monkeypatch.undo()
    (record,) = records(repo)[-1:]
    assert (record.ref, record.new) == ("refs/heads/main", cid)
    assert [log for log, _ in record.logs] == ["refs/heads/main", "HEAD"]
    assert record.pack and (repo.vrl_dir / "objects" / "pack" / record.pack).read_bytes() \
        == record.body
    fresh = Repo(tmp_path, verify=True)
    assert fresh.head() == cid and fresh.fsck()["ok"]
    assert fresh.refs.reflog("HEAD")[0].new == cid


def test_room_is_made_ahead_of_records_that_outgrow_it(tmp_path, monkeypatch):
    """Records bigger than the journal's room are appended; from the second on, the
    write-out zero-fills room for the next ones (then written in place)."""
    monkeypatch.setattr(journal, "INIT_ROOM", 0)
    repo = Repo.init(tmp_path)
    path = repo.vrl_dir / "journal"
    sizes = []
    for i in range(4):
        repo.commit(policy(i), env=False)
        repo.sync()
        sizes.append(path.stat().st_size)
    ends = [r.end for r in records(repo)]
    assert sizes[0] == ends[0]  # appended, no room made after a first record
    assert sizes[1] >= ends[1] + 2 * (ends[1] - ends[0])  # room for the next ones
    assert sizes[3] == sizes[2] == sizes[1]  # written in place


def test_a_commit_returns_before_its_files_and_every_reader_sees_it(tmp_path, monkeypatch):
    """The ref, reflog lines and pack are written in the background after commit
    returned: until they are, this process reads the commit from memory or waits, and
    another process waits for the journal's holder - no reader misses a reported commit."""
    repo = Repo.init(tmp_path)
    first = repo.commit(policy(0), env=False)
    repo.sync()
    go = threading.Event()
    real = journal.Journal._apply

    def slow(self, record, recovering, sealed=None):
        if not recovering:
            assert go.wait(30)
        return real(self, record, recovering, sealed)

    monkeypatch.setattr(journal.Journal, "_apply", slow)
    state = policy(1)
    cid = repo.commit(state, env=False, message="second")
    ref = repo.vrl_dir / "refs" / "heads" / "main"
    assert ref.read_text() == first + "\n"  # not written yet ...
    assert repo.objects.read(cid)[0] == "commit"  # ... its objects are read from memory
    assert repo.read_commit(cid).parents == (first,)
    reader = subprocess.Popen([sys.executable, "-m", "vrl", "-C", str(tmp_path), "log",
                               "--oneline"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert reader.poll() is None  # waiting for the journal's holder
    threading.Timer(0.5, go.set).start()
    start = time.monotonic()
    assert Repo(tmp_path).head() == cid  # this process: waits too
    assert time.monotonic() - start > 0.3
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0 and out.splitlines()[0].startswith(cid[:7])
    assert ref.read_text() == cid + "\n"
    assert_loads(Repo(tmp_path, verify=True), cid, state)


@pytest.mark.parametrize("when", ["returns", "exit-handler", "early-exit-handler",
                                  "committer-exit"])
def test_a_commit_made_as_the_interpreter_exits_is_written_out(tmp_path, when):
    """A process that ends right after a commit (`returns`), or commits in an exit handler
    (a Snapshotter's last flush) registered after vrl was imported or before (it then
    runs after vrl's own, which finishes the queued write-outs), or ends as the
    Snapshotter's committer does, without the interpreter's teardown, right after a
    commit of 64 tensors (`committer-exit`): its files are all in place when the process
    is gone, not left for the next one to replay."""
    Repo.init(tmp_path)
    state = "{f'layer{i}': np.full((64, 64), i, np.float32) for i in range(64)}" \
        if when == "committer-exit" else "{'w': np.ones(8)}"
    commit = f"print(Repo(sys.argv[1]).commit({state}, env=False), flush=True)"
    script = {
        "returns": f"import sys, numpy as np\nfrom vrl import Repo\n{commit}\n",
        "exit-handler": "import atexit, sys, numpy as np\nfrom vrl import Repo\n"
                        f"atexit.register(lambda: {commit})\n",
        "early-exit-handler": "import atexit, sys\n"
                              "def flush():\n    import numpy as np\n"
                              "    from vrl import Repo\n"
                              f"    {commit}\n"
                              "atexit.register(flush)\nimport numpy, vrl\n",
        "committer-exit": "import sys, numpy as np\nfrom vrl import Repo\n"
                          f"from vrl.committer import _exit\n{commit}\n_exit(0)\n"}[when]
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    assert (tmp_path / ".vrl" / "refs" / "heads" / "main").read_text() == cid + "\n"
    data = (tmp_path / ".vrl" / "journal").read_bytes()
    assert journal.read_header(data).applied == journal.parse(data)[1]  # all written out
    assert Repo(tmp_path, verify=True).fsck()["ok"]


def test_after_a_power_cut_every_lost_file_is_written_again(tmp_path, monkeypatch):
    """What a cut can lose of a journaled commit - its pack, the ref's content, reflog
    lines - comes back from the journal when the repository is opened after the reboot."""
    repo = Repo.init(tmp_path)
    states = [policy(i) for i in range(3)]
    ids = [repo.commit(s, env=False) for s in states]
    repo.sync()
    packs = {r.pack for r in records(repo)}
    for name in packs:
        (repo.vrl_dir / "objects" / "pack" / name).unlink()
    (repo.vrl_dir / "refs" / "heads" / "main").write_bytes(b"")  # renamed, never written
    log = repo.vrl_dir / "logs" / "HEAD"
    log.write_bytes(log.read_bytes().split(b"\n", 1)[0] + b"\n")  # only the first line
    monkeypatch.setattr(journal, "boot_id", lambda: "after-the-reboot")
    fresh = Repo(tmp_path, verify=True)
    assert fresh.head() == ids[-1]
    for cid, state in zip(ids, states, strict=True):
        assert_loads(fresh, cid, state)
    assert [e.new for e in fresh.refs.reflog("HEAD")] == ids[::-1]
    assert fresh.fsck()["ok"], fresh.fsck()["problems"]
    # then checkpointed: durable in place, the journal empty again
    assert records(fresh) == [] and all(
        (repo.vrl_dir / "objects" / "pack" / name).exists() for name in packs)


def test_replay_never_undoes_a_later_ref_change(tmp_path, monkeypatch):
    """A reset to an older commit gives the ref a value a record moved it away from:
    the reset checkpoints first, so no reboot can move the ref forward again."""
    repo = Repo.init(tmp_path)
    first = repo.commit(policy(0), env=False)
    repo.commit(policy(1), env=False)
    repo.reset(first)
    assert records(repo) == []
    monkeypatch.setattr(journal, "boot_id", lambda: "after-the-reboot")
    assert Repo(tmp_path).head() == first


def test_a_torn_record_is_invalidated_and_moves_nothing(tmp_path):
    """A record torn by a crash (written in place over the journal's room, never
    fdatasynced, so never reported) is not replayed, and no reader takes it for a
    pending one."""
    repo = Repo.init(tmp_path)
    cid = repo.commit(policy(0), env=False)
    repo.commit(policy(1), env=False)
    second = records(repo)[1]
    path = repo.vrl_dir / "journal"
    data = bytearray(path.read_bytes())
    data[second.offset + 100:second.end] = bytes(second.end - second.offset - 100)
    data[48:56] = second.offset.to_bytes(8, "little")  # the holder died before marking it
    path.write_bytes(bytes(data))
    (repo.vrl_dir / "refs" / "heads" / "main").write_text(cid + "\n")  # never moved
    log = repo.vrl_dir / "logs" / "refs" / "heads" / "main"
    log.write_bytes(log.read_bytes().split(b"\n", 1)[0] + b"\n")
    (repo.vrl_dir / "logs" / "HEAD").write_bytes(log.read_bytes())
    assert repo.journal._behind(None)  # it looks like a pending record ...
    fresh = Repo(tmp_path, verify=True)
    assert fresh.head() == cid
    assert not fresh.journal._behind(None)  # ... until the first holder looked at it
    assert [r.new for r in records(fresh)] == [cid]
    assert fresh.fsck()["ok"]
    again = fresh.commit(policy(2), env=False)
    assert Repo(tmp_path).head() == again
    assert [r.new for r in records(fresh)] == [cid, again]


@pytest.mark.parametrize("fail", ["fdatasync", "pwritev"])
def test_a_failed_append_moves_nothing(tmp_path, monkeypatch, fail):
    repo = Repo.init(tmp_path)
    first = repo.commit(policy(0), env=False)
    before = records(repo)
    logs = (repo.vrl_dir / "logs" / "HEAD").read_bytes()
    real = getattr(os, fail)

    def broken(fd, *a):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/journal"):
            raise OSError(errno.EIO if fail == "fdatasync" else errno.ENOSPC, "injected")
        return real(fd, *a)

    monkeypatch.setattr(os, fail, broken)
    with pytest.raises(StorageError, match="disk full" if fail == "pwritev" else "I/O error"):
        repo.commit(policy(1), env=False)
    monkeypatch.undo()
    assert records(repo) == before
    assert (repo.vrl_dir / "logs" / "HEAD").read_bytes() == logs
    assert Repo(tmp_path).head() == first
    state = policy(2)
    cid = repo.commit(state, env=False)
    assert_loads(Repo(tmp_path, verify=True), cid, state)
    assert [r.new for r in records(repo)] == [first, cid]


def test_a_commit_of_many_small_tensors_is_one_record(tmp_path):
    """A record has more parts than one pwritev takes (two per small object)."""
    repo = Repo.init(tmp_path)
    state = {f"layer{i}.bias": torch.full((3,), float(i)) for i in range(3000)}
    cid = repo.commit(state, env=False)
    assert [r.new for r in records(repo)] == [cid]
    assert_loads(Repo(tmp_path, verify=True), cid, state)


@pytest.mark.parametrize("what", ["ref", "reflog", "pack"])
def test_a_failed_materialisation_is_finished_once_it_can_be(tmp_path, monkeypatch, what):
    """The pack, a reflog line or the ref cannot be written after the record is durable
    (e.g. a full disk; this is done in the background, after commit returned): the
    commit stands. Every later command of this process reports the error while it lasts
    (it tries again first), nothing is half-written, and the first command after it
    finishes the commit, whole."""
    repo = Repo.init(tmp_path)
    first = repo.commit(policy(0), env=False)
    repo.sync()
    target, name = {"ref": (journal.RefStore, "_write_file"),
                    "reflog": (journal.RefStore, "_append_log"),
                    "pack": (journal.FileObjectStore, "stage_pack")}[what]

    def full(self, *a, **k):
        raise journal.storage_error(OSError(errno.ENOSPC, "full"), tmp_path, "writing")

    monkeypatch.setattr(target, name, full)
    state = policy(1)
    cid = repo.commit(state, env=False)  # durable: its record is
    for _ in range(2):
        with pytest.raises(StorageError, match="recorded .* disk full") as info:
            repo.head()
        assert "\n" not in str(info.value)
    monkeypatch.undo()
    assert (repo.vrl_dir / "refs" / "heads" / "main").read_text() == first + "\n"
    assert repo.head() == cid
    assert [e.new for e in repo.refs.reflog("HEAD")] == [cid, first]
    assert_loads(Repo(tmp_path, verify=True), cid, state)
    assert Repo(tmp_path).fsck()["ok"]


def test_the_journal_is_checkpointed_when_it_grows(tmp_path, monkeypatch):
    """Past JOURNAL_MAX, a checkpoint starts a new epoch at the start: the file keeps its
    room (bounded by what records reach), the older records are stale, not replayed."""
    monkeypatch.setattr(journal, "JOURNAL_MAX", 40_000)
    repo = Repo.init(tmp_path)
    path = repo.vrl_dir / "journal"
    seen, sizes, epochs = [], [], set()
    for i in range(12):
        seen.append(repo.commit(policy(i), env=False))
        found = records(repo)
        if found:
            assert [r.new for r in found] == seen[-len(found):]
        sizes.append(path.stat().st_size)
        epochs.add(journal.read_header(path.read_bytes()).epoch)
    assert len(epochs) >= 3  # checkpointed at least twice
    assert max(sizes) <= max(40_000 + 2 * 16_000 + 2 * journal.ROOM_MIN,
                             journal.HEADER.size + journal.INIT_ROOM)
    monkeypatch.setattr(journal, "boot_id", lambda: "after-the-reboot")
    fresh = Repo(tmp_path, verify=True)  # a replay of the stale records would fail fsck
    assert fresh.head() == seen[-1] and fresh.fsck()["ok"]


def test_another_thread_waits_while_the_journal_is_held(tmp_path):
    """flock does not exclude threads of one process (they share the open file): the
    journal's own lock must, across repository objects too."""
    holder = Repo.init(tmp_path)
    holder.commit(policy(0), env=False)
    other = Repo(tmp_path)
    landed: list[str] = []
    thread = threading.Thread(target=lambda: landed.append(
        other.commit(policy(1), env=False, ref="refs/heads/main")))
    with holder.journal.held():
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not landed  # waiting for the journal
    thread.join(30)
    assert landed and Repo(tmp_path).head() == landed[0]


def test_threads_of_one_process_commit_to_many_branches(tmp_path):
    Repo.init(tmp_path).commit(policy(0), env=False)
    done: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def work(branch: str) -> None:
        try:
            repo = Repo(tmp_path)
            repo.branch(branch)
            done[branch] = [repo.commit(policy(i + 1), env=False, ref=f"refs/heads/{branch}")
                            for i in range(8)]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"b{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert {r.new for r in records(Repo(tmp_path))} <= {c for ids in done.values() for c in ids}
    repo = Repo(tmp_path, verify=True)
    for branch, ids in done.items():
        assert [e.id for e in repo.log(branch)][:8] == ids[::-1]
    assert repo.fsck()["ok"]


def test_without_a_boot_id_or_when_turned_off_commits_take_three_rounds(tmp_path,
                                                                       monkeypatch):
    repo = Repo.init(tmp_path)
    assert repo._journaled and not Repo(tmp_path, journal=False)._journaled
    repo.config.set("core", "journal", "false")
    repo.config.save()
    assert not Repo(tmp_path)._journaled
    monkeypatch.setattr(journal, "boot_id", lambda: None)
    repo = Repo(tmp_path)
    assert repo.journal is None and not repo._journaled
    cid = repo.commit(policy(0), env=False)
    assert Repo(tmp_path).head() == cid


def test_a_hostile_journal_writes_nothing_outside_the_repository(tmp_path, monkeypatch):
    """A repository copied from elsewhere is replayed on open (another boot id): records
    naming a pack, ref or reflog outside the repository's own places are not applied."""
    repo = Repo.init(tmp_path / "repo")
    cid = repo.commit(policy(0), env=False)
    good = records(repo)[0]
    path = repo.vrl_dir / "journal"
    for ref, log, pack in (("refs/heads/../../../../outside", "refs/heads/main", None),
                           ("refs/heads/main", "../../../outside", None),
                           ("refs/heads/main", "refs/heads/main", "../../../outside.pack")):
        header = path.read_bytes()[:journal.HEADER.size]
        record = journal.encode(ref, None, cid, [(log, good.logs[0][1])], pack, [b"x" * 64])
        path.write_bytes(header + b"".join(record))
        monkeypatch.setattr(journal, "boot_id", lambda: "another-machine")
        Repo(tmp_path / "repo")
        monkeypatch.undo()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]
        assert not list((tmp_path / "repo").glob("outside*"))
    assert Repo(tmp_path / "repo", verify=True).fsck()["ok"]


def test_a_repository_made_again_at_the_same_path_gets_its_own_journal(tmp_path):
    import shutil

    first = Repo.init(tmp_path / "repo")
    first.commit(policy(0), env=False)
    first.sync()  # (its files are written in the background)
    shutil.rmtree(tmp_path / "repo")
    again = Repo.init(tmp_path / "repo")
    cid = again.commit(policy(1), env=False)
    assert [r.new for r in records(again)] == [cid]  # not the deleted file's


def test_a_forked_child_commits_through_its_own_threads(tmp_path):
    """A child forked after commits inherits the pools' objects but not their threads:
    work handed to them would wait forever."""
    repo = Repo.init(tmp_path)
    repo.commit(policy(0), env=False)
    pid = os.fork()
    if pid == 0:  # the child: commit, then leave without running the parent's cleanup
        code = 1
        try:
            Repo(tmp_path).commit(policy(1), env=False)
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child's commit hung")
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(list(Repo(tmp_path).log())) == 2


def test_no_journal_stays_open_once_its_repositories_are_gone(tmp_path):
    import gc

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    Repo.init(tmp_path / "warm").commit(policy(0), env=False)
    gc.collect()
    before = open_fds()
    for i in range(20):
        Repo.init(tmp_path / f"r{i}").commit(policy(i), env=False)
    gc.collect()
    Repo(tmp_path / "warm").commit(policy(1), env=False)  # closes what the gone ones left
    assert open_fds() <= before + 2  # (pools' threads hold no file)


def test_a_repository_freed_while_the_journal_table_is_locked_does_not_hang(tmp_path):
    """A finalizer runs in whatever allocation sets off the garbage collector - also one
    made while the table of open journals is locked (a repository opened meanwhile): it
    must not take that lock (this hung the test suite once)."""
    import gc

    holder = [Repo.init(tmp_path)]
    holder[0].commit(policy(0), env=False)
    done = threading.Event()

    def free() -> None:
        with journal_handles.HANDLES_LOCK:
            holder.clear()  # the repository is in reference cycles: only gc frees it
            gc.collect()
        done.set()

    thread = threading.Thread(target=free, daemon=True)
    thread.start()
    thread.join(20)
    assert done.is_set(), "a journal's finalizer waited for a lock its own thread held"
    assert Repo(tmp_path).commit(policy(1), env=False)


def test_a_journal_held_too_long_by_another_process_is_a_clear_error(tmp_path, monkeypatch):
    """Like a ref's lock: a holder that is stopped (not dead) makes others give up with a
    one-line error instead of waiting forever."""
    import fcntl

    repo = Repo.init(tmp_path)
    head = repo.commit(policy(0), env=False)
    monkeypatch.setattr(journal, "LOCK_TIMEOUT", 0.3)
    other = os.open(repo.vrl_dir / "journal", os.O_RDWR)  # another open file: as a process
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(journal.RefConflictError, match="held by another vrl process"):
            repo.commit(policy(1), env=False)
    finally:
        os.close(other)
    assert Repo(tmp_path).head() == head
    assert repo.commit(policy(1), env=False) != head


def test_a_journal_of_the_format_before_epochs_is_replayed_and_converted(tmp_path):
    """A repository whose journal was written by vrl before epochs (b"vrljrnl1": records
    appended, no epoch) with a record still pending: the first holder re-applies it and
    starts the journal afresh in the current format."""
    import json
    import struct

    import xxhash

    repo = Repo.init(tmp_path)
    first = repo.commit(policy(0), env=False)
    state = policy(1)
    cid = repo.commit(state, env=False)
    record = records(repo)[-1]
    # undo its materialisation, and write the journal as the old format had it
    (repo.vrl_dir / "refs" / "heads" / "main").write_text(first + "\n")
    for log in ("logs/HEAD", "logs/refs/heads/main"):
        path = repo.vrl_dir / log
        path.write_bytes(path.read_bytes().replace(record.logs[0][1], b""))
    (repo.vrl_dir / "objects" / "pack" / record.pack).unlink()
    meta = json.dumps({"ref": record.ref, "old": record.old, "new": record.new,
                       "pack": record.pack, "external": False,
                       "logs": [[log, line.decode()] for log, line in record.logs]}).encode()
    body = record.body
    old_record = struct.pack("<4sIQ16s", b"VJR1", len(meta), len(body),
                             xxhash.xxh3_128(meta + body).digest()) + meta + body
    header = struct.pack("<8s40sQ8x", b"vrljrnl1", journal.boot_id().encode().ljust(40), 64)
    (repo.vrl_dir / "journal").write_bytes(header + old_record)
    assert Repo(tmp_path).head() == cid  # (a reader waits for it to be re-applied)
    fresh = Repo(tmp_path, verify=True)
    assert_loads(fresh, cid, state)
    assert [e.new for e in fresh.refs.reflog("HEAD")][:2] == [cid, first]
    data = (repo.vrl_dir / "journal").read_bytes()
    assert journal.read_header(data).magic == journal.MAGIC and records(fresh) == []
    assert fresh.fsck()["ok"]
    again = fresh.commit(policy(2), env=False)
    assert [r.new for r in records(fresh)] == [again]


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_commit_after_another_process_moved_refs_reads_them_again(tmp_path, monkeypatch,
                                                                   checkpointed):
    """A commit reuses HEAD's target and its ref's value from this process's last commit
    only while the journal says nothing changed since: another process's reset (outside
    the journal), detached HEAD and commit (a record) are each seen by the next commit.
    `checkpointed`: every commit of this process ends with a checkpoint, so the other
    process changes refs while the journal holds no record."""
    if checkpointed:
        monkeypatch.setattr(journal, "JOURNAL_MAX", 0)
    repo = Repo.init(tmp_path)
    c0 = repo.commit(policy(0), env=False)
    c1 = repo.commit(policy(1), env=False)

    def other(code: str) -> str:
        # (numpy, not torch: a process that needs no torch starts in a fraction of the time)
        script = ("import sys, numpy as np; from vrl import Repo; repo = Repo(sys.argv[1]); "
                  "policy = lambda i: {'w': np.full(4, float(i), np.float32)}; " + code)
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    other(f"repo.reset('{c0}')")  # main back to c0, outside the journal
    c2 = repo.commit(policy(2), env=False)
    assert repo.read_commit(c2).parents == (c0,)
    c3 = other("print(repo.commit(policy(3), env=False))")  # a record of its own
    c4 = repo.commit(policy(4), env=False)
    assert repo.read_commit(c4).parents == (c3,) and repo.read_commit(c3).parents == (c2,)
    other(f"repo.checkout('{c1}')")  # HEAD detached at c1
    c5 = repo.commit(policy(5), env=False)
    fresh = Repo(tmp_path)
    assert fresh.read_commit(c5).parents == (c1,)
    assert fresh.refs.read("HEAD") == c5 and fresh.refs.read("refs/heads/main") == c4
    assert [e.new for e in fresh.refs.reflog("refs/heads/main")][:4] == [c4, c3, c2, c0]
    assert fresh.fsck()["ok"]


def test_a_records_metadata_is_its_json():
    """The record's metadata, written directly, is the JSON text of its fields (json.loads
    reads it back when the journal is replayed)."""
    import json

    from vrl.journal import _meta_json

    cases = [("refs/heads/main", None, "a" * 64, "pack-b.pack", False,
              [("refs/heads/main", b"x y 1 commit: \xc3\xa9\x01\t\"\\\n"), ("HEAD", b"z")]),
             ("HEAD", "c" * 64, "d" * 64, None, True, []),
             ("refs/tags/\u00e9\u2603", None, "e" * 64, None, False, [("a", b"")])]
    for ref, old, new, pack, external, logs in cases:
        text = _meta_json(ref, old, new, pack, external, logs)
        assert text == json.dumps({"ref": ref, "old": old, "new": new, "pack": pack,
                                   "external": external,
                                   "logs": [[log, line.decode()] for log, line in logs]},
                                  separators=(",", ":"))
        assert text.isascii()
