"""``--ray ADDRESS`` of ``vrl sweep`` and ``vrl pbt``: the same ``vrl train`` commands,
each run as a Ray task instead of a local subprocess.

* Without ``--remote`` every task runs its command in the store's directory (a path the
  workers share: one machine, or a shared filesystem), and commits straight into it, as a
  local trial does (commits to different branches from several processes are safe).
* With ``--remote NAME`` each task clones that remote into a temporary directory of its
  worker (metadata only: the tensors of the one snapshot a trial resumes download when it
  loads them, not the whole store's), trains there and pushes its branch back (``vrl
  push``); the remote's refs move by compare-and-swap, and each trial owns its branch, so
  no trial's commit can overwrite another's. The controller pushes the branches it changed
  before the tasks start (PBT's exploit commits) and fetches theirs afterwards (its own
  store has every trial's history, as a local sweep's does).

A task returns its exit code and its output; the controller appends the output to the
trial's log, so logs need no shared filesystem. Ray is imported only here, lazily
(``pip install 'vrl[ray]'``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import click

ENV_PREFIXES = ("VRL_", "AWS_", "GOOGLE_", "AZURE_")
"""Variables of the controller's environment a task's command gets too (credentials of the
remote, vrl settings): a worker on another machine does not share the environment."""


def require_ray() -> Any:
    """The ray module, or a one-line error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise click.ClickException("--ray needs Ray: pip install 'vrl[ray]'") from None
    return ray


def connect(address: str) -> Any:
    """Join the cluster at ``address`` (``auto``: the running one; ``local``: start one on
    this machine), unless this process already did (``ray.init`` in a script or test)."""
    ray = require_ray()
    if not ray.is_initialized():
        import threading

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no telemetry unless asked
        # ray.cancel stops a running task with SIGINT: workers of a cluster started here
        # must not inherit an ignored SIGINT (a command in the background of a script)
        ignored = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise click.ClickException(f"--ray {address}: {text}") from None
        finally:
            if ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
    return ray


def run_task(args: list[str], cwd: str, branch: str, env: dict[str, str],
             remote: dict[str, Any] | None) -> tuple[int, str, bool]:
    """The body of one Ray task: run the ``vrl train`` command (``args`` after the
    interpreter) and return (exit code, its output, whether it was stopped). With
    ``remote`` ({"url", "options"}): in a fresh clone, then push ``branch``."""
    command = [sys.executable, *args]  # this worker's interpreter
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    output: list[str] = []
    stopped = False
    with tempfile.TemporaryDirectory(prefix="vrl-task-") as tmp:
        where = cwd
        if remote is not None:
            where = os.path.join(tmp, "clone")
            rc, text = _vrl(["clone", remote["url"], where, "--no-checkout", "--metadata-only",
                             *[w for k, v in remote["options"].items()
                               for w in ("-o", f"{k}={v}")]], tmp, full_env)
            output.append(text)
            if rc != 0:
                return rc, "".join(output), False
            _track(where, branch)
        log = os.path.join(tmp, "out.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, cwd=where, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=full_env,
                                    start_new_session=True, preexec_fn=_stop_with_parent)
            try:
                # polled, not wait(): ray.cancel raises KeyboardInterrupt in this thread,
                # which only happens between bytecodes, never inside a blocking waitpid
                while proc.poll() is None:
                    time.sleep(0.2)
                rc = proc.returncode
            except BaseException:  # ray.cancel: KeyboardInterrupt here; stop it cleanly
                stopped = True
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)  # it commits its last snapshot
                rc = proc.wait()
        with open(log, errors="replace") as f:
            output.append(f.read())
        if remote is not None and _has_branch(where, branch):
            # what it committed goes to the remote even when it failed or was stopped
            prc, text = _vrl(["push", "origin", branch], where, full_env)
            output.append(text)
            if prc != 0 and rc == 0:
                rc = prc
    return rc, "".join(output), stopped


