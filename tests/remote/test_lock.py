"""The remote ref lock on file systems without compare-and-swap (SFTP, memory, ...)."""

import uuid

import fsspec
import pytest

from vrl.objects import ObjectId
from vrl.remote.stores import FsspecRemote


class SftpLikeError(Exception):
    """What an SFTP server reports for a failed exclusive create: a generic failure."""


class ReleasingFs:
    """A memory file system where the lock holder releases right after our exclusive
    create failed and before we check whether the lock exists: the race of issue 9.10."""

    def __init__(self, fs, error):
        self.fs, self.error, self.raced = fs, error, 0

    def open(self, path, mode="rb", **kw):
        if mode == "xb" and path.endswith(".lock") and self.fs.exists(path):
            self.fs.rm_file(path)  # the holder releases now
            self.raced += 1
            raise self.error("File exists")
        return self.fs.open(path, mode, **kw)

    def __getattr__(self, name):
        return getattr(self.fs, name)


@pytest.mark.parametrize("error", [FileExistsError, SftpLikeError])
def test_lock_released_between_create_and_check_is_retried(error):
    fs = fsspec.filesystem("memory")
    root = f"/lock-{uuid.uuid4().hex}"
    racy = ReleasingFs(fs, error)
    store = FsspecRemote(racy, root, f"memory:/{root}")
    fs.pipe_file(f"{root}/refs/heads/main.lock", b"holder")  # someone holds the lock
    store.cas_ref("refs/heads/main", ObjectId("a" * 64), None)
    assert racy.raced == 1
    assert store.read_ref("refs/heads/main")[0] == "a" * 64
    assert not fs.exists(f"{root}/refs/heads/main.lock")


def test_lock_create_failing_for_another_reason_is_reported():
    fs = fsspec.filesystem("memory")

    class Broken(ReleasingFs):
        def open(self, path, mode="rb", **kw):
            if mode == "xb":
                raise PermissionError("permission denied")
            return self.fs.open(path, mode, **kw)

    store = FsspecRemote(Broken(fs, None), f"/lock-{uuid.uuid4().hex}", "memory://x")
    with pytest.raises(Exception, match="permission denied|access denied"):
        store.cas_ref("refs/heads/main", ObjectId("a" * 64), None)
