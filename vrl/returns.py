"""The names of the training return, shared by the trainer and every view of its runs.

* ``charts/episodic_return`` (CleanRL's key) - **the return**: the mean return of the
  episodes that finished during the iteration. An iteration in which no episode finished
  has none (episodes often span iterations), rather than a repeat of the last value.
* ``charts/return_last100`` - its smoothed form: the mean return of the last 100 finished
  episodes (of all of them while fewer have finished).
* ``charts/episodes`` - how many episodes finished during the iteration (0: none, which is
  why the return is absent).

``charts/return`` (the mean of the last 10 or more episodes, repeated while none finished)
is what trainers before these names logged: views still read it for old commits.
"""

from __future__ import annotations

from collections.abc import Iterable

RETURN_METRIC = "charts/episodic_return"
SMOOTHED_RETURN_METRIC = "charts/return_last100"
SMOOTHED_EPISODES = 100
EPISODES_METRIC = "charts/episodes"
LEGACY_RETURN_METRIC = "charts/return"

RETURN_METRICS = (RETURN_METRIC, SMOOTHED_RETURN_METRIC, "eval/return", LEGACY_RETURN_METRIC,
                  "return", "reward")
"""Metrics views show by default where present, the one they prefer first (the trainer's
return, its smoothed form, evaluations; then older and hand-committed names)."""


def default_returns(names: Iterable[str]) -> list[str]:
    """The return metrics among ``names`` worth showing by default: RETURN_METRICS present,
    without the old ``charts/return`` where the runs also log the return by its name."""
    present = set(names)
    out = [m for m in RETURN_METRICS if m in present]
    if RETURN_METRIC in present:
        out = [m for m in out if m != LEGACY_RETURN_METRIC]
    return out
