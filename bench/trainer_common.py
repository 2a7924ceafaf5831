"""Shared helpers of the trainer benchmarks (not a benchmark itself)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from trainer.config import PPOConfig
from trainer.hooks import MetricsRecorder
from trainer.train import Trainer

OUT = Path(__file__).parent / "out"


def run(env, config: PPOConfig, eval_env=None, threads: int = 1) -> dict:
    """Train to completion and return every iteration's and evaluation's metrics."""
    torch.set_num_threads(threads)
    rec = MetricsRecorder()
    trainer = Trainer(env, config, hooks=[rec], eval_env=eval_env)
    t0 = time.perf_counter()
    trainer.train()
    return {"wall_s": time.perf_counter() - t0, "iterations": rec.iterations,
            "evaluations": rec.evaluations, "global_step": trainer.global_step}


def save(name: str, payload: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(payload, indent=1, default=float))
    return path


def plot_curves(path: Path, series: dict[str, list[tuple[list[float], list[float]]]],
                xlabel: str, ylabel: str, title: str) -> None:
    """One line per (label, seed): mean across seeds drawn bold. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, runs) in enumerate(series.items()):
        colour = f"C{i}"
        for xs, ys in runs:
            ax.plot(xs, ys, color=colour, alpha=0.25, lw=0.8)
        n = min(len(ys) for _, ys in runs)
        if n:
            mean = np.mean([ys[:n] for _, ys in runs], axis=0)
            ax.plot(runs[0][0][:n], mean, color=colour, lw=2, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
