"""Checkout and export of big tensors: their bytes are hashed to their ids, then go file
to file (copy_file_range) from the store's loose files and packs, and the written file is
still the committed one byte for byte, with damage reported and nothing half-written."""

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import vrl
from safetensors.numpy import save_file

from vrl import Repo, safetensors_file, tensor_reader
from vrl.errors import CorruptObjectError
from vrl.repo import MMAP_MIN
from vrl.safetensors_file import FileSlice
from vrl.tensors import file_state

ROOT = Path(__file__).resolve().parents[1]


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def arrays(version: int) -> dict[str, np.ndarray]:
    """Loose (> 1 MiB), packed but memory-mapped (64 KiB - 1 MiB), small and empty tensors,
    mixed dtypes; version 2 changes the big ones."""
    rng = np.random.default_rng(version)
    return {"big.weight": rng.standard_normal((600, 640), np.float32),  # 1.5 MB, loose
            "mid.weight": rng.standard_normal((200, 100), np.float32),  # 80 KB, packed
            "mid.half": np.ones(40_000, np.float16) * version,  # 80 KB
            "small.bias": np.arange(7, dtype=np.int64),
            "empty": np.zeros((0, 3), np.float32)}


@pytest.fixture
def two_versions(ws, capsys):
    """A workspace with v1 and v2 of a safetensors file committed; HEAD at v2."""
    vrl(capsys, "init")
    files = {}
    for version in (1, 2):
        path = ws / f"v{version}.safetensors"
        save_file(arrays(version), str(path), metadata={"format": "np", "v": str(version)})
        files[version] = path
        (ws / "policy.safetensors").write_bytes(path.read_bytes())
        code, _, err = vrl(capsys, "commit", "-m", f"v{version}", "--no-env")
        assert code == 0, err
    return files


def copies(monkeypatch) -> list[int]:
    """Sizes of the tensors copied file to file from now on."""
    sizes: list[int] = []
    real = FileSlice.copy_to

    def spy(self, out):
        sizes.append(self.nbytes)
        real(self, out)

    monkeypatch.setattr(FileSlice, "copy_to", spy)
    return sizes


def verified(monkeypatch) -> list[int]:
    """Sizes of the stored tensors hashed before they were written, from now on."""
    sizes: list[int] = []
    real = tensor_reader.verify_tensor

    def spy(entry, buf, offset=0):
        sizes.append(entry.nbytes)
        real(entry, buf, offset)

    monkeypatch.setattr(tensor_reader, "verify_tensor", spy)
    return sizes


def test_checkout_and_export_of_big_tensors_are_byte_identical(ws, capsys, two_versions,
                                                               monkeypatch):
    repo = Repo(ws)
    header = repo.read_manifest(repo.read_commit(repo.resolve("HEAD~1")).manifest
                                ).layout.header.nbytes
    hashed, copied = verified(monkeypatch), copies(monkeypatch)
    code, _, err = vrl(capsys, "checkout", "HEAD~1")
    assert code == 0, err
    assert sha(ws / "policy.safetensors") == sha(two_versions[1])
    # every tensor of at least MMAP_MIN bytes, loose or packed, went file to file
    big = sorted(a.nbytes for a in arrays(1).values() if a.nbytes >= MMAP_MIN)
    assert sorted(copied) == big
    # every tensor, loose, packed or small, and the kept file header was hashed first
    assert sorted(hashed) == sorted([a.nbytes for a in arrays(1).values()] + [header])
    code, _, err = vrl(capsys, "export", "main", "out.safetensors")
    assert code == 0, err
    assert sha(ws / "out.safetensors") == sha(two_versions[2])
    vrl(capsys, "checkout", "main")
    assert sha(ws / "policy.safetensors") == sha(two_versions[2])
    assert not [p for p in ws.iterdir() if ".tmp" in p.name]
    code, out, _ = vrl(capsys, "status")
    assert "no changes since HEAD" in out


def test_snapshot_from_memory_exports_big_tensors_in_the_canonical_layout(ws):
    """A snapshot committed from memory: the canonical layout, through the same copies;
    committing the exported file again changes nothing, exporting again gives the same
    bytes."""
    repo = Repo.init(ws)
    state = {"model": arrays(1), "step": 3}
    first = repo.commit(state, env=False)
    repo.export(first, ws / "a.safetensors")
    back = file_state(safetensors_file.read_file(ws / "a.safetensors"))
    for name, value in arrays(1).items():
        assert bytes(back["model"][name].data) == value.tobytes(), name
    assert repo.snapshot(safetensors_file.read_file(ws / "a.safetensors"), write=False)[0] \
        == repo.read_commit(first).manifest
    Repo(ws).export(first, ws / "b.safetensors")
    assert sha(ws / "a.safetensors") == sha(ws / "b.safetensors")


def test_without_kernel_copies_or_preallocation_the_bytes_are_the_same(ws, capsys,
                                                                       two_versions,
                                                                       monkeypatch):
    """Filesystems that refuse copy_file_range (EXDEV, EINVAL...) or fallocate: the bytes
    go through memory instead."""
    def refuse(*args):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    def no_fallocate(*args):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(safetensors_file, "_copy_file_range", refuse)
    monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    code, _, err = vrl(capsys, "checkout", "HEAD~1")
    assert code == 0, err
    assert sha(ws / "policy.safetensors") == sha(two_versions[1])


