"""PPO with clipped surrogate, following CleanRL's ``ppo.py``.

The update is written as a loop over epochs and minibatches whose steps are methods
(``minibatches``, ``backward``, ``shape_gradients``, ``apply_step``), so GSPO can
replace single steps without copying the algorithm.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from trainer.agent import Agent
from trainer.config import PPOConfig
from trainer.devices import Precision
from trainer.distributed import DistContext


@dataclass
class RolloutBuffer:
    """Preallocated ``(num_steps, num_envs)`` storage for one rollout.

    ``dones[t]`` is True when the episode ended with the transition taken at ``t``;
    a truncated step's reward already includes ``gamma * V(final_obs)``.
    ``alive[t]`` is False for rows whose agent had already finished (multi-agent envs):
    those samples are left out of the update. ``action_masks`` (legal actions) exists
    only for envs that mask actions. ``actions`` is ``(num_steps, num_envs)`` long for
    discrete actions and ``(num_steps, num_envs, action_dim)`` float for continuous ones
    (the unclipped samples: their log-probabilities are the ones stored).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    values: torch.Tensor
    alive: torch.Tensor
    action_masks: torch.Tensor | None = None

    @classmethod
    def allocate(cls, num_steps: int, num_envs: int, obs_dim: int,
                 device: torch.device, num_actions: int | None = None,
                 action_dim: int | None = None) -> RolloutBuffer:
        """``num_actions`` given: with ``action_masks``; ``action_dim`` given: continuous
        actions of that many floats."""
        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(obs=zeros(num_steps, num_envs, obs_dim),
                   actions=(zeros(num_steps, num_envs, dtype=torch.long) if action_dim is None
                            else zeros(num_steps, num_envs, action_dim)),
                   logprobs=zeros(num_steps, num_envs), rewards=zeros(num_steps, num_envs),
                   dones=zeros(num_steps, num_envs), values=zeros(num_steps, num_envs),
                   alive=torch.ones(num_steps, num_envs, dtype=torch.bool, device=device),
                   action_masks=(None if num_actions is None else torch.ones(
                       num_steps, num_envs, num_actions, dtype=torch.bool, device=device)))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
    Returns ``advantages, returns = advantages + values``.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        nextnonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def ppo_loss(
    newlogprob: torch.Tensor,
    entropy: torch.Tensor,
    newvalue: torch.Tensor,
    mb_logprobs: torch.Tensor,
    mb_advantages: torch.Tensor,
    mb_returns: torch.Tensor,
    mb_values: torch.Tensor,
    *,
    clip_coef: float,
    ent_coef: float,
    vf_coef: float,
    clip_vloss: bool = True,
    norm_adv: bool = True,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-surrogate PPO loss; ``weights`` are per-sample importance weights
    (prioritized replay), None meaning 1."""
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        # http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    if norm_adv and mb_advantages.numel() > 1:
        # (one sample has no spread: its std is NaN, which would make every update of a
        # run with one-sample minibatches a skipped non-finite step - no learning at all)
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    w = torch.ones_like(ratio) if weights is None else weights

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = (w * torch.max(pg_loss1, pg_loss2)).mean()

    # Value loss
    if clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * (w * torch.max(v_loss_unclipped, v_loss_clipped)).mean()
    else:
        v_loss = 0.5 * (w * (newvalue - mb_returns) ** 2).mean()

    entropy_loss = (w * entropy).mean()
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    stats = {"losses/policy_loss": pg_loss.detach(), "losses/value_loss": v_loss.detach(),
             "losses/entropy": entropy_loss.detach(), "losses/old_approx_kl": old_approx_kl,
             "losses/approx_kl": approx_kl, "losses/clipfrac": clipfrac}
    return loss, stats


class PPO:
    """The update half of PPO: owns the optimizer; the trainer collects rollouts."""

    def __init__(
        self,
        agent: Agent,
        config: PPOConfig,
        precision: Precision,
        dist: DistContext | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.agent = agent
        self.config = config
        self.precision = precision
        self.dist = dist or DistContext()
        self.generator = generator
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=config.learning_rate,
                                          eps=config.adam_eps)
        self.scaler = precision.make_scaler()
        self.skipped_steps = 0
        self.optimizer_steps = 0
        self.backward_s = 0.0  # time in backward() during the last update (perf)

    # ----------------------------------------------------------- overridables
    needs_output_grads = False
    """keep d(loss)/d(logits, value) per sample (prioritized replay reads them)"""

    @property
    def clip_coef(self) -> float:
        return self.config.clip_coef

    def trainable_params(self) -> list[nn.Parameter]:
        """Parameters not frozen by an external controller."""
        return [p for p in self.agent.parameters() if p.requires_grad]

    def minibatches(self, batch_size: int, progress: float
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """One epoch of ``(indices, importance_weights)``: a random permutation."""
        mb_size = max(1, batch_size // self.config.num_minibatches)
        device = self.agent_device
        gen = self.generator
        perm = torch.randperm(batch_size, generator=gen,
                              device=gen.device if gen is not None else device).to(device)
        # exactly num_minibatches steps, even when the batch does not divide evenly (the
        # alive samples of a multi-agent rollout), so every rank takes as many steps
        for k in range(min(self.config.num_minibatches, batch_size)):
            yield perm[k * mb_size:(k + 1) * mb_size], None

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def shape_gradients(self, params: list[nn.Parameter]) -> dict[str, float]:
        return {}

    def apply_step(self, params: list[nn.Parameter]) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
        else:
            self.optimizer.step()

    def after_minibatch(self, idx: torch.Tensor, weights: torch.Tensor | None,
                        outputs: dict[str, torch.Tensor]) -> None:
        pass

    def end_update(self) -> dict[str, float]:
        return {}

    # --------------------------------------------------------------- the loop
    @property
    def agent_device(self) -> torch.device:
        return next(self.agent.parameters()).device

    def optimize(self, loss: torch.Tensor) -> tuple[bool, torch.Tensor]:
        """One gradient step; a non-finite gradient skips the step (counted)."""
        self.optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        self.backward(loss)
        self.backward_s += time.perf_counter() - t0
        params = [p for p in self.trainable_params() if p.grad is not None]
        self.dist.average_gradients(params)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        self.shape_gradients(params)
        grad_norm = nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            self.apply_step(params)
            self.optimizer_steps += 1
        else:
            # never apply a NaN/Inf update; the scaler (fp16) lowers its scale instead
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        if self.scaler:
            self.scaler.update()
        return finite, grad_norm

    def update(self, buf: RolloutBuffer, next_value: torch.Tensor, progress: float
               ) -> dict[str, float]:
        """Epochs of minibatch updates on one rollout; ``progress`` in [0, 1) is the
        fraction of the run done (drives LR annealing)."""
        cfg = self.config
        if cfg.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = (1.0 - progress) * cfg.learning_rate

        with torch.no_grad():
            advantages, returns = compute_gae(buf.rewards, buf.values, buf.dones, next_value,
                                              cfg.gamma, cfg.gae_lambda)
        b_obs = buf.obs.reshape(-1, buf.obs.shape[-1])
        b_logprobs = buf.logprobs.reshape(-1)
        b_actions = buf.actions.reshape(-1, *buf.actions.shape[2:])
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = buf.values.reshape(-1)
        b_masks = (None if buf.action_masks is None
                   else buf.action_masks.reshape(-1, buf.action_masks.shape[-1]))
        b_alive = buf.alive.reshape(-1)
        if not bool(b_alive.all()):
            # rows of agents that had finished are not samples: drop them before
            # minibatching, so they reach no loss term, advantage normalisation or statistic
            keep = b_alive.nonzero().squeeze(-1)
            b_obs, b_logprobs, b_actions = b_obs[keep], b_logprobs[keep], b_actions[keep]
            b_advantages, b_returns, b_values = b_advantages[keep], b_returns[keep], b_values[keep]
            b_masks = None if b_masks is None else b_masks[keep]
        batch_size = b_obs.shape[0]
        self.prepare_update(batch_size, b_advantages, progress)

        # Frozen input-side layers (dirty-layer training) do not change during the update:
        # run them once over the rollout; minibatches start after them, so autograd never
        # enters them (no backward, no recomputed forward).
        with self.precision.autocast():
            features = self.agent.encode_frozen_prefix(b_obs)
        self.backward_s = 0.0
        stats_sum: dict[str, torch.Tensor] = {}
        num_mb = 0
        for _epoch in range(cfg.update_epochs):
            for mb_inds, mb_weights in self.minibatches(batch_size, progress):
                with self.precision.autocast():
                    _, newlogprob, entropy, newvalue, logits = self.agent.get_action_and_value(
                        b_obs[mb_inds], b_actions[mb_inds],
                        action_mask=None if b_masks is None else b_masks[mb_inds],
                        features=None if features is None else features[mb_inds])
                outputs = {"logits": logits, "value": newvalue}
                if self.needs_output_grads:
                    for t in outputs.values():
                        if t.requires_grad:  # a fully frozen actor or critic has none
                            t.retain_grad()
                loss, stats = ppo_loss(
                    newlogprob, entropy, newvalue, b_logprobs[mb_inds], b_advantages[mb_inds],
                    b_returns[mb_inds], b_values[mb_inds], clip_coef=self.clip_coef,
                    ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, clip_vloss=cfg.clip_vloss,
                    norm_adv=cfg.norm_adv, weights=mb_weights)
                self.current_outputs = outputs
                _, grad_norm = self.optimize(loss)
                self.after_minibatch(mb_inds, mb_weights, outputs)
                stats["losses/grad_norm"] = grad_norm.detach().float()
                for k, v in stats.items():
                    stats_sum[k] = stats_sum.get(k, 0.0) + v
                num_mb += 1
            if cfg.target_kl is not None and float(stats["losses/approx_kl"]) > cfg.target_kl:
                break

        metrics = {k: float(v) / num_mb for k, v in stats_sum.items()}
        y_pred, y_true = b_values, b_returns
        var_y = torch.var(y_true)
        metrics["losses/explained_variance"] = (
            float("nan") if var_y == 0 else float(1 - torch.var(y_true - y_pred) / var_y))
        metrics["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        metrics["perf/backward_s"] = self.backward_s
        metrics["losses/clip_coef"] = self.clip_coef
        metrics["precision/skipped_steps"] = float(self.skipped_steps)
        if self.scaler:
            metrics["precision/loss_scale"] = float(self.scaler.get_scale())
        metrics.update(self.end_update())
        return metrics

    def prepare_update(self, batch_size: int, b_advantages: torch.Tensor,
                       progress: float) -> None:
        pass

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "skipped_steps": self.skipped_steps,
                 "optimizer_steps": self.optimizer_steps}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.skipped_steps = int(state["skipped_steps"])
        self.optimizer_steps = int(state["optimizer_steps"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
