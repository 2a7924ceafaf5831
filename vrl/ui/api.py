"""The JSON API of `vrl ui` (and the data a `vrl report` embeds): `vrl.views` shaped for
the page.

Routes (GET /api/NAME?query): summary, version, graph, compare, curves?metric=M&rev=R,
scalars?rev=R&rev=..., heatmap?rev=R, commit?rev=R, diff?a=A&b=B; and one binary route,
gif?rev=R (a commit's eval GIF, see `eval_gif`). Query values are revisions and metric names
only: they go to `repo.resolve` and the views, never to the filesystem. Every string
that may hold a URL (environment context, messages of errors) is redacted as the CLI
does.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from vrl import lineage, views
from vrl.diff import StateLayout
from vrl.errors import VrlError
from vrl.history import History
from vrl.refs import short_ref
from vrl.remote.base import redact
from vrl.repo import Repo

CACHE_SIZE = 256
GIF_FOLDERS = ("eval", ".vrl/eval")  # under the work directory: where eval GIFs are found
GIF_MAX_BYTES = 64 << 20
# routes whose answers hold no NaN or infinity by construction: the check (a JSON
# encoding of a few MB for the dashboard) is skipped
FINITE_ROUTES = frozenset({"scalars"})
_HEX = re.compile(r"[0-9a-f]{12,64}")


def default_metrics(metrics: list[str]) -> dict[str, Any]:
    """What the page shows first, as the CLI does: `default_metric` (the curve: the
    return, else the first metric) and `return_metrics` (the compare table's columns:
    the return and its smoothed form, where present)."""
    returns = views.default_returns(metrics)
    return {"default_metric": returns[0] if returns else (metrics[0] if metrics else None),
            "return_metrics": returns}


class ApiError(VrlError, ValueError):
    """A request the API cannot answer (unknown route, missing parameter)."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def open_repo(path: str | Path = ".") -> Repo:
    """The repository, read-only as far as the views go: no lazy downloads (a view that
    needs tensor data that is not here says so instead of fetching it)."""
    return Repo(path, fetch=False)