def test_a_truncated_big_object_is_reported_and_the_workspace_kept(ws, capsys, two_versions):
    repo = Repo(ws)
    manifest = repo.read_manifest(repo.read_commit(repo.resolve("HEAD~1")).manifest)
    path, offset, length = repo.objects.locate(manifest.tensors["big.weight"].id)
    assert offset == 0  # loose
    os.truncate(path, length - 4)
    before = (ws / "policy.safetensors").read_bytes()
    code, _, err = vrl(capsys, "checkout", "HEAD~1")
    assert code == 1 and err.count("\n") == 1 and "truncated" in err and "fsck" in err
    assert (ws / "policy.safetensors").read_bytes() == before
    assert Repo(ws).current_branch() == "main"
    assert not [p for p in ws.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("verify", [False, True], ids=["default", "core.verify"])
def test_a_damaged_big_object_fails_the_export(ws, capsys, two_versions, verify):
    """Every byte a checkout or export writes is hashed first, with or without
    core.verify: a flipped byte fails the export, and nothing is written."""
    repo = Repo(ws)
    manifest = repo.read_manifest(repo.read_commit(repo.resolve("HEAD~1")).manifest)
    entry = manifest.tensors["big.weight"]
    path, offset, length = repo.objects.locate(entry.id)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="do not match its id") as info:
        Repo(ws, verify=verify).export(repo.resolve("HEAD~1"), ws / "out.safetensors")
    assert entry.id[:12] in str(info.value)
    assert not (ws / "out.safetensors").exists()
    assert not [p for p in ws.iterdir() if ".tmp" in p.name]
    assert not Repo(ws).fsck()["ok"]


def test_a_file_slice_shorter_than_promised_is_corruption(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.write_bytes(b"x" * 100)
    fd = os.open(src, os.O_RDONLY)
    slice_ = FileSlice(fd, 10, 200)
    out_fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(CorruptObjectError, match="ended 110 bytes early"):
            slice_.copy_to(out_fd)
    finally:
        slice_.close()
        os.close(out_fd)
    assert slice_.fd == -1


def test_checkout_on_a_full_disk_fails_before_writing(tmp_path, capsys, monkeypatch):
    """The file's space is reserved before any byte is written: on a full disk the
    checkout is one line, HEAD and the workspace stay, and no temp file is left."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode})")
    try:
        ws = mnt / "ws"
        ws.mkdir()
        monkeypatch.chdir(ws)
        monkeypatch.setenv("VRL_AUTHOR", "tester")
        repo = Repo.init(ws)
        rng = np.random.default_rng(0)
        for i in range(2):  # two 1.6 MB versions: 3.2 MB of objects + a 1.6 MB workspace
            save_file({"w": rng.standard_normal(400_000, np.float32)},
                      str(ws / "policy.safetensors"))
            code, _, err = vrl(capsys, "commit", "-m", f"v{i}", "--no-env")
            assert code == 0, err
        Repo(ws).sync()  # the commits' background write-out done before space is measured
        filler = ws / "filler"
        with open(filler, "wb") as f:  # leave less than one more copy of the file
            try:
                f.write(b"\0" * (int(os.statvfs(ws).f_bavail * os.statvfs(ws).f_frsize)
                                 - 1_000_000))
            except OSError:
                pass
        before = (ws / "policy.safetensors").read_bytes()
        code, _, err = vrl(capsys, "checkout", "HEAD~1")
        assert code == 1 and err.startswith("error: disk full") and err.count("\n") == 1
        assert (ws / "policy.safetensors").read_bytes() == before
        assert Repo(ws).current_branch() == "main" and repo.head() == Repo(ws).head()
        assert not [p for p in ws.iterdir() if ".tmp" in p.name]
    finally:
        os.chdir(tmp_path)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_checkout_imports_only_its_own_command_module(tmp_path):
    """Commands load lazily: `vrl checkout` imports neither the other command modules,
    the views, the remote layer, importlib.metadata, numpy nor torch."""
    ws = tmp_path / "ws"
    ws.mkdir()
    save_file(arrays(1), str(ws / "policy.safetensors"))
    repo = Repo.init(ws)
    repo.commit(safetensors_file.read_file(ws / "policy.safetensors"), env=False)
    script = ("import sys; from vrl.cli import main\n"
              "assert main(['checkout', '-f', 'main']) == 0\n"
              "print(' '.join(sorted(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VRL_AUTHOR": "tester"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ws, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "vrl.cli.snapshots" in loaded
    for name in ("vrl.cli.history", "vrl.cli.viz", "vrl.cli.remotes", "vrl.views",
                 "vrl.remote", "importlib.metadata", "numpy", "torch"):
        assert name not in loaded, name


def test_the_stat_cache_is_not_trusted_after_a_restart(ws, capsys, two_versions):
    """The workspace file is not fsynced: after a power cut it may hold other bytes under
    the size and time the stat cache recorded, so a cache from another boot is not used."""
    import json

    path = ws / "policy.safetensors"
    st = path.stat()
    damaged = bytearray(path.read_bytes())
    damaged[-4:] = b"\0\0\0\0"  # what a lost write-back leaves: zeros, same size and time
    path.write_bytes(bytes(damaged))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    index = ws / ".vrl" / "index"
    # (a power cut leaves the inode's ctime as recorded; writing here moved it)
    index.write_text(json.dumps({**json.loads(index.read_text()),
                                 "ctime_ns": path.stat().st_ctime_ns}))
    code, out, _ = vrl(capsys, "status")
    assert "no changes since HEAD" in out  # this boot: the stat cache answers
    index.write_text(json.dumps({**json.loads(index.read_text()), "boot": "another boot"}))
    code, out, _ = vrl(capsys, "status")
    assert "modified since HEAD" in out
