"""Observation and reward normalisation inside the trainer (CleanRL's
``ppo_continuous_action.py`` uses Gymnasium's NormalizeObservation and NormalizeReward).

Done here rather than as Gymnasium wrappers so that it works for every env kind (the
warehouse, multi-agent and PettingZoo adapters) and its running statistics are part of
the trainer's state: snapshots hold them, ``--from`` resumes bit-identically, and
evaluation uses the stored statistics frozen.

* observations: ``clip((obs - mean) / sqrt(var + eps), -clip_obs, clip_obs)`` with a
  running per-feature mean/variance over every observation the env returned;
* rewards: ``clip(r / sqrt(var(G) + eps), -clip_reward, clip_reward)`` where
  ``G = G * gamma + r`` is each slot's discounted return, reset when the slot's episode
  ends, and ``var(G)`` its running variance over every slot and step.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.distributed import DistContext

EPS = 1e-8  # Gymnasium's epsilon in both wrappers


class RunningMeanStd:
    """Running mean and (population) variance per feature, float64, merged batch by batch
    with the parallel algorithm of Chan et al. (as Gymnasium's ``RunningMeanStd``, but
    starting from count 0, so the statistics are exactly those of the data seen)."""

    def __init__(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> None:
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = 0.0

    def update(self, batch: torch.Tensor, dist: DistContext | None = None) -> None:
        """Merge the rows of ``batch`` (``(n, *shape)``); under torchrun the rows of every
        rank, so all ranks keep the same statistics."""
        x = batch.detach().to(self.mean.device, torch.float64).reshape(-1, *self.mean.shape)
        n = float(x.shape[0])
        if dist is not None and dist.enabled:
            # sums over all ranks (all_reduce_mean works in float32: fine for statistics)
            sums = torch.cat([torch.tensor([n], dtype=torch.float64, device=x.device),
                              x.sum(0).reshape(-1), (x * x).sum(0).reshape(-1)])
            dist.all_reduce_mean([sums])
            sums = sums * dist.world_size
            n = float(sums[0])
            if n == 0:
                return
            k = self.mean.numel()
            batch_mean = (sums[1:1 + k] / n).reshape(self.mean.shape)
            batch_var = (sums[1 + k:] / n).reshape(self.mean.shape) - batch_mean ** 2
            batch_var = batch_var.clamp_(min=0.0)
        else:
            if n == 0:
                return
            batch_mean = x.mean(0)
            batch_var = x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)
        self.mean = self.mean + delta * (n / total)
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.mean.device
        self.mean = torch.as_tensor(state["mean"]).to(device, torch.float64).clone()
        self.var = torch.as_tensor(state["var"]).to(device, torch.float64).clone()
        self.count = float(state["count"])


def normalize_obs(obs: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                  clip: float) -> torch.Tensor:
    """``clip((obs - mean) / sqrt(var + eps))`` in float64, returned in ``obs``'s dtype."""
    out = (obs.to(mean.device, torch.float64) - mean) / torch.sqrt(var + EPS)
    return out.clamp_(-clip, clip).to(obs.device, obs.dtype)


class Normalizer:
    """The trainer's normalisation state for ``num_envs`` slots of ``obs_dim`` floats.

    ``obs_rms`` is None unless observations are normalised; ``ret_rms`` and ``returns``
    (each slot's discounted return) are None unless rewards are."""

    def __init__(self, num_envs: int, obs_dim: int, *, norm_obs: bool, norm_reward: bool,
                 gamma: float, clip_obs: float, clip_reward: float,
                 device: torch.device, dist: DistContext | None = None) -> None:
        self.gamma, self.clip_obs, self.clip_reward = gamma, clip_obs, clip_reward
        self.dist = dist or DistContext()
        self.obs_rms = RunningMeanStd((obs_dim,), device) if norm_obs else None
        self.ret_rms = RunningMeanStd((), device) if norm_reward else None
        self.returns = (torch.zeros(num_envs, dtype=torch.float64, device=device)
                        if norm_reward else None)

    @property
    def enabled(self) -> bool:
        return self.obs_rms is not None or self.ret_rms is not None

    def observe(self, obs: torch.Tensor, alive: torch.Tensor | None = None) -> None:
        """Merge the env's raw observations (rows of agents that finished excluded)."""
        if self.obs_rms is None:
            return
        self.obs_rms.update(obs if alive is None else obs[alive.to(obs.device)], self.dist)

    def obs(self, obs: torch.Tensor) -> torch.Tensor:
        """What the policy sees: normalised with the current statistics (no update)."""
        if self.obs_rms is None:
            return obs
        return normalize_obs(obs, self.obs_rms.mean, self.obs_rms.var, self.clip_obs)

    def reward(self, reward: torch.Tensor, done: torch.Tensor,
               alive: torch.Tensor | None = None) -> torch.Tensor:
        """Scale one step's rewards and advance each slot's discounted return (reset
        where ``done``); ``alive`` rows (the agents that acted) alone count."""
        if self.ret_rms is None or self.returns is None:
            return reward
        r = reward.to(self.returns.device, torch.float64)
        rows = (torch.ones_like(self.returns, dtype=torch.bool) if alive is None
                else alive.to(self.returns.device))
        self.returns = torch.where(rows, self.returns * self.gamma + r, self.returns)
        self.ret_rms.update(self.returns[rows], self.dist)
        scaled = (r / torch.sqrt(self.ret_rms.var + EPS)).clamp_(-self.clip_reward,
                                                                  self.clip_reward)
        self.returns = torch.where(done.to(self.returns.device), 0.0, self.returns)
        return scaled.to(reward.device, reward.dtype)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.obs_rms is not None:
            state["obs"] = self.obs_rms.state_dict()
        if self.ret_rms is not None and self.returns is not None:
            state["reward"] = {**self.ret_rms.state_dict(), "returns": self.returns.clone()}
        return state

    def load_state_dict(self, state: dict[str, Any] | None, restore_returns: bool = True
                        ) -> None:
        """Restore what ``state`` holds; a part it lacks (an older snapshot, or the option
        was off) starts fresh. ``restore_returns=False``: the episodes start afresh, so do
        the slots' discounted returns."""
        state = state or {}
        if self.obs_rms is not None:
            self.obs_rms = RunningMeanStd(self.obs_rms.mean.shape, self.obs_rms.mean.device)
            if "obs" in state:
                self.obs_rms.load_state_dict(state["obs"])
        if self.ret_rms is not None and self.returns is not None:
            self.ret_rms = RunningMeanStd((), self.ret_rms.mean.device)
            if "reward" not in state:
                self.returns = torch.zeros_like(self.returns)
                return
            self.ret_rms.load_state_dict(state["reward"])
            returns = torch.as_tensor(state["reward"]["returns"])
            if restore_returns and returns.shape == self.returns.shape:
                self.returns = returns.to(self.returns.device, torch.float64).clone()
            else:
                self.returns = torch.zeros_like(self.returns)