def _finite(value: Any) -> Any:
    """Non-finite floats (NaN metrics) as the strings commits store them as: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _strict(data: Any) -> Any:
    """`data` as strict JSON can hold it (NaN metrics, from commits or statistics, become
    strings); the check is one C-speed encoding, the rewrite only where it fails."""
    try:
        json.dumps(data, allow_nan=False)
    except ValueError:
        return _finite(data)
    return data


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value


def _one(params: dict[str, list[str]], name: str) -> str:
    values = params.get(name)
    if not values or not values[-1]:
        raise ApiError(f"missing parameter {name!r}")
    return values[-1]


class Api:
    """Answers API routes over one repository. Calls are serialised (one lock) and their
    answers cached per refs version, so a page that polls costs a file listing."""

    def __init__(self, repo: Repo, live: bool = True) -> None:
        """`live=False` (a report): the refs are read once, not before every answer."""
        self.repo = repo
        self._fixed_version = None if live else self._read_version()
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str, tuple], Any] = OrderedDict()
        self._labels: tuple[str, dict[str, list[dict[str, str]]]] | None = None
        self._busy = 0  # requests in progress (warm() waits while there are any)
        self._busy_lock = threading.Lock()
        self.routes: dict[str, Callable[[dict[str, list[str]]], Any]] = {
            "summary": self.summary, "version": lambda p: {"version": self.version()},
            "graph": self.graph, "compare": self.compare, "curves": self.curves,
            "heatmap": self.heatmap, "commit": self.commit, "diff": self.diff,
            "scalars": self.scalars,
        }

    # ------------------------------------------------------------------ plumbing
    def get(self, route: str, params: dict[str, list[str]]) -> Any:
        handler = self.routes.get(route)
        if handler is None:
            raise ApiError(f"no such API route {route[:50]!r}", HTTPStatus.NOT_FOUND)
        with self._busy_lock:
            self._busy += 1
        try:
            return self._get(handler, route, params)
        finally:
            with self._busy_lock:
                self._busy -= 1

    def _get(self, handler: Callable[[dict[str, list[str]]], Any], route: str,
             params: dict[str, list[str]]) -> Any:
        with self._lock:
            version = self.version()
            key = (version, route, tuple(sorted((k, tuple(v)) for k, v in params.items())))
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            data = handler(params)
            if route not in FINITE_ROUTES:
                data = _strict(data)
            self._cache[key] = data
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return data

    def warm(self) -> threading.Thread:
        """Read every commit now (the first page needs them all, and its runs table the
        summary and compare answers), then, in the background, the layer statistics of
        every run's line (the heatmap's data, the slowest to read), so that the first
        heatmap a user opens is as quick as the others. Views and this
        thread only ever add the same immutable entries to the history cache."""
        self.get("graph", {})
        # the page itself holds the runs table (vrl.ui.firstpaint): its answers too
        self.get("summary", {})
        self.get("compare", {})

        def layers() -> None:
            try:
                read_layers()
            except VrlError:  # a ref deleted meanwhile, a shallow history: only a warm-up
                pass

        def read_layers() -> None:
            history = History.of(self.repo)
            for run in views.runs(self.repo, metrics=[]):
                # the layers layer_heatmap() picks by default: the model's in a training
                # snapshot (tests/test_ui_api.py checks that this stays in step)
                names = history.stats(run["id"]).get("layers")
                prefix = "model/" if isinstance(names, dict) and \
                    any(name.startswith("model/") for name in names) else ""
                for oid in history.line(run["id"]):
                    while self._busy:  # requests first: never compete for the GIL
                        time.sleep(0.02)
                    history.layers(oid, prefix)

        thread = threading.Thread(target=layers, name="vrl-ui-warm", daemon=True)
        thread.start()
        return thread

    def version(self) -> str:
        """Changes whenever a ref or HEAD moves (a new commit, branch or tag)."""
        return self._fixed_version or self._read_version()

    def _read_version(self) -> str:
        refs = sorted(self.repo.refs.list().items())
        text = repr((refs, self.repo.refs.read_raw("HEAD")))
        return hashlib.blake2s(text.encode(), digest_size=8).hexdigest()

    @staticmethod
    def clean_error(exc: Exception) -> str:
        return redact(str(exc))

    def labels(self) -> dict[str, list[dict[str, str]]]:
        """Commit id -> its refs as {name, kind} (kind: head, branch, remote, tag)."""
        version = self.version()
        if self._labels is None or self._labels[0] != version:
            self._labels = (version, self._read_labels())
        return self._labels[1]

    def _read_labels(self) -> dict[str, list[dict[str, str]]]:
        current = self.repo.refs.head_target()
        out: dict[str, list[dict[str, str]]] = {}
        for ref, oid in sorted(self.repo.refs.list().items()):
            kind = ("head" if ref == current else "branch") if ref.startswith("refs/heads/") \
                else "tag" if ref.startswith("refs/tags/") else "remote"
            out.setdefault(oid, []).append({"name": short_ref(ref), "kind": kind})
        for items in out.values():
            items.sort(key=lambda r: ("head", "branch", "remote", "tag").index(r["kind"]))
        return out

    # ------------------------------------------------------------------ routes
    def summary(self, params: dict[str, list[str]]) -> dict[str, Any]:
        runs = views.runs(self.repo, metrics=[])
        metrics = views.metric_names(self.repo)
        return {"repo": self.repo.workdir.name, "version": self.version(),
                "head": self.repo.head(), "current_branch": self.repo.current_branch(),
                "branches": {r["name"]: r["id"] for r in runs}, "tags": self.repo.tags(),
                "metrics": metrics, **default_metrics(metrics)}

    def graph(self, params: dict[str, list[str]]) -> dict[str, Any]:
        data = views.graph(self.repo)
        labels = self.labels()
        commits = [{"id": c["id"], "parents": c["parents"], "lane": c["lane"],
                    "parent_lanes": c["parent_lanes"], "refs": labels.get(c["id"], []),
                    "time": c["time"], "step": c["step"], "message": c["message"]}
                   for c in data["commits"]]
        return {"lanes": data["lanes"], "commits": commits}

    def compare(self, params: dict[str, list[str]]) -> dict[str, Any]:
        return self.compare_shape(views.compare(self.repo))

    @staticmethod
    def compare_shape(data: dict[str, Any]) -> dict[str, Any]:
        """`views.compare` for the page: metrics as [last, best], the branch point as
        `run@step`, environment left out."""
        rows = [{"name": r["name"], "id": r["id"], "step": r["step"],
                 "snapshots": r["snapshots"], "own": r["own"], "time": r["time"],
                 "branch_point": (f"{r['branch_point']['run']}@{r['branch_point']['step']}"
                                  if r["branch_point"] else None),
                 "hparams": r["hparams"],
                 "metrics": {m: [v["last"], v["best"]] for m, v in r["metrics"].items()}}
                for r in data["rows"]]
        return {"params": data["params"], "metrics": data["metrics"], "rows": rows}

    def curves(self, params: dict[str, list[str]]) -> dict[str, Any]:
        metric, rev = _one(params, "metric"), _one(params, "rev")
        try:
            run = views.curves(self.repo, metric, [rev])[0]
        except views.ViewError:  # this run has no such metric: an empty curve
            return {"name": rev, "id": self.repo.resolve(rev), "metric": metric, "points": []}
        return {"name": rev, "id": run["id"], "metric": metric, "points": run["points"]}

    def scalars(self, params: dict[str, list[str]]) -> dict[str, Any]:
        """Every metric of the runs `rev` (repeated; default: every run), by column (see
        `views.all_curves`): the dashboard draws all its cards from this one answer."""
        revs = [r for r in params.get("rev", []) if r]
        return views.all_curves(self.repo, revs or None)

    def heatmap(self, params: dict[str, list[str]]) -> dict[str, Any]:
        data = views.layer_heatmap(self.repo, _one(params, "rev"))
        # three significant digits are all a colour shows: a third of the bytes to send
        values = [[None if v is None else float(f"{v:.3g}") for v in row]
                  for row in data["values"]]
        commits = [{"id": c["id"], "step": c["step"]} for c in data["commits"]]
        return {"name": data["name"], "id": data["id"], "layers": data["layers"],
                "commits": commits, "values": values, "frozen": data["frozen"],
                "threshold": data["threshold"], "max": data["max"]}

    def commit(self, params: dict[str, list[str]]) -> dict[str, Any]:
        d = views.commit_detail(self.repo, _one(params, "rev"))
        frozen = set(d["frozen_layers"])
        commit = self.repo.read_commit(d["id"])
        layers = _layer_rows(d["diff"], frozen, commit.meta)
        return {"id": d["id"], "parents": d["parents"], "refs": self.labels().get(d["id"], []),
                "merge": lineage.merge_lines(commit),
                "message": d["message"], "author": d["author"], "time": d["time"],
                "step": d["step"], "hparams": d["hparams"], "metrics": d["metrics"],
                "env": [{"key": k, "value": v} for k, v in _redacted(d["env"]).items()],
                "meta": [{"key": k, "value": v} for k, v in _redacted(d["meta"]).items()],
                "frozen": sorted(frozen), "layers": layers,
                "summary": d["diff"].get("summary") if d["diff"] else None,
                "gif": self.eval_gif(d["id"]) is not None}

    def gif_file(self, rev: str) -> Path | None:
        """`eval_gif` for the server (serialised with the other calls)."""
        with self._lock:
            return self.eval_gif(rev)

    def eval_gif(self, rev: str) -> Path | None:
        """The eval GIF of commit `rev`, if there is one: `eval/ID.gif` or
        `.vrl/eval/ID.gif` in the work directory, ID the commit's full id or its first 12
        hex digits (as `vrl eval REV --gif eval/ID.gif` writes it; the trainer titles its
        frames with those 12). The path is made from the resolved id only, never from
        request text, and must be a regular file inside that folder that starts as a GIF
        does."""
        oid = self.repo.resolve(rev)
        if not _HEX.fullmatch(oid):
            return None
        for folder in GIF_FOLDERS:
            base = (self.repo.workdir / folder).resolve()
            for name in (oid, oid[:12]):
                path = (base / f"{name}.gif").resolve()
                try:
                    if path.parent != base or not path.is_file() or \
                            path.stat().st_size > GIF_MAX_BYTES:
                        continue
                    with path.open("rb") as f:
                        if f.read(6) in (b"GIF87a", b"GIF89a"):
                            return path
                except OSError:
                    continue
        return None

    def diff(self, params: dict[str, list[str]]) -> dict[str, Any]:
        d = views.diff(self.repo, _one(params, "a"), _one(params, "b"))
        return {"a": d["a"], "b": d["b"],
                "hparams": [h for h in d["hparams"] if h["status"] != "same"],
                "metrics": d["metrics"],
                "layers": _layer_rows(d["diff"], set(), self.repo.read_commit(d["b"]).meta)
                if d["diff"] else None,
                "summary": d["diff"].get("summary") if d["diff"] else None,
                "error": redact(d["error"]) if d["error"] else None}


def _layer_rows(diff: dict[str, Any] | None, frozen: set[str],
                meta: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The `vrl diff` layer table as rows, in the CLI's order (`render_diff`): model
    layers, then optimizer state (each with the parameter it belongs to, from the
    layout the new commit's metadata declares), then other state; frozen marked. Each
    row's `kind` is "model", "optimizer" or "other" (always "model" for a plain state
    dict) and `label` the name the CLI prints (a model layer without the model prefix)."""
    if not diff:
        return []
    names = sorted(diff.get("layers", {}), key=views.natural_key)
    layout = StateLayout.derive(names, meta)
    rows = []
    for name in names:
        layer = diff["layers"][name]
        kind = layout.kind(name)
        shapes = layer.get("shapes") or []
        prefix = layout.model_prefix
        rows.append({"layer": name, "kind": kind,
                     "label": name[len(prefix):] if prefix and kind == "model" else name,
                     "parameter": layout.parameter(name) if kind == "optimizer" else None,
                     "status": layer.get("status"), "rel": layer.get("rel"),
                     "max_abs": layer.get("max_abs"), "material": bool(layer.get("material")),
                     "shape": ", ".join("x".join(str(d) for d in s) or "scalar"
                                        for s in shapes[:3]) + (" ..." if len(shapes) > 3 else ""),
                     # the trainer names modules (actor.0), the store layers under the
                     # snapshot's tree (model/actor.0)
                     "frozen": name in frozen or name.rpartition("/")[2] in frozen or
                     any(name.endswith("/" + f) for f in frozen if "/" in f)})
    order = {"model": 0, "optimizer": 1, "other": 2}
    rows.sort(key=lambda r: order[r["kind"]])  # stable: natural order within a kind
    return rows
