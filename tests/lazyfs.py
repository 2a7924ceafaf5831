"""A lazy-fsync file system model for power-cut tests: an I/O layer over the os module
that keeps only what was fsynced (a new file never fsynced is empty after the cut; a
directory's entries are those it had at its last fsync), the worst case POSIX allows.
Everything else happens on the real disk, so vrl runs unchanged; `durable_tree` is what a
power cut at this moment would leave, and `rebuild` writes it out to check it."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch


@dataclass
class Cut:
    """The durable state at one step, and what had been reported done by then."""

    step: int
    op: str
    tree: dict[str, bytes | None]  # relative path -> content (None: a directory)
    done: list[tuple[str, dict[str, torch.Tensor]]] = field(default_factory=list)


def fsync_class(path: str, root: Path | None = None) -> str:
    """Which kind of fsync this is (by the path of what is synced, inside `.vrl`, or
    inside `root/remote`, the local remote of the push and fetch scenario)."""
    if root is not None and os.path.relpath(path, root).split("/")[0] == "remote":
        return "remote-dir" if os.path.isdir(path) else "remote-file"
    parts = path.split("/")
    if "objects" in parts:
        return "object-dir" if os.path.isdir(path) else "object"
    if parts[-1] == "journal":
        return "journal"
    if "logs" in parts:
        return "reflog-dir" if os.path.isdir(path) else "reflog"
    if "refs" in parts or parts[-1] == "HEAD":
        return "ref-dir" if os.path.isdir(path) else "ref"
    return "dir" if os.path.isdir(path) else "file"


class LazyFS:
    """Tracks the durable state of the tree under `root` through os.fsync calls."""

    def __init__(self, root: Path, ignore: frozenset[str] = frozenset()) -> None:
        self.root = Path(root)
        self.ignore = ignore  # fsync classes treated as if the fsync were not there
        self.lock = threading.RLock()
        self.content: dict[int, bytes] = {}  # inode -> durable bytes
        self.entries: dict[int, dict[str, int]] = {}  # dir inode -> durable name -> inode
        self.is_dir: dict[int, bool] = {}
        self.pinned: list[int] = []  # fds keeping unlinked inodes from being reused
        self.steps: list[str] = []
        self.fsyncs: dict[str, int] = {}
        self.on_step: Callable[[str], None] | None = None
        self.root_ino = os.stat(self.root).st_ino
        self._scan(self.root)  # everything on disk at the start is durable

    # --------------------------------------------------------------- the model
    def _scan(self, path: Path) -> None:
        st = os.stat(path, follow_symlinks=False)
        self.is_dir[st.st_ino] = stat.S_ISDIR(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            self.entries[st.st_ino] = {}
            for child in os.scandir(path):
                self.entries[st.st_ino][child.name] = child.inode()
                self._scan(Path(child.path))
        else:
            self.content[st.st_ino] = Path(path).read_bytes()

    def _record_fsync(self, fd: int, count: bool = True) -> None:
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not path.startswith(str(self.root)):
            return
        kind = fsync_class(path, self.root)
        if count:
            self.fsyncs[kind] = self.fsyncs.get(kind, 0) + 1
            if kind in self.ignore:
                return
        if stat.S_ISDIR(st.st_mode):
            names = {}
            for name in os.listdir(path):
                try:
                    child = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                names[name] = child.st_ino
                self.is_dir[child.st_ino] = stat.S_ISDIR(child.st_mode)
            self.entries[st.st_ino] = names
        else:
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                self.content[st.st_ino] = f.read()
            self.is_dir[st.st_ino] = False

    def write_back(self, select: Callable[[str], bool]) -> None:
        """Make the current entries of the selected directories durable, as a kernel may
        do at any time without being asked."""
        self._step("write-back")
        for folder in sorted(self.root.rglob("*")):
            if folder.is_dir() and select(folder.relative_to(self.root).as_posix()):
                fd = os.open(folder, os.O_RDONLY)
                try:
                    with self.lock:
                        self._record_fsync(fd, count=False)
                finally:
                    os.close(fd)

    def durable_tree(self) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}

        def walk(ino: int, prefix: str) -> None:
            for name, child in sorted(self.entries.get(ino, {}).items()):
                rel = f"{prefix}{name}"
                if self.is_dir.get(child):
                    out[rel] = None
                    walk(child, rel + "/")
                else:
                    out[rel] = self.content.get(child, b"")  # never fsynced: empty

        walk(self.root_ino, "")
        return out

    # --------------------------------------------------------------- the I/O layer
    def _pin(self, path) -> None:
        """Keep a file that is about to be unlinked or replaced open, so that its inode
        number is not reused while the model may still refer to it."""
        try:
            self.pinned.append(os.open(path, os.O_RDONLY))
        except OSError:
            pass

    def _step(self, op: str) -> None:
        with self.lock:
            self.steps.append(op)
            if self.on_step is not None:
                self.on_step(op)

    @contextlib.contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[LazyFS]:
        real = {name: getattr(os, name) for name in
                ("write", "fsync", "fdatasync", "replace", "rename", "unlink", "remove",
                 "mkdir", "rmdir", "truncate", "ftruncate", "open", "pwrite", "pwritev",
                 "link", "posix_fallocate")}
        real_open = io.open

        # every call runs under the lock, its step first: a cut (or a copy of the tree as
        # a kill would leave it) falls between two calls, never inside one of another thread
        def fsync(fd):
            with self.lock:
                self._step("fsync")
                real["fsync"](fd)
                self._record_fsync(fd)

        def stepped(name, pin=None):
            def op(*a, **k):
                with self.lock:
                    self._step(name)
                    if pin is not None:
                        self._pin(a[pin])
                    return real[name](*a, **k)
            return op

        def os_open(path, flags, *a, **k):
            with self.lock:
                if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
                    self._step("open")
                return real["open"](path, flags, *a, **k)

        def py_open(file, mode="r", *a, **k):
            with self.lock:
                if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
                    self._step("open")
                return real_open(file, mode, *a, **k)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fsync)
        for name in ("replace", "rename"):  # (what is replaced, or unlinked, is pinned)
            monkeypatch.setattr(os, name, stepped(name, pin=1))
        for name in ("unlink", "remove", "rmdir"):
            monkeypatch.setattr(os, name, stepped(name, pin=0))
        for name in ("write", "mkdir", "truncate", "ftruncate", "pwrite", "pwritev", "link",
                     "posix_fallocate"):
            monkeypatch.setattr(os, name, stepped(name))
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(io, "open", py_open)
        monkeypatch.setattr("builtins.open", py_open)
        try:
            yield self
        finally:
            monkeypatch.undo()
            for fd in self.pinned:
                os.close(fd)
            self.pinned.clear()


def rebuild(tree: dict[str, bytes | None], where: Path) -> None:
    """Write a durable tree out into the new directory `where`."""
    where.mkdir()
    for rel, data in tree.items():
        target = where / rel
        if data is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
