"""Checkpoint files: reading what a user hands to `vrl commit`, writing what checkout and
export produce, and the workspace checkpoint (Git's working tree for policies). Nothing is
ever unpickled: `.pt` files load with weights_only=True.

Safetensors files never need torch: they are parsed and memory-mapped by
vrl.safetensors_file, hashed and compared as raw bytes, and written back byte for byte.
A snapshot committed from a safetensors file is written back as that very file (its
manifest keeps the file's header when the canonical layout would not reproduce it); any
other snapshot is written in the canonical layout, with its structure in `vrl.*` metadata.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrl.diff import DiffResult, compare
from vrl.durable import discard
from vrl.errors import (
    CheckpointError,
    CorruptObjectError,
    StorageError,
    VrlError,
    WorkspaceError,
    storage_error,
)
from vrl.objects import Commit, Manifest, ObjectId, TensorEntry, is_object_id
from vrl.safetensors_file import write_stream

if TYPE_CHECKING:
    from vrl.config import Config
    from vrl.object_store import FileObjectStore
    from vrl.safetensors_file import FileSlice, RawTensor, SafetensorsFile

    Chunk = memoryview | bytes | FileSlice  # a piece of a file being written

SAFETENSORS = (".safetensors",)
TORCH = (".pt", ".pth", ".ckpt", ".bin")


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS:
        return "safetensors"
    if suffix in TORCH:
        return "torch"
    raise CheckpointError(f"{path}: unknown checkpoint type {suffix or '(no extension)'!r}; "
                          "use .safetensors, .pt or .pth")


def open_checkpoint(path: str | Path) -> SafetensorsFile | Any:
    """What `vrl commit` snapshots: a safetensors file opened without torch (hashed from its
    memory map, its header kept for exact round trips), or a `.pt` file's state tree."""
    from vrl.safetensors_file import read_file

    path = Path(path)
    kind = _kind(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if kind == "safetensors":
        return read_file(path)
    return _read_torch(path)


def read_checkpoint(path: str | Path) -> Any:
    """Load a checkpoint file into a (nested) state tree of CPU tensors."""
    from vrl.safetensors_file import SafetensorsFile
    from vrl.tensors import file_state

    opened = open_checkpoint(path)
    if isinstance(opened, SafetensorsFile):
        return to_torch(file_state(opened))
    return opened


def to_torch(tree: Any) -> Any:
    """A state tree read without torch, with torch tensors (memory-mapped, copy-on-write)
    in place of raw ones; tied tensors stay one tensor."""
    from vrl.safetensors_file import RawTensor
    from vrl.tensors import DtypeName, tensor_from_buffer, torch_dtype

    done: dict[int, Any] = {}

    def conv(node: Any) -> Any:
        if isinstance(node, RawTensor):
            if id(node) not in done:
                done[id(node)] = tensor_from_buffer(node.data, node.dtype, node.shape)
            return done[id(node)]
        if isinstance(node, DtypeName):
            return torch_dtype(node)
        if isinstance(node, dict):
            return {k: conv(v) for k, v in node.items()}
        if isinstance(node, list):
            return [conv(v) for v in node]
        if isinstance(node, tuple):
            return tuple(conv(v) for v in node)
        return node

    return conv(tree)


def _read_torch(path: Path) -> Any:
    _check_torch_format(path)
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():  # torch's advice is about unpickling: not ours
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message advises weights_only=False ("will likely succeed"): never relay
        # that, say which Python object the file needs instead
        blocked = _BLOCKED.search(str(exc))
        names = [blocked[1]] if blocked else _pickled_globals(path)
        what = f"the Python object {', '.join(names)}" if names else \
            "arbitrary Python objects"
        raise CheckpointError(
            f"{path}: refused, it needs pickle to rebuild {what}; vrl never unpickles "
            "untrusted data, so save a state dict of tensors "
            "(torch.save(model.state_dict(), ...)) or a .safetensors file"
        ) from None
    except Exception as exc:  # any failure to parse untrusted bytes means "not readable"
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint (truncated or not "
                              f"a checkpoint?): {_first_line(exc)}") from exc


# "Unsupported global: GLOBAL pkg.Class", "unrecognized function pkg.func", ...
_BLOCKED = re.compile(r"(?:GLOBAL|global|function|class)\s+([A-Za-z_][\w.]*\.[\w]+)")
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6
_PICKLE_MAGIC = b"\x80"  # the legacy format starts with a pickle (protocol 2 or later)


def _pickled_globals(path: Path, limit: int = 3) -> list[str]:
    """The classes and functions a (non-zip) pickle file names, found by reading its
    opcodes without running them, leaving out what torch's safe loader allows anyway."""
    import pickletools

    found: list[str] = []
    strings: list[str] = []
    try:
        with open(path, "rb") as f:
            for op, arg, _ in pickletools.genops(f):
                if op.name == "GLOBAL":
                    name = str(arg).replace(" ", ".")
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    name = f"{strings[-2]}.{strings[-1]}"
                else:
                    if isinstance(arg, str):
                        strings.append(arg)
                    continue
                if not name.startswith(("torch.", "collections.OrderedDict")) and \
                        name not in found:
                    found.append(name)
                if len(found) >= limit:
                    break
    except Exception:  # noqa: BLE001 - malformed bytes: report what was found so far
        pass
    return found


def _check_torch_format(path: Path) -> None:
    """Refuse a file that is not in either of torch.save's formats before torch reads it
    (torch would blame whatever it is on pickle)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    if not (magic.startswith(_ZIP_MAGIC) or magic.startswith(_PICKLE_MAGIC)):
        what = "it is empty" if not magic else "it is neither the zip archive nor the " \
            "pickle that torch.save writes"
        raise CheckpointError(f"{path}: not a PyTorch checkpoint ({what}); give a .pt/.pth "
                              "saved by torch.save or a .safetensors file")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:120] if lines else type(exc).__name__


def canonical_header(tree: Any, entries: Mapping[str, TensorEntry]) -> tuple[bytes, list[str]]:
    """The header vrl writes for a snapshot without a kept file header (and the tensor
    names in data order): the safetensors library's layout, plus the snapshot's structure
    in `vrl.*` metadata so that reading the file back gives the same checkpoint."""
    from vrl.safetensors_file import code_of, header_bytes

    ties = {n: e.tie for n, e in sorted(entries.items()) if e.tie is not None}
    stored = [(n, e) for n, e in entries.items() if e.tie is None]
    meta = {"vrl.tree": json.dumps(tree, separators=(",", ":")),
            "vrl.ties": json.dumps(ties),
            "vrl.numpy": json.dumps(sorted(n for n, e in stored if e.dtype.startswith("numpy:"))),
            "format": "pt"}
    return header_bytes([(n, code_of(e.dtype), e.shape, e.nbytes) for n, e in stored], meta)


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write `path` through a temp file renamed into place: never half-written."""
    tmp = path.with_name(f".{path.name}.tmp-{os.urandom(4).hex()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        discard(tmp)
        raise storage_error(exc, path.parent, f"writing {path.name}") from exc
    except VrlError:
        discard(tmp)
        raise
    except Exception as exc:  # safetensors and torch wrap I/O errors (a full disk) in theirs
        error = _writer_error(exc, path)
        discard(tmp)
        raise error from exc
    except BaseException:
        discard(tmp)
        raise


def _writer_error(exc: Exception, path: Path) -> VrlError:
    try:
        st = os.statvfs(path.parent)
        full = st.f_bavail * st.f_frsize < (1 << 16)
    except OSError:
        full = False
    if full or "os error 28" in str(exc) or "No space left" in str(exc):
        return storage_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path.parent,
                             f"writing {path.name}")
    return StorageError(f"could not write {path}: {_first_line(exc)}")


def write_checkpoint(tree: Any, path: str | Path) -> None:
    """Write a state tree atomically: `.safetensors` (with the tree as metadata) or `.pt`."""
    path = Path(path)
    if _kind(path) == "safetensors":
        _atomic_write(path, lambda tmp: _write_safetensors(tree, tmp))
    else:
        _atomic_write(path, lambda tmp: _save_torch(tree, tmp))


def _save_torch(tree: Any, path: Path) -> None:
    import torch

    torch.save(_numpy_to_torch(to_torch(tree)), path)


def _numpy_to_torch(tree: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    if isinstance(tree, dict):
        return {k: _numpy_to_torch(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_numpy_to_torch(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_numpy_to_torch(v) for v in tree)
    return tree


def _checked(chunks: Iterable[Chunk]) -> Iterable[Chunk]:
    """Chunks whose mismatches (found while writing) are a damaged store, not bad input."""
    try:
        yield from chunks
    except ValueError as exc:
        raise CorruptObjectError(f"the file header stored with this snapshot does not match "
                                 f"its tensors ({exc}); run `vrl fsck`") from exc


def _write_safetensors(tree: Any, path: Path) -> None:
    from vrl.tensors import flatten, tensor_bytes

    tensors, skeleton, ties = flatten(tree)
    entries: dict[str, TensorEntry] = {}
    data: dict[str, Any] = {}
    for name, value in tensors.items():
        if name in ties:
            entries[name] = TensorEntry(ObjectId(""), "", (), 0, tie=ties[name])
            continue
        buf, dtype, shape, keep = tensor_bytes(value)
        data[name] = (buf, keep)
        entries[name] = TensorEntry(ObjectId(""), dtype, shape, buf.nbytes)
    head, order = canonical_header(skeleton, entries)
    write_stream(path, head, (data[name][0] for name in order))


def _stat_key(st: os.stat_result) -> dict[str, int]:
    """What the workspace stat cache compares, as Git's index does. Size and mtime alone
    miss a change that keeps both (`cp -p`, `rsync -t`, `tar`, `os.utime`); such a change
    still sets the file's ctime, and a file put in its place has another inode."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino, "dev": st.st_dev}


def _boot_id() -> str | None:
    """This boot of the machine (Linux), to tell a stat cache written before a restart."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


class WorkspaceMixin:
    """The workspace checkpoint, Git's working tree for policies (mixed into Repo, which
    provides what is declared here: the mixin never imports Repo)."""

    workdir: Path
    vrl_dir: Path
    config: Config
    objects: FileObjectStore
    threshold: float
    head: Callable[[], ObjectId | None]
    read_commit: Callable[[ObjectId], Commit]
    read_manifest: Callable[[ObjectId], Manifest]
    read_tensor: Callable[[TensorEntry], RawTensor]
    read_verified: Callable[[TensorEntry], memoryview]
    tensor_chunk: Callable[[TensorEntry], memoryview | FileSlice]
    load: Callable[..., Any]
    snapshot: Callable[..., tuple[ObjectId, Manifest, set[ObjectId]]]
    require_data: Callable[[ObjectId, Manifest], None]

    @property
    def workspace_path(self) -> Path:
        return self.workdir / (self.config.get("core", "workspace") or "policy.safetensors")

    def _index_path(self) -> Path:
        return self.vrl_dir / "index"

    def workspace_manifest(self, path: Path | None = None
                           ) -> tuple[ObjectId, Manifest] | None:
        """The manifest the workspace checkpoint would have (None if the file is absent).

        A stat cache (`.vrl/index`) avoids re-reading a file unchanged since vrl wrote,
        committed or last read it, as Git's index does: size, mtime, ctime, inode and
        device must all match (`_stat_key`). It holds until the machine restarts: a
        checkout does not fsync the file it writes (neither do git and dvc), so after a
        power cut the file may lack bytes its size and time promise, and it is read again
        instead.
        """
        path = path or self.workspace_path
        try:
            before = path.stat()
        except OSError:
            return None
        cached = self._index_lookup(path, before)
        if cached and self.objects.has(cached):
            return cached, self.read_manifest(cached)
        mid, manifest, _ = self.snapshot(open_checkpoint(path), write=False)
        if self.objects.has(mid):  # committed content: the next look needs no re-read
            self.record_workspace(path, mid, before)
        return mid, manifest

    def _index_lookup(self, path: Path, st: os.stat_result) -> ObjectId | None:
        try:
            index = json.loads(self._index_path().read_text())
        except (OSError, ValueError):
            return None
        # (an index of an older vrl lacks ctime, inode and device: it misses)
        if isinstance(index, dict) and index.get("path") == str(path.resolve()) and \
                all(index.get(k) == v for k, v in _stat_key(st).items()) and \
                index.get("boot") == _boot_id() and is_object_id(index.get("manifest", "")):
            return ObjectId(index["manifest"])
        return None

    def record_workspace(self, path: Path, manifest: ObjectId,
                         before: os.stat_result | None = None) -> None:
        """Remember that `path` holds the snapshot whose manifest is `manifest`. `before`:
        the file's stat from before it was read; nothing is recorded if it changed since."""
        try:
            st = path.stat()
        except OSError:
            return
        if before is not None and _stat_key(st) != _stat_key(before):
            return  # written while it was read: the manifest may not be its content
        data = {"path": str(path.resolve()), **_stat_key(st), "boot": _boot_id(),
                "manifest": manifest}
        tmp = self._index_path().with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._index_path())
        except OSError:
            pass  # only a cache

    def workspace_status(self) -> tuple[str, DiffResult | None]:
        """("clean" | "modified" | "missing" | "untracked", diff HEAD -> workspace)."""
        current = self.workspace_manifest()
        head = self.head()
        if current is None:
            return "missing", None
        mid, manifest = current
        if head is None:
            return "untracked", None
        head_manifest = self.read_commit(head).manifest
        if head_manifest == mid:
            return "clean", None
        diff = self._diff_workspace(self.read_manifest(head_manifest), manifest)
        return "modified", diff

    def _diff_workspace(self, old: Manifest, new: Manifest) -> DiffResult:
        from vrl.tensors import flatten, to_state

        state: dict[str, Any] | None = None

        def load(entry: TensorEntry) -> Any:
            nonlocal state
            if self.objects.has(entry.id):
                return self.read_tensor(entry)
            if state is None:
                state = flatten(to_state(open_checkpoint(self.workspace_path)))[0]
            name = next(n for n, e in new.tensors.items() if e.id == entry.id)
            return state[name]

        return compare(old, new, load, threshold=self.threshold)

    def write_workspace(self, oid: ObjectId, path: Path | None = None) -> Path:
        path = path or self.workspace_path
        commit = self.read_commit(oid)
        self.export(oid, path)
        self.record_workspace(path, commit.manifest)
        return path

    def export(self, oid: ObjectId, path: str | Path) -> None:
        """Write snapshot `oid` to a checkpoint file, atomically.

        `.safetensors`: without torch; a snapshot committed from a safetensors file gives
        back that file byte for byte, any other the canonical layout with `vrl.*` metadata.
        `.pt`/`.pth`: torch.save of the loaded snapshot. Every stored byte is hashed to
        its object's id before it is written: a damaged object fails the export
        (CorruptObjectError) and leaves whatever `path` held as it was.
        """
        path = Path(path)
        if _kind(path) != "safetensors":
            write_checkpoint(self.load(oid, verify=True), path)
            return
        manifest = self.read_manifest(self.read_commit(oid).manifest)
        self.require_data(oid, manifest)
        head, chunks, size = self._safetensors_parts(manifest)
        _atomic_write(path, lambda tmp: write_stream(tmp, head, chunks, size))

    def _safetensors_parts(self, manifest: Manifest
                           ) -> tuple[bytes | memoryview, Iterable[Chunk], int]:
        """The file's header, its tensors' bytes in data order (each verified as it is
        read: `tensor_chunk`), and its size."""
        from vrl.safetensors_file import reproduce

        if manifest.layout is None:
            head, order = canonical_header(manifest.tree, manifest.tensors)
            size = len(head) + sum(manifest.tensors[n].nbytes for n in order)
            return head, (self.tensor_chunk(manifest.tensors[n]) for n in order), size
        if manifest.layout.format != "safetensors":
            raise CheckpointError(f"this snapshot was committed from a "
                                  f"{manifest.layout.format} file; export it to that format")
        head = self.read_verified(manifest.layout.header)

        def data_of(name: str) -> Chunk:
            entry = manifest.tensors.get(name)
            if entry is None or entry.tie is not None:
                raise ValueError(f"the snapshot has no stored tensor {name!r}")
            return self.tensor_chunk(entry)

        try:
            header, chunks = reproduce(head, data_of)
        except ValueError as exc:
            raise CorruptObjectError(f"the file header stored with this snapshot is damaged "
                                     f"({exc}); run `vrl fsck`") from exc
        return head, _checked(chunks), header.size + header.data_size

    def ensure_clean_workspace(self) -> None:
        status, _ = self.workspace_status()
        if status == "modified":
            raise WorkspaceError(f"{self.workspace_path.name} has uncommitted changes; commit "
                                 "them, or use --force to discard them")
        if status == "untracked":
            raise WorkspaceError(f"{self.workspace_path.name} was never committed and would "
                                 "be overwritten; commit it, or use --force")
