"""GSPO = PPO + gradient shaper + adaptive trust radius + prioritized replay.

Each mechanism is switched by its config flag and only replaces one step of PPO's
update loop; with all three off GSPO is PPO with ``clip_coef = epsilon_base``:

* ``backward`` / ``shape_gradients``: :class:`~trainer.algos.shaper.GradientShaper`
* ``clip_coef`` / ``apply_step``: :class:`~trainer.algos.radius.TrustRadius`
* ``minibatches`` / ``after_minibatch``: :class:`~trainer.algos.replay.PrioritizedSampler`
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

from trainer.algos.ppo import PPO
from trainer.algos.radius import TrustRadius
from trainer.algos.replay import PrioritizedSampler
from trainer.algos.shaper import GradientShaper
from trainer.config import GSPOConfig


class GSPO(PPO):
    config: GSPOConfig

    def __init__(self, agent, config: GSPOConfig, precision, dist=None, generator=None) -> None:
        super().__init__(agent, config, precision, dist, generator)
        c = config
        self.shaper = (GradientShaper(agent, c.hessian_interval, c.hessian_probes,
                                      c.shaper_beta, c.shaper_strength, generator)
                       if c.shaper else None)
        self.radius = (TrustRadius(agent, c.epsilon_base, c.epsilon_decay, c.epsilon_min,
                                   c.radius_scale, c.radius_min_scale, c.radius_max_scale,
                                   c.sensitivity_beta) if c.radius else None)
        self.sampler: PrioritizedSampler | None = None
        self.replay_beta = c.replay_beta0
        self._stats: dict[str, list[float]] = {}
        self._output_grads: list[torch.Tensor | None] | None = None

    @property
    def needs_output_grads(self) -> bool:
        return self.sampler is not None

    def _record(self, key: str, value: float) -> None:
        self._stats.setdefault(key, []).append(value)

    # ------------------------------------------------------- radius (and eps)
    @property
    def clip_coef(self) -> float:
        return self.radius.epsilon if self.radius else self.config.epsilon_base

    def apply_step(self, params: list[nn.Parameter]) -> None:
        if self.radius is None:
            return super().apply_step(params)
        self.radius.observe_gradients()
        before = self.radius.snapshot()
        super().apply_step(params)
        self._record("gspo/radius_clipped_fraction", self.radius.project(before))

    # ----------------------------------------------------------------- shaper
    def backward(self, loss: torch.Tensor) -> None:
        self._output_grads = None
        if self.shaper is None or not self.shaper.wants_hessian:
            return super().backward(loss)
        t0 = time.perf_counter()
        scale = float(self.scaler.get_scale()) if self.scaler else 1.0
        scaled = self.scaler.scale(loss) if self.scaler else loss
        extra = list(self.current_outputs.values()) if self.needs_output_grads else []
        # a frozen actor or critic (dirty-layer training) has outputs without gradients
        live = iter(self.shaper.backward_with_hessian(
            scaled, [t for t in extra if t.requires_grad], scale))
        self._output_grads = [next(live) if t.requires_grad else None for t in extra]
        self.dist.all_reduce_mean(list(self.shaper.pending_diag.values()))
        self.shaper.commit_curvature()
        self._record("perf/hessian_s", time.perf_counter() - t0)

    def shape_gradients(self, params: list[nn.Parameter]) -> dict[str, float]:
        if self.shaper is None:
            return {}
        stats = self.shaper.shape()
        for k, v in stats.items():
            self._record(k, v)
        return stats

    # ----------------------------------------------------------------- replay
    def prepare_update(self, batch_size: int, b_advantages: torch.Tensor,
                       progress: float) -> None:
        if not self.config.replay:
            return
        c = self.config
        self.replay_beta = c.replay_beta0 + (1.0 - c.replay_beta0) * progress
        if self.sampler is None or self.sampler.priorities.numel() != batch_size:
            self.sampler = PrioritizedSampler(batch_size, c.replay_alpha, c.replay_eps,
                                              b_advantages.device, self.generator)
        else:
            self.sampler.reset()

    def minibatches(self, batch_size: int, progress: float
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        if self.sampler is None:
            yield from super().minibatches(batch_size, progress)
            return
        mb_size = max(1, batch_size // self.config.num_minibatches)
        idx, weights = self.sampler.sample(mb_size * self.config.num_minibatches,
                                           self.replay_beta)
        # Adam is nearly invariant to the overall weight scale; the spread is what matters
        self._record("gspo/replay_mean_weight", float(weights.mean()))
        self._record("gspo/replay_unique_fraction", idx.unique().numel() / batch_size)
        for start in range(0, idx.numel(), mb_size):
            yield idx[start:start + mb_size], weights[start:start + mb_size]

    def after_minibatch(self, idx: torch.Tensor, weights: torch.Tensor | None,
                        outputs: dict[str, torch.Tensor]) -> None:
        if self.sampler is None:
            return
        if self._output_grads is not None:
            g_logits, g_value = self._output_grads
        else:
            g_logits, g_value = outputs["logits"].grad, outputs["value"].grad
        if g_logits is None and g_value is None:
            return
        # a frozen network (dirty-layer training) contributes no gradient: count it as 0
        if g_logits is None:
            g_logits = torch.zeros_like(outputs["logits"])
        if g_value is None:
            g_value = torch.zeros_like(outputs["value"])
        # undo the minibatch mean, the importance weight and the loss scale so the
        # priority is the sample's own gradient magnitude
        scale = float(self.scaler.get_scale()) if self.scaler else 1.0
        mag = torch.sqrt((g_logits.float() ** 2).sum(-1) + g_value.float() ** 2)
        denom = (weights if weights is not None else 1.0) * scale / idx.numel()
        priority = mag / denom
        if torch.isfinite(priority).all():
            self.sampler.update(idx, priority)

    # ------------------------------------------------------------ bookkeeping
    def end_update(self) -> dict[str, float]:
        out = {k: sum(v) / len(v) for k, v in self._stats.items()}
        self._stats = {}
        out["gspo/epsilon"] = self.clip_coef
        if self.sampler is not None:
            p = self.sampler.priorities
            out["gspo/replay_beta"] = self.replay_beta
            out["gspo/priority_max_over_mean"] = float(p.max() / p.mean())
        if self.radius is not None:
            radii = self.radius.last_radii
            if radii:
                out["gspo/mean_radius"] = sum(radii.values()) / len(radii)
            self.radius.end_iteration()
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.shaper is not None:
            state["shaper"] = self.shaper.state_dict()
        if self.radius is not None:
            state["radius"] = self.radius.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.shaper is not None:
            self.shaper.load_state_dict(state["shaper"])
        if self.radius is not None:
            self.radius.load_state_dict(state["radius"])
