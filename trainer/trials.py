"""Running the trials of a sweep or a population: each a ``vrl train`` process, K at a
time, its output in its own log; SIGINT/SIGTERM forwarded to the running ones (which commit
a snapshot and stop), none left behind when the controller dies. trainer/sweep.py and
trainer/pbt.py plan the trials, trainer/ray_runner.py runs them on a Ray cluster instead."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

POLL_S = 0.2
LOG_TAIL = 3  # lines of a failed trial's log shown


@dataclass
class Trial:
    """One run of the sweep: a configuration (``--set`` values) with one seed."""

    config: str  # the configuration's readable name (without the seed)
    seed: int
    values: dict[str, str]  # config key -> the value's text, as given to --set
    sweep: str

    @property
    def name(self) -> str:
        return f"{self.config}-s{self.seed}"

    @property
    def branch(self) -> str:
        return f"sweep/{self.sweep}/{self.name}"

    def sets(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.values.items()]


@dataclass
class Job:
    trial: Trial
    args: list[str]
    log: Path
    resume: bool
    number: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    ended: float = 0.0
    rc: int | None = None
    stopped: bool = False  # the sweep was stopped (Ctrl-C, SIGTERM) while this one ran
    summary: dict[str, Any] = field(default_factory=dict)


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _summary(path: Path) -> dict[str, Any]:
    """The JSON line `vrl train --json` prints last (return, steps, branch, head)."""
    for line in reversed(_tail(path, 20)):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    return {}


@contextlib.contextmanager
def forwarded_signals(jobs: list[Job], stopping: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM stop the sweep from starting more and reach every running trial
    as SIGTERM (each commits its last snapshot and exits). Trials run in their own
    sessions, so a Ctrl-C at the terminal reaches them once, through here; as SIGTERM
    because a sweep started in the background of a script ignores SIGINT, and so would
    its trials (they inherit that)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        stopping.append(signum)
        for job in jobs:
            if job.process is not None and job.rc is None:
                job.stopped = True
                with contextlib.suppress(OSError):
                    job.process.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_jobs(jobs: list[Job], workers: int, total: int,
             on_end: Any = None) -> list[int]:
    """Run the jobs, ``workers`` at a time, echoing a line as each starts and ends.
    Returns the signals that stopped the sweep (empty if it ran to the end)."""
    pending = list(jobs)
    running: list[Job] = []
    stopping: list[int] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with forwarded_signals(jobs, stopping), _no_orphans(running):
        while running or pending and not stopping:
            while pending and len(running) < workers and not stopping:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "ab") as log:
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    log.write(f"# {when} {shlex.join(['vrl', *job.args[3:]])}\n".encode())
                    log.flush()
                    job.started = time.time()
                    job.process = subprocess.Popen(
                        job.args, stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running.append(job)
                verb = "resume" if job.resume else "start"
                click.echo(f"[{job.number}/{total}] {verb:<8}{job.trial.branch}")
            time.sleep(POLL_S)
            for job in list(running):
                assert job.process is not None
                rc = job.process.poll()
                if rc is None:
                    continue
                job.rc, job.ended = rc, time.time()
                running.remove(job)
                report(job, total)
                if on_end is not None:
                    on_end(job)
    return stopping


@contextlib.contextmanager
def _no_orphans(running: list[Job]) -> Iterator[None]:
    """If the sweep itself fails (or a signal slips past forwarded_signals), its trials,
    which run in sessions of their own, are stopped too: SIGTERM (they commit their last
    snapshot), then waited for."""
    try:
        yield
    except BaseException:
        for job in running:
            if job.process is not None and job.process.poll() is None:
                job.stopped = True
                with contextlib.suppress(OSError):
                    job.process.send_signal(signal.SIGTERM)
        for job in running:
            if job.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    job.process.wait(timeout=60)
        raise


def report(job: Job, total: int) -> None:
    took = f"{job.ended - job.started:.1f}s"
    head = f"[{job.number}/{total}] "
    if job.rc == 0:
        job.summary = _summary(job.log)
        from vrl.returns import LEGACY_RETURN_METRIC, SMOOTHED_RETURN_METRIC

        # the mean return of the last episodes (what `vrl train` ends with), else the
        # return a trainer from before those names reported
        ret = next((v for v in (job.summary.get(SMOOTHED_RETURN_METRIC),
                                job.summary.get(LEGACY_RETURN_METRIC))
                    if isinstance(v, (int, float))), None)
        shown = f"  return {ret:.4g}" if ret is not None else ""
        click.echo(f"{head}{'done':<8}{job.trial.branch}  {took}{shown}")
        return
    what = "stopped" if job.stopped else "FAILED"
    click.echo(f"{head}{what:<8}{job.trial.branch}  rc {job.rc}, {took}; log: {job.log}")
    if what == "FAILED":
        for line in _tail(job.log, LOG_TAIL):
            click.echo(f"    {line}")