def _stop_with_parent() -> None:
    """In the trial's process (Linux): SIGTERM when the Ray worker dies. Ray kills the
    workers of a driver that is gone (a controller that crashed); a trial left running
    would go on committing to a branch that the next controller resumes."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _vrl(words: list[str], cwd: str, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "vrl", *words], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return proc.returncode, f"# vrl {' '.join(words)}\n{proc.stdout}{proc.stderr}"


def _track(where: str, branch: str) -> None:
    """The trial's branch as a local branch of the clone, where the remote has it (a
    resumed trial, a PBT member)."""
    from vrl import Repo

    repo = Repo(where)
    tip = repo.refs.read(f"refs/remotes/origin/{branch}")
    if tip is not None and repo.refs.read(f"refs/heads/{branch}") is None:
        repo.refs.update(f"refs/heads/{branch}", tip, expected=None,
                         reason=f"task: track origin/{branch}")


def _has_branch(where: str, branch: str) -> bool:
    from vrl import Repo

    return branch in Repo(where).branches()


# ---------------------------------------------------------------------------- controller


def remote_spec(repo: Any, name: str) -> dict[str, Any]:
    """{"url", "options"} of the repository's remote ``name`` (a one-line error if none)."""
    from vrl.remote.config import remotes

    known = remotes(repo)
    if name not in known:
        raise click.ClickException(f"--remote {name}: no such remote (`vrl remote add "
                                   f"{name} URL` first; known: {', '.join(known) or 'none'})")
    entry = dict(known[name])
    url = entry.pop("url")
    return {"url": url, "options": entry}


def push_branches(repo: Any, name: str, branches: list[str]) -> None:
    """Push the controller's branches (PBT members after an exploit: forced, since an
    exploited member's branch jumped to another line on purpose)."""
    from vrl.remote.config import open_named
    from vrl.remote.pushing import push

    local = [b for b in branches if b in repo.branches()]
    if not local:
        return
    store = open_named(repo, name)
    try:
        push(repo, store, name, local, force=True)
    finally:
        store.close()


def fetch_branches(repo: Any, name: str, prefix: str) -> None:
    """Fetch the remote, and move the local branches under ``prefix`` forward to the
    remote's (the trials' commits are there). A local branch that is not behind the
    remote's is left alone: one the remote lacks, or a PBT member whose exploit commit is
    not pushed yet (it left the remote's line on purpose; the next push sends it)."""
    from vrl.remote.common import is_ancestor
    from vrl.remote.config import open_named
    from vrl.remote.fetching import fetch

    store = open_named(repo, name)
    try:
        fetch(repo, store, name)
    finally:
        store.close()
    tracking = f"refs/remotes/{name}/"
    for ref, oid in repo.refs.list(f"{tracking}{prefix}").items():
        local = f"refs/heads/{ref[len(tracking):]}"
        mine = repo.refs.read(local)
        if mine != oid and (mine is None or is_ancestor(repo, mine, oid)):
            repo.refs.update(local, oid, expected=mine,
                             reason=f"{prefix.split('/')[0]}: fast-forward to {name}")


def run_jobs_ray(jobs: list[Any], workers: int, total: int, address: str,
                 remote: str | None, repo: Any, on_end: Any = None) -> list[int]:
    """Like trainer.trials.run_jobs, with each job a Ray task (``workers`` at a time).
    Returns the signals that stopped the run (empty if it ran to the end)."""
    from trainer.trials import report as _report

    ray = connect(address)
    spec = remote_spec(repo, remote) if remote is not None else None
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    task = ray.remote(num_cpus=1, max_retries=0)(run_task)
    pending = list(jobs)
    running: dict[Any, Any] = {}
    stopping: list[int] = []
    cancelled = False
    cwd = os.path.abspath(str(repo.workdir))

    def handler(signum: int, frame: Any) -> None:
        stopping.append(signum)  # the loop cancels the tasks (not from a signal handler)

    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)} \
        if main else {}
    try:
        while running or pending and not stopping:
            while pending and len(running) < workers and not stopping:
                job = pending.pop(0)
                job.started = time.time()
                ref = task.remote(job.args[1:], cwd, job.trial.branch, env, spec)
                running[ref] = job
                verb = "resume" if job.resume else "start"
                click.echo(f"[{job.number}/{total}] {verb:<8}{job.trial.branch}  (ray)")
            if stopping and not cancelled:
                cancelled = True
                for ref, job in running.items():
                    job.stopped = True
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)  # KeyboardInterrupt in the task: it stops its trial
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in ready:
                job = running.pop(ref)
                try:
                    rc, text, stopped = ray.get(ref)
                except Exception as exc:  # cancelled, or the worker died
                    rc, text, stopped = 1, f"ray task failed: {exc}\n", job.stopped
                job.rc, job.ended, job.stopped = rc, time.time(), stopped or job.stopped
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "a") as log:
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    log.write(f"# {when} ray task: vrl {' '.join(job.args[3:])}\n{text}")
                _report(job, total)
                if on_end is not None:
                    on_end(job)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return stopping
