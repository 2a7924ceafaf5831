"""Stable-Baselines3: snapshot a model's whole training state while it learns, and rebuild
a model from any snapshot that trains on bit-for-bit as the original run did.

    from vrl.integrations.sb3 import SnapshotCallback, load
    model.learn(100_000, callback=SnapshotCallback("runs/ppo", every=10_000))
    model = load("runs/ppo", "HEAD~2")              # HEAD does not move
    model.learn(20_000, reset_num_timesteps=False)

Nothing is pickled: tensors and arrays go through the store, the constructor arguments are
JSON (classes by qualified name, rebuilt from an allow-list only). Stable-Baselines3 is
imported on first use. What is restored, and what is not: docs/loops.md#stable-baselines3.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any

from vrl.errors import VrlError
from vrl.integrations import gym_state, sb3_args
from vrl.integrations.sb3_args import ALGORITHMS
from vrl.repo import Repo
from vrl.rng import rng_state, set_rng_state

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.callbacks import BaseCallback

__all__ = ["SnapshotCallback", "load", "ALGORITHMS"]

HINT = "the Stable-Baselines3 integration needs stable-baselines3: pip install 'vrl[sb3]'"
# what a model carries from one step to the next besides its tensors (those it has)
COUNTERS = ("num_timesteps", "_n_updates", "_episode_num", "_n_calls", "exploration_rate",
            "_current_progress_remaining")


def _sb3() -> Any:
    try:
        import stable_baselines3
    except ImportError as exc:
        raise VrlError(HINT) from exc
    return stable_baselines3


def SnapshotCallback(repo: Repo | str | os.PathLike[str], every: int, *,  # noqa: N802
                     eval_callback: Any = None, replay_buffer: bool = False,
                     **snapshotter: Any) -> BaseCallback:
    """An SB3 `BaseCallback` that commits the model's training state to `repo`.

    Commits every `every` env steps (at the first rollout boundary after each multiple:
    a state training resumes from exactly), after each evaluation of `eval_callback` (an
    `EvalCallback`, passed to `learn` as well; the best one carries the best tag), and
    when training ends. `replay_buffer`: commit an off-policy model's replay buffer too,
    which a bit-exact resume needs. Other keyword arguments go to `vrl.Snapshotter`
    (branch, keep_last, best_tag, committer, ...).
    """
    _sb3()
    return _callback_class()(repo, every, eval_callback, replay_buffer, snapshotter)


@functools.cache
def _callback_class() -> type:
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList
    from stable_baselines3.common.logger import KVWriter

    from vrl.snapshotter import Snapshotter

    class LastValues(KVWriter):  # type: ignore[misc]
        """Keeps what the logger dumps: a dump clears the logger's own values."""

        def __init__(self) -> None:
            self.values: dict[str, Any] = {}

        def write(self, key_values: dict[str, Any], key_excluded: Any, step: int = 0) -> None:
            self.values.update(_numbers(key_values))

        def close(self) -> None:
            pass

    class AfterEval(BaseCallback):  # type: ignore[misc]
        def __init__(self, owner: Any) -> None:
            super().__init__()
            self.owner = owner

        def _on_step(self) -> bool:
            # mid-rollout (inside an env step): the evaluated policy, not a resume point
            self.owner.commit("eval", exact=False)
            return True

    class SnapshotCallback(BaseCallback):  # type: ignore[misc]
        def __init__(self, repo: Any, every: int, eval_callback: Any, replay_buffer: bool,
                     snapshotter: dict[str, Any]) -> None:
            super().__init__()
            if not isinstance(every, int) or every < 1:
                raise VrlError(f"every must be a positive number of steps, not {every!r}")
            self.repo = repo if isinstance(repo, Repo) else Repo(repo)
            self.every, self.replay_buffer = every, replay_buffer
            self.eval_callback, self.options = eval_callback, dict(snapshotter)
            if eval_callback is not None:
                self.options.setdefault("best_metric", "eval/mean_reward")
                hook = AfterEval(self)
                if eval_callback.callback is not None:  # keep the user's own
                    hook = CallbackList([eval_callback.callback, hook])
                eval_callback.callback, hook.parent = hook, eval_callback
            self.snapshotter: Snapshotter | None = None
            self.commits: list[str] = []
            self._values = LastValues()
            self._last = 0
            self._in_rollout = False

        def _init_callback(self) -> None:
            self._last = self.model.num_timesteps
            if self._values not in self.model.logger.output_formats:
                self.model.logger.output_formats.append(self._values)

        def _on_training_start(self) -> None:
            if self.eval_callback is not None and \
                    getattr(self.eval_callback, "model", None) is None:
                raise VrlError("pass the EvalCallback to learn() as well: "
                               "callback=[eval_callback, snapshot_callback]")
            if self.snapshotter is None:
                self.snapshotter = Snapshotter(
                    self.repo, state_fn=lambda: _capture(self.model, self.replay_buffer),
                    hparams=sb3_args.constructor_args(self.model, _env_info(self.model)["id"]),
                    **self.options)

        def _on_rollout_start(self) -> None:
            # the previous update is done and the next rollout not begun: nothing is half
            # way (a rollout buffer, a transition not stored yet), so training resumes here
            # exactly
            self._in_rollout = True
            if self.model.num_timesteps // self.every > self._last // self.every:
                self._last = self.model.num_timesteps
                self.commit("step")

        def _on_rollout_end(self) -> None:
            self._in_rollout = False

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            if self.snapshotter is None:
                return
            try:  # a callback that stopped training mid-rollout: not a resume point
                self.commit("final", exact=not self._in_rollout)
            finally:
                snap, self.snapshotter = self.snapshotter, None
                snap.close()  # every commit written, the best tag moved
                self.commits += snap.commits

        def commit(self, kind: str, exact: bool = True) -> None:
            assert self.snapshotter is not None
            model, algo = self.model, type(self.model).__name__
            step = int(model.num_timesteps)
            metrics = {**self._values.values, **_numbers(model.logger.name_to_value)}
            if kind == "eval":
                reward = float(self.eval_callback.last_mean_reward)
                metrics["eval/mean_reward"] = reward
                message = f"{algo} eval step {step} mean_reward {reward:.4g}"
            else:  # eval values describe an earlier policy
                metrics = {k: v for k, v in metrics.items() if not k.startswith("eval/")}
                message = f"{algo} {'final ' if kind == 'final' else ''}step {step}"
            meta = {"sb3": {"algo": algo, "kind": kind, "exact": exact,
                            "version": _sb3().__version__, "env": _env_info(model)}}
            self.snapshotter.snapshot(step, metrics, message, meta)

    return SnapshotCallback


