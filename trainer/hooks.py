"""Training events and the hooks that receive them.

The trainer calls, in order::

    on_start(trainer)
    on_iteration_end(trainer, iteration, metrics)      # after every rollout + update
    on_evaluation(trainer, iteration, metrics)         # after each evaluation
    on_end(trainer, metrics)                           # once, with the last metrics

``metrics`` maps stable keys (``losses/approx_kl``, ``charts/return``...) to
floats. A hook may call ``trainer.request_stop()``. Hooks are the trainer's only link
to storage: a store hook snapshots ``trainer.state_dict()`` in ``on_iteration_end``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.train import Trainer


class Hook:
    """Base class with no-op handlers; subclass and override what you need."""

    def on_start(self, trainer: Trainer) -> None:
        pass

    def on_iteration_end(self, trainer: Trainer, iteration: int,
                         metrics: dict[str, float]) -> None:
        pass

    def on_evaluation(self, trainer: Trainer, iteration: int,
                      metrics: dict[str, float]) -> None:
        pass

    def on_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        pass


def _clean(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()}


class JSONLLogger(Hook):
    """Appends one JSON object per iteration (and per evaluation) to ``metrics.jsonl``."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        self._file.flush()

    def on_iteration_end(self, trainer, iteration, metrics):
        self._write({"event": "iteration", "iteration": iteration, **metrics})

    def on_evaluation(self, trainer, iteration, metrics):
        self._write({"event": "evaluation", "iteration": iteration,
                     "global_step": trainer.global_step, **metrics})

    def on_end(self, trainer, metrics):
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardLogger(Hook):
    """Scalars to TensorBoard under ``out_dir`` (needs ``pip install tensorboard``)."""

    def __init__(self, out_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # raises if tensorboard is absent

        self.writer = SummaryWriter(str(out_dir))

    def _scalars(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)

    def on_iteration_end(self, trainer, iteration, metrics):
        self._scalars(trainer.global_step, metrics)

    def on_evaluation(self, trainer, iteration, metrics):
        self._scalars(trainer.global_step, metrics)

    def on_end(self, trainer, metrics):
        self.writer.close()


class ProgressHook(Hook):
    """A tqdm bar over agent-steps plus a metric line every ``every`` iterations."""

    KEYS = ("charts/return", "losses/approx_kl", "losses/clipfrac",
            "losses/value_loss", "charts/SPS")

    def __init__(self, every: int = 10, stream: IO[str] | None = None,
                 bar: bool = True) -> None:
        self.every = every
        self.stream = stream or sys.stderr
        self.bar_enabled = bar
        self._bar = None
        self._t0 = 0.0

    def on_start(self, trainer):
        self._t0 = time.perf_counter()
        if self.bar_enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=trainer.total_steps, initial=trainer.global_step,
                             unit="step", unit_scale=True, file=self.stream, leave=False)

    def line(self, iteration: int, metrics: dict[str, float]) -> str:
        parts = [f"iter {iteration}", f"step {int(metrics.get('charts/global_step', 0))}"]
        for key in self.KEYS:
            if key in metrics and metrics[key] is not None:
                parts.append(f"{key.split('/')[-1]} {metrics[key]:.4g}")
        return " | ".join(parts)

    def on_iteration_end(self, trainer, iteration, metrics):
        if self._bar is not None:
            self._bar.n = trainer.global_step
            self._bar.refresh()
        if self.every and iteration % self.every == 0:
            text = self.line(iteration, metrics)
            if self._bar is not None:
                self._bar.write(text, file=self.stream)
            else:
                print(text, file=self.stream)

    def on_evaluation(self, trainer, iteration, metrics):
        text = f"eval @ iter {iteration}: " + ", ".join(
            f"{k.split('/')[-1]} {v:.4g}" for k, v in metrics.items())
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream)

    def on_end(self, trainer, metrics):
        if self._bar is not None:
            self._bar.close()


class MetricsRecorder(Hook):
    """Keeps every iteration's and evaluation's metrics in memory (tests, benchmarks)."""

    def __init__(self) -> None:
        self.iterations: list[dict[str, float]] = []
        self.evaluations: list[dict[str, float]] = []

    def on_iteration_end(self, trainer, iteration, metrics):
        self.iterations.append(dict(metrics, iteration=iteration))

    def on_evaluation(self, trainer, iteration, metrics):
        self.evaluations.append(dict(metrics, iteration=iteration))
