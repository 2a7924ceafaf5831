"""Failures and bad input: a full disk, a read-only repository, corrupted, truncated and
missing objects. Each must give a one-line error (a VrlError in Python, `error: ...` and a
non-zero exit code in the CLI) and leave nothing half-written. Plus: metadata-only commands
must not import torch."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import vrl.direct_io
import vrl.refs
import vrl.repo
from vrl import Repo
from vrl.cli import main
from vrl.errors import CorruptObjectError, StorageError, VrlError, storage_error
from vrl.objects import HEADER_SIZE


def small_state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"actor.weight": torch.randn(16, 8, generator=g),
            "actor.bias": torch.randn(16, generator=g),
            "critic.weight": torch.randn(512, 520, generator=g)}  # > 1 MiB: a loose file


def big_state(mb: float) -> dict[str, torch.Tensor]:
    n = int(mb * 1e6 / 4 / 4)
    g = torch.Generator().manual_seed(99)
    return {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(4)}


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_restores(repo: Repo, rev: str, state: dict[str, torch.Tensor]) -> None:
    got = repo.load(rev)
    assert list(got) == list(state)
    for name, t in state.items():
        assert got[name].dtype == t.dtype and raw(got[name]) == raw(t), name


def temp_files(vrl_dir: Path) -> list[Path]:
    return [p for p in vrl_dir.rglob("*") if ".tmp" in p.name or p.name.endswith(".lock")]


def snapshot_of_disk(vrl_dir: Path) -> dict[str, bytes]:
    """Every ref, reflog and config file (objects are checked by fsck; the commit journal
    by opening the repository, which re-applies any record left in it, and checking HEAD:
    a checkpoint may empty the journal at any ref change)."""
    return {rel: p.read_bytes() for p in vrl_dir.rglob("*")
            if p.is_file() and not (rel := p.relative_to(vrl_dir).as_posix()).startswith(
                ("objects/", "journal"))}


def assert_unharmed(path: Path, before: dict[str, bytes], head: str,
                    state: dict[str, torch.Tensor]) -> None:
    """Nothing half-written: refs, reflogs and config as they were, no temp or lock files,
    fsck clean (orphan objects allowed), the last snapshot restores."""
    vrl_dir = path / ".vrl"
    assert temp_files(vrl_dir) == []
    assert snapshot_of_disk(vrl_dir) == before
    repo = Repo(path, verify=True)
    assert repo.head() == head
    report = repo.fsck()
    assert report["ok"], report["problems"]
    assert_restores(repo, "HEAD", state)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("VRL_DEBUG", raising=False)


# ------------------------------------------------------------------------ disk full


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MB filesystem (tmpfs), unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}); "
                    "the fault-injection tests cover ENOSPC")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_disk_full_during_commit_real_filesystem(small_disk, tmp_path, capsys):
    path = small_disk / "repo"
    repo = Repo.init(path)
    first = small_state(0)
    head = repo.commit(first, env=False, message="fits")
    repo.sync()
    before = snapshot_of_disk(path / ".vrl")

    with pytest.raises(StorageError, match="disk full") as info:
        repo.commit(big_state(12), env=False, message="too big")
    assert "\n" not in str(info.value)
    assert_unharmed(path, before, head, first)

    # the CLI: one line on stderr, exit code 1, still nothing half-written
    from safetensors.torch import save_file

    big = tmp_path / "big.safetensors"
    save_file(big_state(12), str(big))
    assert main(["-C", str(path), "commit", str(big), "-m", "too big", "--no-env"]) == 1
    assert "disk full" in one_line_error(capsys)
    assert_unharmed(path, before, head, first)

    # what the message advises works: gc frees the orphans, a commit that fits goes through
    Repo(path).gc(grace=0)
    second = small_state(1)
    cid = Repo(path).commit(second, env=False, message="fits again")
    assert_restores(Repo(path, verify=True), cid, second)


def test_disk_full_at_every_point_of_a_commit_real_filesystem(small_disk):
    """Leave 0, 1, 2, ... pages free, so the disk fills up at a different write each time
    (tensor objects, manifest, commit, ref, reflog): a commit either lands completely or
    fails with 'disk full' and changes nothing."""
    path = small_disk / "repo"
    repo = Repo.init(path)
    state = small_state(0)
    head = repo.commit(state, env=False)
    repo.sync()
    filler = small_disk / "filler"
    outcomes = []
    # the 1 MiB tensor takes 261 pages: the disk fills up in it, then around the pack,
    # the reflog and the ref
    for free_pages in [*range(0, 12), *range(255, 300)]:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # fill the disk, give some back
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        size = filler.stat().st_size
        os.truncate(filler, max(0, size - free_pages * 4096))
        before = snapshot_of_disk(path / ".vrl")
        new_state = small_state(free_pages + 1)
        try:
            cid = Repo(path).commit(new_state, env=False, message=f"free {free_pages}")
        except StorageError as exc:
            assert "disk full" in str(exc) and "\n" not in str(exc)
            filler.unlink()
            assert_unharmed(path, before, head, state)
            outcomes.append("full")
            continue
        filler.unlink()
        repo = Repo(path, verify=True)
        assert repo.head() == cid and repo.fsck()["ok"]
        assert_restores(repo, cid, new_state)
        head, state = cid, new_state
        outcomes.append("ok")
        if outcomes[-3:] == ["ok"] * 3:
            break
    assert "full" in outcomes and "ok" in outcomes


def _count_write_calls(monkeypatch, path: Path, state) -> int:
    calls = []
    real = vrl.direct_io.write_all
    monkeypatch.setattr(vrl.direct_io, "write_all",
                        lambda fd, data: (calls.append(1), real(fd, data))[1])
    repo = Repo(path)
    repo.commit(state, env=False, message="probe")
    repo.sync()  # (the pack is written after the commit point, in the background)
    monkeypatch.setattr(vrl.direct_io, "write_all", real)
    return len(calls)


@pytest.mark.parametrize("code,words", [(errno.ENOSPC, "disk full"),
                                        (errno.EROFS, "read-only"), (errno.EIO, "I/O error")])
def test_write_error_at_every_object_write(tmp_path, monkeypatch, code, words):
    """Fault injection: the k-th low-level write of a commit fails, for every k."""
    path = tmp_path / "repo"
    Repo.init(path)
    state = small_state(0)
    # probe on a scratch copy of the same history, to count the writes a commit makes
    scratch = tmp_path / "scratch"
    Repo.init(scratch).commit(state, env=False)
    Repo(scratch).sync()
    n = _count_write_calls(monkeypatch, scratch, small_state(1))
    # one pack (2 small tensors, the manifest and the commit) in one write; the big
    # tensor is a loose file written in two chunks (header, payload)
    assert n == 3

    head = Repo(path).commit(state, env=False)
    Repo(path).sync()
    real = vrl.direct_io.write_all
    landed = []
    for k in range(1, n + 1):
        calls = [0]

        def failing(fd, data, k=k, calls=calls):
            calls[0] += 1
            if calls[0] == k:
                real(fd, memoryview(data).cast("B")[:7])  # a partial write first
                raise OSError(code, os.strerror(code))
            real(fd, data)

        monkeypatch.setattr(vrl.direct_io, "write_all", failing)
        before = snapshot_of_disk(path / ".vrl")
        repo = Repo(path)
        try:
            cid = repo.commit(small_state(1), env=False, message="fails")
        except StorageError as exc:  # before the commit point (the big tensor's file)
            assert words in str(exc) and "\n" not in str(exc)
            monkeypatch.setattr(vrl.direct_io, "write_all", real)
            assert_unharmed(path, before, head, state)
            Repo(path).gc(grace=0)  # orphans of the failed attempt: the next one writes again
            continue
        # after it (the pack, written in the background): the commit stands, and the next
        # read of this process writes it again (the fault was a single write's)
        assert repo.head() == cid and calls[0] >= k
        monkeypatch.setattr(vrl.direct_io, "write_all", real)
        landed.append(k)
    assert landed == [n]  # only the last write (the pack) comes after the commit point
    assert_restores(Repo(path, verify=True), cid, small_state(1))
    assert Repo(path).fsck()["ok"]


@pytest.mark.parametrize("journal", [False, True], ids=["three-rounds", "journal"])
@pytest.mark.parametrize("where", ["ref", "reflog"])
def test_disk_full_while_moving_the_ref(tmp_path, monkeypatch, capsys, where, journal):
    """The objects are written; then the disk fills up while the ref or its reflog is
    written. Without the commit journal the error must be true: the branch has not moved.
    With it, that is after the commit point (in the background): the commit stands,
    every later command of this process reports the error (nothing half-written), and
    the first one after it finishes the commit."""
    path = tmp_path / "repo"
    state = small_state(0)
    head = Repo.init(path).commit(state, env=False)
    config = Repo(path).config
    config.set("core", "journal", str(journal).lower())
    config.save()
    Repo(path).sync()
    before = snapshot_of_disk(path / ".vrl")

    def full(self, *args, **kwargs):
        raise storage_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), self.root,
                            "writing a ref")

    method = "_write_file" if where == "ref" else "_append_log"
    monkeypatch.setattr(vrl.refs.RefStore, method, full)
    if journal:
        cid = Repo(path).commit(small_state(1), env=False)
    else:
        with pytest.raises(StorageError, match="disk full"):
            Repo(path).commit(small_state(1), env=False)
        assert_unharmed(path, before, head, state)
    assert main(["-C", str(path), "tag", "v1"]) == 1
    assert "disk full" in one_line_error(capsys)
    assert main(["-C", str(path), "reset", "HEAD"]) == 1
    assert "disk full" in one_line_error(capsys)
    if not journal:
        assert_unharmed(path, before, head, state)
        return
    assert temp_files(path / ".vrl") == []
    monkeypatch.undo()
    repo = Repo(path, verify=True)
    assert repo.head() == cid and repo.fsck()["ok"]
    assert_restores(repo, cid, small_state(1))


# ------------------------------------------------------------------------ read-only


@pytest.fixture
def repo_with_history(tmp_path):
    path = tmp_path / "repo"
    repo = Repo.init(path)
    states = [small_state(i) for i in range(3)]
    ids = [repo.commit(s, env=False, message=f"snapshot {i}") for i, s in enumerate(states)]
    repo.tag("best", ids[1])
    repo.branch("dev", ids[0])
    return path, ids, states


@pytest.fixture
def read_only_copy(repo_with_history, tmp_path):
    """The repository seen through a read-only bind mount (root ignores file modes)."""
    path, ids, states = repo_with_history
    mnt = tmp_path / "ro"
    mnt.mkdir()
    res = subprocess.run(["mount", "--bind", str(path), str(mnt)], capture_output=True,
                         text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({res.stderr.strip()}); "
                    "test_write_error_at_every_object_write covers EROFS")
    try:
        res = subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)],
                             capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            pytest.skip(f"cannot remount read-only here ({res.stderr.strip()})")
        yield mnt, ids, states
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_read_only_repository(repo_with_history, read_only_copy, capsys):
    Repo(repo_with_history[0]).objects.write("tensor", b"orphan")  # for gc to delete
    path, ids, states = read_only_copy
    before = snapshot_of_disk(path / ".vrl")
    repo = Repo(path)
    # reading works
    assert [e.id for e in repo.log()] == ids[::-1]
    assert_restores(repo, "best", states[1])
    assert repo.fsck()["ok"]
    # every write fails with one clear line
    for action in (lambda: repo.commit(small_state(7), env=False),
                   lambda: repo.tag("v2"),
                   lambda: repo.branch("feature"),
                   lambda: repo.reset("HEAD~1"),
                   lambda: repo.checkout("dev")):
        with pytest.raises(StorageError, match="read-only") as info:
            action()
        assert "\n" not in str(info.value)
    for argv in (["log", "--oneline"], ["branch"], ["tag"], ["reflog"], ["fsck"],
                 ["show", "best"]):
        assert main(["-C", str(path), *argv]) == 0, argv
    capsys.readouterr()
    for argv in (["tag", "v2"], ["branch", "feature"], ["reset", "HEAD~1"],
                 ["checkout", "dev", "--no-workspace"], ["gc", "--grace", "0"]):
        assert main(["-C", str(path), *argv]) == 1, argv
        assert "read-only" in one_line_error(capsys)
    assert snapshot_of_disk(path / ".vrl") == before
    assert Repo(path).head() == ids[-1]


# ------------------------------------------------------------------------ damaged objects


def _object_path(repo: Repo, oid: str) -> Path:
    return Path(repo.objects.root) / oid[:2] / oid[2:]


def _damage(repo: Repo, oid: str, how: str) -> None:
    """Damage an object where it lives: its loose file, or its bytes inside a pack (a
    truncated pack loses its index, so all its objects are reported missing)."""
    file, start, length = repo.objects.locate(oid)
    os.chmod(file, 0o644)  # objects are read-only files; root would not care
    data = bytearray(file.read_bytes())
    if how == "flip":
        data[start + HEADER_SIZE + (length - HEADER_SIZE) // 2] ^= 0x01
    elif how == "truncate":
        del data[start + HEADER_SIZE + (length - HEADER_SIZE) // 2:]
    elif how == "header":
        data[start + 5] ^= 0x20
    file.write_bytes(bytes(data))


def _entry(repo: Repo, rev: str, name: str):
    return repo.read_manifest(repo.read_commit(repo.resolve(rev)).manifest).tensors[name]


@pytest.mark.parametrize("name", ["actor.bias", "critic.weight"], ids=["read", "mmap"])
def test_flipped_byte_in_tensor(repo_with_history, capsys, name):
    path, ids, states = repo_with_history
    repo = Repo(path)
    entry = _entry(repo, "HEAD", name)
    _damage(repo, entry.id, "flip")

    # verification off (default): a flip inside tensor data is not noticed on read...
    assert Repo(path).load("HEAD")[name].shape == states[-1][name].shape
    # ...on: detected, by option or by config
    with pytest.raises(CorruptObjectError, match="corrupted") as info:
        Repo(path, verify=True).load("HEAD")
    assert entry.id[:12] in str(info.value) and "\n" not in str(info.value)
    cfg = Repo(path).config
    cfg.set("core", "verify", "true")
    cfg.save()
    with pytest.raises(CorruptObjectError, match="corrupted"):
        Repo(path).load("HEAD")
    assert main(["-C", str(path), "export", "HEAD", str(path / "out.safetensors")]) == 1
    assert "corrupted" in one_line_error(capsys)
    assert not (path / "out.safetensors").exists()
    # snapshots that do not use the object still restore
    assert_restores(Repo(path), ids[0], states[0])
    # always found by fsck, whatever the setting
    for verify in ("true", "false"):
        cfg.set("core", "verify", verify)
        cfg.save()
        report = Repo(path).fsck()
        assert not report["ok"]
        assert any(entry.id in p and "corrupt" in p for p in report["problems"])
        assert main(["-C", str(path), "fsck"]) == 1
        out = capsys.readouterr().out
        assert f"error: corrupt object {entry.id}" in out and "problem" in out


@pytest.mark.parametrize("how", ["flip", "truncate", "header"])
def test_damaged_commit_object(repo_with_history, capsys, how):
    path, ids, _ = repo_with_history
    repo = Repo(path)
    _damage(repo, ids[-1], how)
    if how != "flip":  # structural damage is found even without verification
        with pytest.raises(CorruptObjectError):
            Repo(path).log()
    with pytest.raises(CorruptObjectError):
        Repo(path, verify=True).log()
    cfg = Repo(path).config
    cfg.set("core", "verify", "true")
    cfg.save()
    assert main(["-C", str(path), "log"]) == 1
    one_line_error(capsys)
    assert main(["-C", str(path), "fsck"]) == 1
    assert ids[-1][:12] in capsys.readouterr().out  # a truncated pack: "ref ... points to"
    # the rest of the history is intact
    assert [e.id for e in Repo(path).log(ids[-2])] == ids[-2::-1]


@pytest.mark.parametrize("name", ["actor.bias", "critic.weight"], ids=["read", "mmap"])
def test_truncated_tensor(repo_with_history, capsys, name):
    path, ids, states = repo_with_history
    repo = Repo(path)
    entry = _entry(repo, "HEAD", name)
    _damage(repo, entry.id, "truncate")
    with pytest.raises(CorruptObjectError, match="truncated") as info:
        Repo(path).load("HEAD")  # found without verification: the size is wrong
    assert "\n" not in str(info.value)
    assert main(["-C", str(path), "export", "HEAD", str(path / "out.pt")]) == 1
    assert "truncated" in one_line_error(capsys)
    report = Repo(path).fsck()
    packed = repo.objects.loose_path(entry.id) is None
    # a truncated pack has lost its index: fsck names the pack and what went missing
    assert not report["ok"] and any(("pack-" if packed else entry.id) in p
                                    for p in report["problems"])
    assert main(["-C", str(path), "fsck"]) == 1
    assert ("truncated" if packed else f"corrupt object {entry.id}") in \
        capsys.readouterr().out
    assert_restores(Repo(path), ids[0], states[0])


@pytest.mark.parametrize("how", ["header", "kind", "longer"])
def test_damaged_mapped_tensor_is_refused(repo_with_history, capsys, how):
    """A big tensor is restored by mapping its loose file: a damaged header, another
    object's kind or extra bytes are refused without verification, like a truncation."""
    from vrl.objects import header

    path, ids, states = repo_with_history
    repo = Repo(path)
    entry = _entry(repo, "HEAD", "critic.weight")
    file = _object_path(repo, entry.id)
    assert entry.nbytes >= vrl.repo.MMAP_MIN and file.is_file()  # the mapped fast path
    os.chmod(file, 0o644)
    data = bytearray(file.read_bytes())
    if how == "header":
        _damage(repo, entry.id, "header")
    elif how == "kind":
        file.write_bytes(header("manifest", entry.nbytes) + data[HEADER_SIZE:])
    else:
        file.write_bytes(bytes(data) + b"\0" * 8)
    match = {"header": "not a vrl object header", "kind": "is a manifest, not a tensor",
             "longer": "truncated or the wrong size"}[how]
    with pytest.raises(CorruptObjectError, match=match) as info:
        Repo(path).load("HEAD")
    assert "\n" not in str(info.value)
    assert main(["-C", str(path), "export", "HEAD", str(path / "out.pt")]) == 1
    assert one_line_error(capsys)
    assert not (path / "out.pt").exists()
    assert_restores(Repo(path), ids[0], states[0])  # snapshots without it still restore