# ---------------------------------------------------------------------- capture
def _numbers(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (bool, str)):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):  # a video, a figure, an array
            continue
        if math.isfinite(number):
            out[key] = value if isinstance(value, int) else number
    return out


def _capture(model: Any, replay_buffer: bool) -> dict[str, Any]:
    """Everything the next steps of training read: tensors, RNGs, counters, env state."""
    from stable_baselines3.common.save_util import recursive_getattr

    params = model.get_parameters()
    state: dict[str, Any] = {"model": params.pop("policy")}
    if "policy.optimizer" in params:  # (`repo.checkout(rev, model.policy, optimizer)`)
        state["optimizer"] = params.pop("policy.optimizer")
    state["optimizers"] = params
    state["variables"] = {n: recursive_getattr(model, n).detach()
                          for n in model._get_torch_save_params()[1]}
    state["rng"] = rng_state()
    noise = _sde_noise(model)
    if noise is not None:
        state["sde"] = {k: getattr(noise, k).detach().clone() for k in SDE_NOISE}
    counters = {n: getattr(model, n) for n in COUNTERS if hasattr(model, n)}
    counters.update(last_obs=model._last_obs, last_episode_starts=model._last_episode_starts,
                    last_original_obs=getattr(model, "_last_original_obs", None),
                    ep_info_buffer=list(model.ep_info_buffer or ()),
                    ep_success_buffer=list(model.ep_success_buffer or ()))
    state["sb3"] = {k: e for k, v in counters.items() if (e := gym_state.encode(v))
                    is not gym_state.SKIP}
    envs = getattr(model.get_env(), "envs", None)  # a DummyVecEnv's (others: not captured)
    if envs is not None:
        state["env"] = gym_state.capture(envs)
    state["action_space_rng"] = gym_state.encode(getattr(model.action_space, "_np_random",
                                                         None))
    if replay_buffer and getattr(model, "replay_buffer", None) is not None:
        state["replay_buffer"] = gym_state.attributes(model.replay_buffer)
    norm = getattr(model, "_vec_normalize_env", None)
    if norm is not None:  # its running statistics normalise every observation and reward
        rms = getattr(norm, "obs_rms", None)  # (none without norm_obs; a dict for dict obs)
        state["vec_normalize"] = {
            "attrs": gym_state.attributes(norm), "ret_rms": gym_state.attributes(norm.ret_rms),
            "obs_rms": {k: gym_state.attributes(v) for k, v in rms.items()}
            if isinstance(rms, dict) else rms and gym_state.attributes(rms)}
    return state


