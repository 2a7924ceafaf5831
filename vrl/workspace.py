"""Checkpoint files: reading what a user hands to `vrl commit`, writing what checkout and
export produce, and the workspace checkpoint (Git's working tree for policies). Nothing is
ever unpickled: `.pt` files load with weights_only=True."""

from __future__ import annotations

import json
import os
import pickle
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrl.diff import DiffResult, compare
from vrl.errors import CheckpointError, WorkspaceError
from vrl.object_store import discard, storage_error
from vrl.objects import Manifest, ObjectId, TensorEntry, is_object_id

if TYPE_CHECKING:
    from vrl.repo import Repo

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


def read_checkpoint(path: str | Path) -> Any:
    """Load a checkpoint file into a (nested) state tree of CPU tensors."""
    path = Path(path)
    kind = _kind(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if kind == "safetensors":
        return _read_safetensors(path)
    _check_torch_format(path)
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


def _read_safetensors(path: Path) -> Any:
    from safetensors import SafetensorError, safe_open

    from vrl.tensors import unflatten

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or not a "
                              f"checkpoint?): {_first_line(exc)}") from exc
    if "vrl.tree" not in meta:
        return dict(tensors)
    try:
        for name, target in json.loads(meta.get("vrl.ties", "{}")).items():
            tensors[name] = tensors[target]
        for name in json.loads(meta.get("vrl.numpy", "[]")):
            tensors[name] = tensors[name].numpy()
        return unflatten(json.loads(meta["vrl.tree"]), tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: its vrl metadata is damaged ({exc}); re-export it") \
            from exc


def write_checkpoint(tree: Any, path: str | Path) -> None:
    """Write a state tree atomically: `.safetensors` (with the tree as metadata) or `.pt`."""
    path = Path(path)
    kind = _kind(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "safetensors":
            _write_safetensors(tree, tmp)
        else:
            import torch

            torch.save(_numpy_to_torch(tree), tmp)
        os.replace(tmp, path)
    except OSError as exc:
        discard(tmp)
        raise storage_error(exc, path.parent, f"writing {path.name}") from exc
    except BaseException:
        discard(tmp)
        raise


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


def _write_safetensors(tree: Any, path: Path) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from vrl.tensors import flatten

    tensors, skeleton, ties = flatten(tree)
    out: dict[str, torch.Tensor] = {}
    numpy_names = []
    storages: set[int] = set()
    for name, value in tensors.items():
        if name in ties:
            continue
        if isinstance(value, np.ndarray):
            numpy_names.append(name)
            value = torch.from_numpy(np.ascontiguousarray(value))
        value = value.detach().to("cpu").contiguous()
        ptr = value.untyped_storage().data_ptr()
        if value.numel() and ptr in storages:  # safetensors refuses overlapping views
            value = value.clone()
        storages.add(ptr)
        out[name] = value
    meta = {"vrl.tree": json.dumps(skeleton, separators=(",", ":")),
            "vrl.ties": json.dumps(ties), "vrl.numpy": json.dumps(numpy_names),
            "format": "pt"}
    save_file(out, str(path), metadata=meta)


class WorkspaceMixin:
    """The workspace checkpoint, Git's working tree for policies (mixed into Repo)."""

    @property
    def workspace_path(self: Repo) -> Path:
        return self.workdir / (self.config.get("core", "workspace") or "policy.safetensors")

    def _index_path(self: Repo) -> Path:
        return self.vrl_dir / "index"

    def workspace_manifest(self: Repo, path: Path | None = None
                           ) -> tuple[ObjectId, Manifest] | None:
        """The manifest the workspace checkpoint would have (None if the file is absent).

        A stat cache (`.vrl/index`) avoids re-reading a file unchanged since vrl wrote or
        committed it, as Git's index does.
        """
        path = path or self.workspace_path
        if not path.exists():
            return None
        cached = self._index_lookup(path)
        if cached and self.objects.has(cached):
            return cached, self.read_manifest(cached)
        mid, manifest, _ = self.snapshot(read_checkpoint(path), write=False)
        return mid, manifest

    def _index_lookup(self: Repo, path: Path) -> ObjectId | None:
        try:
            index = json.loads(self._index_path().read_text())
            st = path.stat()
        except (OSError, ValueError):
            return None
        if index.get("path") == str(path.resolve()) and index.get("size") == st.st_size \
                and index.get("mtime_ns") == st.st_mtime_ns and \
                is_object_id(index.get("manifest", "")):
            return ObjectId(index["manifest"])
        return None

    def record_workspace(self: Repo, path: Path, manifest: ObjectId) -> None:
        st = path.stat()
        data = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "manifest": manifest}
        tmp = self._index_path().with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._index_path())
        except OSError:
            pass  # only a cache

    def workspace_status(self: Repo) -> tuple[str, DiffResult | None]:
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

    def _diff_workspace(self: Repo, old: Manifest, new: Manifest) -> DiffResult:
        from vrl.tensors import flatten

        state: dict[str, Any] | None = None

        def load(entry: TensorEntry) -> Any:
            nonlocal state
            if self.objects.has(entry.id):
                return self.load_entry(entry)
            if state is None:
                state = flatten(read_checkpoint(self.workspace_path))[0]
            name = next(n for n, e in new.tensors.items() if e.id == entry.id)
            return state[name]

        return compare(old, new, load, threshold=self.threshold)

    def write_workspace(self: Repo, oid: ObjectId, path: Path | None = None) -> Path:
        path = path or self.workspace_path
        commit = self.read_commit(oid)
        write_checkpoint(self.load(oid), path)
        self.record_workspace(path, commit.manifest)
        return path

    def ensure_clean_workspace(self: Repo) -> None:
        status, _ = self.workspace_status()
        if status == "modified":
            raise WorkspaceError(f"{self.workspace_path.name} has uncommitted changes; commit "
                                 "them, or use --force to discard them")
        if status == "untracked":
            raise WorkspaceError(f"{self.workspace_path.name} was never committed and would "
                                 "be overwritten; commit it, or use --force")
