"""Training events and the hooks that receive them.

The trainer calls, in order::

    on_start(trainer)
    on_iteration_end(trainer, iteration, metrics)      # after every rollout + update
    on_evaluation(trainer, iteration, metrics)         # after each evaluation
    on_end(trainer, metrics)                           # once, with the last metrics

``metrics`` maps stable keys (``losses/approx_kl``, ``charts/episodic_return``...) to
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
    """A tqdm bar over agent-steps plus a metric line for people: at the first iteration,
    then every ``every`` iterations (None: about LINES a run, 20-40), and at the last,
    e.g. ``iter 4/40  step 81,920  return 1.23  deliveries 4.5  fps 52,000``.

    A line's return (and deliveries, where the env counts them) is the mean over the
    episodes that finished since the previous line; its fps is the agent-steps over the
    wall time since then (snapshots and evaluations included). A line with no finished
    episode says so: episodes often span iterations."""

    LINES = 25  # 40 iterations (README's run): every 2nd, when the warehouse's episodes end

    def __init__(self, every: int | None = None, stream: IO[str] | None = None,
                 bar: bool = True) -> None:
        self.every = every
        self.stream = stream or sys.stderr
        self.bar_enabled = bar
        self._bar = None
        self._interval = 1
        self._first = 0  # the iteration the run started at
        self._printed_at = 0  # the iteration of the last line
        self._reset(0, 0.0)

    def _reset(self, step: int, now: float) -> None:
        self._since_step, self._since_time = step, now
        self._episodes = 0.0
        self._sums: dict[str, float] = {}  # metric -> sum of (iteration mean x episodes)

    def on_start(self, trainer):
        self._first = self._printed_at = trainer.iteration
        remaining = max(1, trainer.num_iterations - trainer.iteration)
        self._interval = self.every if self.every is not None else \
            max(1, round(remaining / self.LINES))
        self._reset(trainer.global_step, time.perf_counter())
        if self.bar_enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=trainer.total_steps, initial=trainer.global_step,
                             unit="step", unit_scale=True, file=self.stream, leave=False)

    def _print(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream)

    def _add(self, metrics: dict[str, float]) -> None:
        from vrl.returns import EPISODES_METRIC, RETURN_METRIC

        count = metrics.get(EPISODES_METRIC) or 0.0
        if not count:
            return
        self._episodes += count
        for key in (RETURN_METRIC, "env/deliveries"):
            value = metrics.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._sums[key] = self._sums.get(key, 0.0) + value * count

    def line(self, iteration: int, total: int, step: int, fps: float | None) -> str:
        """The line for the episodes added since the last one (see the class)."""
        from vrl.returns import RETURN_METRIC

        parts = [f"iter {iteration}/{total}", f"step {step:,}"]
        if self._episodes:
            for key, label in ((RETURN_METRIC, "return"), ("env/deliveries", "deliveries")):
                if key in self._sums:
                    parts.append(f"{label} {_human(self._sums[key] / self._episodes)}")
        else:
            parts.append("no episode ended")
        if fps is not None:
            parts.append(f"fps {fps:,.0f}")
        return "  ".join(parts)

    def on_iteration_end(self, trainer, iteration, metrics):
        if self._bar is not None:
            self._bar.n = trainer.global_step
            self._bar.refresh()
        self._add(metrics)
        if self._interval and (iteration == self._first + 1
                               or (iteration - self._first) % self._interval == 0):
            self._line_now(trainer)

    def _line_now(self, trainer) -> None:
        now = time.perf_counter()
        elapsed = now - self._since_time
        fps = (trainer.global_step - self._since_step) / elapsed if elapsed > 0 else None
        self._print(self.line(trainer.iteration, trainer.num_iterations, trainer.global_step,
                              fps))
        self._printed_at = trainer.iteration
        self._reset(trainer.global_step, now)

    def on_evaluation(self, trainer, iteration, metrics):
        self._print(f"eval @ iter {iteration}: " + ", ".join(
            f"{k.split('/')[-1]} {v:.4g}" for k, v in metrics.items()))

    def on_end(self, trainer, metrics):
        if self._interval and self._printed_at < trainer.iteration:  # the last iteration
            self._line_now(trainer)
        if self._bar is not None:
            self._bar.close()


def _human(value: float) -> str:
    """4 significant digits, thousands separated from 10,000 on (no exponent)."""
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


class MetricsRecorder(Hook):
    """Keeps every iteration's and evaluation's metrics in memory (tests, benchmarks)."""

    def __init__(self) -> None:
        self.iterations: list[dict[str, float]] = []
        self.evaluations: list[dict[str, float]] = []

    def on_iteration_end(self, trainer, iteration, metrics):
        self.iterations.append(dict(metrics, iteration=iteration))

    def on_evaluation(self, trainer, iteration, metrics):
        self.evaluations.append(dict(metrics, iteration=iteration))