SDE_NOISE = ("exploration_mat", "exploration_matrices")


def _sde_noise(model: Any) -> Any:
    """The gSDE distribution whose noise matrices the next actions use (None without
    gSDE): the policy's (on-policy algorithms) or its actor's (SAC)."""
    if not getattr(model, "use_sde", False):
        return None
    dist = getattr(_noise_owner(model), "action_dist", None)
    return dist if all(hasattr(dist, k) for k in SDE_NOISE) else None


def _noise_owner(model: Any) -> Any:
    """Whose `reset_noise` a rollout calls: SAC's actor, else the policy."""
    actor = getattr(model, "actor", None)
    return model.policy if actor is None else actor


def _restore_sde_noise(model: Any, saved: dict[str, Any], keep: bool) -> None:
    """Put the committed gSDE noise back; with `keep`, keep it through the next
    `reset_noise`.

    SB3 samples the noise just before a rollout starts, where a periodic commit is taken,
    so that commit holds the RNGs as they are after the sample: the resumed `learn` must use
    the committed noise instead of sampling again, which it would do first thing. (After
    training ended, the next rollout samples anew, as it would have.)"""
    dist = _sde_noise(model)
    if dist is None:
        return
    for key in SDE_NOISE:
        setattr(dist, key, saved[key].clone())
    if not keep:
        return
    owner = _noise_owner(model)

    def skip_once(*args: Any, **kwargs: Any) -> None:
        del owner.reset_noise  # back to the class's method from the next call on

    owner.reset_noise = skip_once


def _restore_vec_normalize(norm: Any, saved: dict[str, Any]) -> None:
    gym_state.set_attributes(norm, saved["attrs"])
    gym_state.set_attributes(norm.ret_rms, saved["ret_rms"])
    rms = getattr(norm, "obs_rms", None)
    for key, value in (saved["obs_rms"] or {}).items() if isinstance(rms, dict) else \
            [(None, saved["obs_rms"])] if rms is not None else []:
        gym_state.set_attributes(rms if key is None else rms[key], value)


def _env_info(model: Any) -> dict[str, Any]:
    env = model.get_env()
    try:
        spec = env.get_attr("spec", indices=[0])[0]
    except Exception:  # noqa: BLE001 - a VecEnv that cannot say: no id is recorded
        spec = None
    info = {"n_envs": env.num_envs, "id": getattr(spec, "id", None)}
    if spec is not None:
        info.update(kwargs=sb3_args.to_json(spec.kwargs),
                    max_episode_steps=spec.max_episode_steps)
    return info


# ---------------------------------------------------------------------- load
def load(repo: Repo | str | os.PathLike[str], rev: str = "HEAD", env: Any = None,
         **kwargs: Any) -> BaseAlgorithm:
    """The SB3 model committed at `rev`, ready to `learn(n, reset_num_timesteps=False)`.

    `env`: the environment to train in; None makes the recorded one (`gymnasium.make`
    with its id and arguments). `kwargs` override recorded constructor arguments (say
    `device="cpu"`, or one that could not be recorded). HEAD does not move.
    """
    sb3 = _sb3()
    repo = repo if isinstance(repo, Repo) else Repo(repo)
    oid = repo.resolve(rev)
    commit = repo.read_commit(oid)
    info = commit.meta.get("sb3")
    if not isinstance(info, dict) or info.get("algo") not in ALGORITHMS:
        raise VrlError(f"{rev} is not a snapshot of a Stable-Baselines3 model "
                       f"({', '.join(ALGORITHMS)})")
    args = sb3_args.rebuild(commit.hparams, kwargs)
    state = repo.load(oid, verify=True)
    if env is None:
        env = _recorded_env(info.get("env") or {}, state.get("vec_normalize"), rev)
    model = getattr(sb3, info["algo"])(env=env, **args)
    _restore(model, state, info.get("exact", True), rev, at_rollout=info.get("kind") == "step")
    return model