def test_missing_objects(repo_with_history, capsys):
    path, ids, states = repo_with_history
    repo = Repo(path)
    entry = _entry(repo, "HEAD", "critic.weight")
    _object_path(repo, entry.id).unlink()
    with pytest.raises(VrlError) as info:
        Repo(path).load("HEAD")
    assert entry.id[:12] in str(info.value) and "\n" not in str(info.value)
    assert main(["-C", str(path), "export", "HEAD", str(path / "out.pt")]) == 1
    one_line_error(capsys)
    report = Repo(path).fsck()
    assert any("critic.weight" in p and "missing" in p for p in report["problems"])
    assert main(["-C", str(path), "fsck"]) == 1
    capsys.readouterr()

    # a missing commit: the one a branch points at
    repo.objects.delete(ids[-1])  # from its pack
    assert main(["-C", str(path), "log"]) == 1
    assert ids[-1][:12] in one_line_error(capsys)
    report = Repo(path).fsck()
    assert any("refs/heads/main" in p and "not a commit" in p for p in report["problems"])
    assert main(["-C", str(path), "fsck"]) == 1
    assert_restores(Repo(path), "best", states[1])


# ------------------------------------------------------------------------ no torch


def test_metadata_commands_do_not_import_torch(repo_with_history):
    path, ids, _ = repo_with_history
    commands = [["log"], ["log", "--oneline"], ["log", "--json"], ["log", "--metrics", "a"],
                ["branch"], ["branch", "--json"], ["branch", "feature"],
                ["tag"], ["tag", "v2", "best"], ["tag", "--json"],
                ["reflog"], ["reflog", "--json"], ["reflog", "main"]]
    script = textwrap.dedent("""
        import io, json, sys, time
        from contextlib import redirect_stdout
        from vrl.cli import main
        times = {}
        for argv in json.loads(sys.argv[1]):
            start = time.perf_counter()
            with redirect_stdout(io.StringIO()):
                code = main(["-C", sys.argv[2], *argv])
            times[" ".join(argv)] = (code, time.perf_counter() - start)
        heavy = sorted(m for m in ("torch", "numpy", "safetensors") if m in sys.modules)
        print(json.dumps({"times": times, "heavy": heavy}))
    """)
    res = subprocess.run([sys.executable, "-c", script, json.dumps(commands), str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["heavy"] == [], f"metadata commands imported {out['heavy']}"
    for argv, (code, seconds) in out["times"].items():
        assert code == 0, argv
        assert seconds < 0.5, f"`vrl {argv}` took {seconds:.2f} s"
    assert Repo(path).tags()["v2"] == ids[1]
