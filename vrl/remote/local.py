"""The local/NFS backend: a directory, or a vrl repository used as a remote."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from vrl.durable import fsync, fsync_dir, make_dirs
from vrl.errors import RefConflictError, VrlError
from vrl.journal import Journal
from vrl.object_store import FileObjectStore
from vrl.objects import ObjectId, is_object_id
from vrl.refs import RefStore
from vrl.remote.base import LOCK_TIMEOUT, KeyMissing, RemoteStore, is_temp_key, too_large
from vrl.remote.errors import RemoteError


class LocalRemote(RemoteStore):
    """A directory on a local or network file system.

    Guarantee: objects appear by rename (never half-written) after fsync; refs move by
    compare-and-swap under an O_EXCL lock file, as in a local repository, so concurrent
    pushers on any POSIX file system with atomic exclusive create and rename (local disks,
    NFSv3+) are serialised and exactly one wins.
    """

    guarantee = "atomic (O_EXCL lock file + fsync + rename)"

    def __init__(self, root: str | Path, url: str | None = None, fsync: bool = True) -> None:
        self.root = Path(root).expanduser().absolute()
        if (self.root / ".vrl" / "HEAD").is_file() and not (self.root / "HEAD").exists():
            self.root = self.root / ".vrl"  # a repository's workspace: use its store
        self._real_root = os.path.realpath(self.root)
        self.url = url or str(self.root)
        self.fsync = fsync
        self._locks = RefStore(self.root, fsync=fsync)
        self._packs: FileObjectStore | None = None
        self._journal = self._repository_journal()

    def _repository_journal(self) -> Journal | None:
        """A repository's commit journal, honoured as the repository itself does: its
        last commits may be recorded there and not yet materialised (their refs and packs
        written out in the background, or left by a killed process for the next reader to
        replay), and a ref moved outside the journal must hold it (vrl/journal.py)."""
        if not (self.root / "journal").is_file():
            return None
        self._packs = FileObjectStore(self.root / "objects", fsync=self.fsync)
        journal = Journal(self.root, self._packs, self._locks)
        if not journal.usable:
            return None
        self._locks.guard = journal.exclusive
        self._locks.barrier = self._packs.barrier = journal.wait
        return journal

    def _packed(self, key: str) -> FileObjectStore | None:
        """The object store of a local repository, when `key` names an object that it
        keeps in a pack (a clone or fetch straight from a repository reads its packs)."""
        oid = key[8:10] + key[11:]
        if not key.startswith("objects/") or not is_object_id(oid) or \
                not (self.root / "objects" / "pack").is_dir():
            return None
        self._inside(self.root / "objects" / "pack", "objects/pack")
        if self._packs is None:
            self._packs = FileObjectStore(self.root / "objects", fsync=self.fsync)
        return self._packs if self._packs.has(ObjectId(oid)) else None

    def _read_packed(self, key: str, limit: int | None = None) -> bytes:
        store = self._packed(key)
        if store is None:
            raise KeyMissing(key)
        try:
            raw = store.read_raw(ObjectId(key[8:10] + key[11:]))
        except VrlError:
            raise KeyMissing(key) from None
        return raw if limit is None else raw[:limit + 1]

    def _p(self, key: str) -> Path:
        return self.root / key

    def _inside(self, path: Path, key: str) -> None:
        """Refuse a path that is, or lies under, a symbolic link: a remote never leads
        reads or writes out of itself (a ref linked to ~/.ssh/id_rsa, objects/ linked to
        /etc)."""
        real = os.path.realpath(path)
        if real != os.path.normpath(os.path.join(self._real_root, key)):
            raise RemoteError(f"{key[:200]} on {self.url} is a symbolic link or lies under "
                              "one; vrl never follows links out of a remote: remove it")

    def _open_read(self, key: str) -> Any:
        path = self._p(key)
        try:
            self._inside(path, key)
            return open(path, "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise KeyMissing(key) from None

    def get(self, key: str) -> bytes:
        with self.guard(f"reading {key}"):
            try:
                f = self._open_read(key)
            except KeyMissing:
                return self._read_packed(key)
            with f:
                return f.read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self.guard(f"reading {key}"):
            with self._open_read(key) as f:
                f.seek(start)
                return f.read(max(0, end - start))

    def list_sizes(self, prefix: str) -> dict[str, int]:
        out = {}
        for key in self.list(prefix):
            with contextlib.suppress(FileNotFoundError):
                out[key] = os.stat(self._p(key)).st_size
        return out

    def get_small(self, key: str, limit: int, what: str = "object") -> bytes:
        with self.guard(f"reading {key}"):
            try:
                f = self._open_read(key)
            except KeyMissing:
                data = self._read_packed(key, limit)
            else:
                with f:
                    data = f.read(limit + 1)
        if len(data) > limit:
            raise too_large(key, self.url, limit, what)
        return data

    def _write(self, final: Path, source: bytes | Path) -> None:
        self._inside(final.parent, os.path.relpath(final.parent, self.root))  # before mkdir
        make_dirs(final.parent, self.fsync)
        tmp = final.parent / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            with open(tmp, "xb") as out:
                if isinstance(source, Path):
                    with open(source, "rb") as src:
                        while chunk := src.read(1 << 24):
                            out.write(chunk)
                else:
                    out.write(source)
                if self.fsync:
                    out.flush()
                    fsync(out.fileno())
            os.replace(tmp, final)
            if self.fsync:  # the new name durable before the call returns (a ref, next)
                fsync_dir(final.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put(self, key: str, data: bytes) -> None:
        with self.guard(f"writing {key}"):
            self._write(self._p(key), data)

    def put_file(self, key: str, local: Path) -> None:
        with self.guard(f"writing {key}"):
            self._write(self._p(key), Path(local))

    def exists(self, key: str) -> bool:
        return self._p(key).is_file() or self._packed(key) is not None

    def list(self, prefix: str) -> list[str]:
        if self._journal is not None and prefix.startswith("refs"):
            self._journal.wait()
        base = self._p(prefix)
        if not base.is_dir():
            return []
        out = []
        for folder, _, files in os.walk(base):  # never descends into linked directories
            for name in files:
                if not is_temp_key(name):
                    out.append(Path(folder, name).relative_to(self.root).as_posix())
        return sorted(out)

    def delete(self, key: str) -> None:
        with self.guard(f"deleting {key}"):
            self._p(key).unlink(missing_ok=True)

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        if self._journal is not None and key.startswith("refs/"):
            self._journal.wait()
        try:
            data = self.get(key)
        except KeyMissing:
            return None, None
        return data, data

    def state(self) -> str:
        if not self.root.exists():
            return "missing"
        if not self.root.is_dir():
            return "other"
        if any((self.root / name).exists() for name in ("HEAD", "refs", "objects")):
            return "store"
        return "other" if any(self.root.iterdir()) else "empty"

    def create(self, branch: str = "main") -> None:
        with self.guard("creating the remote"):
            make_dirs(self.root, self.fsync)
        super().create(branch)

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        with self.guard(f"updating {key}"):
            with self._locks.lock(key, timeout=LOCK_TIMEOUT):
                current, _ = self.read_versioned(key)
                if current != expected:
                    raise RefConflictError(f"{key} on {self.url} changed meanwhile")
                self._write(self._p(key), data)