def _recorded_env(spec: dict[str, Any], norm: dict[str, Any] | None, rev: str) -> Any:
    """The env the run trained in, as SB3 builds it from a Gymnasium env (in a
    VecNormalize with the run's settings where it had one; the statistics follow)."""
    import gymnasium
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    if not spec.get("id"):
        raise VrlError(f"{rev} records no registered environment id; pass env=")
    make = functools.partial(gymnasium.make, spec["id"],
                             max_episode_steps=spec.get("max_episode_steps"),
                             **sb3_args.from_json(spec.get("kwargs") or {}, "env"))
    env = make_vec_env(make, n_envs=spec.get("n_envs", 1))
    if norm is None:
        return env
    settings = ("training", "norm_obs", "norm_reward", "clip_obs", "clip_reward", "gamma",
                "epsilon", "norm_obs_keys")
    return VecNormalize(env, **{k: v for k, v in gym_state.decode(norm["attrs"]).items()
                                if k in settings})


def _restore(model: Any, state: dict[str, Any], exact: bool, rev: str,
             at_rollout: bool = True) -> None:
    """Put a commit's training state into a model just built with its arguments
    (`at_rollout`: committed as a rollout started, not after training ended)."""
    import torch
    from stable_baselines3.common.save_util import recursive_getattr

    model.policy.load_state_dict(state["model"])
    stored = {**state.get("optimizers", {}), **({"policy.optimizer": state["optimizer"]}
                                                 if "optimizer" in state else {})}
    names, variables = model._get_torch_save_params()
    for name in names:  # the names come from the model, never from the snapshot
        if name == "policy":
            continue
        if name not in stored:
            raise VrlError(f"{rev} holds no state for {name}")
        recursive_getattr(model, name).load_state_dict(_clone(stored[name]))
    with torch.no_grad():
        for name in variables:
            recursive_getattr(model, name).copy_(state["variables"][name])
    saved = gym_state.decode(state.get("sb3", {}))
    for name in COUNTERS:
        if name in saved and hasattr(model, name):
            setattr(model, name, saved[name])
    # (an eval commit is taken inside an env step: its env state is half way, and learn()
    # starts from a reset instead, as where the env cannot be restored)
    vec_env = model.get_env()
    if exact and gym_state.restore(getattr(vec_env, "envs", []), state.get("env")):
        getattr(vec_env, "_reset_seeds", lambda: None)()  # (the run reset long ago)
        model._last_obs = saved.get("last_obs")
        model._last_episode_starts = saved.get("last_episode_starts")
        if hasattr(model, "_last_original_obs"):
            model._last_original_obs = saved.get("last_original_obs")
    elif exact:
        warnings.warn(f"{rev}: the environment's state is not restored (another kind of "
                      "env or VecEnv); training resumes after a reset, not bit-for-bit",
                      stacklevel=3)
    window = model._stats_window_size
    model.ep_info_buffer = deque(saved.get("ep_info_buffer", []), maxlen=window)
    model.ep_success_buffer = deque(saved.get("ep_success_buffer", []), maxlen=window)
    if "replay_buffer" in state and getattr(model, "replay_buffer", None) is not None:
        gym_state.set_attributes(model.replay_buffer, state["replay_buffer"])
    norm = state.get("vec_normalize")
    if norm is not None and model._vec_normalize_env is not None:
        _restore_vec_normalize(model._vec_normalize_env, norm)
    elif norm is not None:
        warnings.warn(f"{rev} was trained in a VecNormalize, and env= has none: "
                      "observations are not normalised as they were", stacklevel=3)
    rng = gym_state.decode(state.get("action_space_rng"))
    if rng is not None:
        model.action_space._np_random = rng
    if exact and "sde" in state:
        _restore_sde_noise(model, state["sde"], keep=at_rollout)
    set_rng_state(state["rng"])  # last: building the model drew from every RNG


def _clone(tree: Any) -> Any:
    """An optimizer state off the store's memory maps (loading it keeps the tensors)."""
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_clone(v) for v in tree)
    return tree.clone() if hasattr(tree, "clone") else tree
