"""GSPO mechanism 2: the adaptive exploration radius.

The global epsilon decays once per update iteration (one rollout + its update) and is
floored so a long run cannot collapse it to ~0::

    eps_t = max(eps_min, eps_0 * decay^t)

In GSPO it is also the surrogate clip coefficient. Each layer ``l`` (the parameters of
one module) has a sensitivity, the EMA of its gradient-to-weight norm ratio
``s_l = EMA ||g_l|| / ||w_l||`` (gradient after shaping and norm clipping); sensitive
layers get a smaller radius::

    scale_l = clip(mean_k s_k / s_l, min_scale, max_scale)
    rho_l   = radius_scale * eps_t * scale_l * ||w_l||

and after every optimizer step a layer's update ``dw_l`` is shrunk onto the ball
``||dw_l|| <= rho_l`` if it left it.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.agent import layer_params


class TrustRadius:
    def __init__(self, model: nn.Module, epsilon_base: float = 0.2, epsilon_decay: float = 0.995,
                 epsilon_min: float = 0.05, radius_scale: float = 0.05, min_scale: float = 0.5,
                 max_scale: float = 2.0, beta: float = 0.9) -> None:
        self.model = model
        self.epsilon_base = epsilon_base
        self.epsilon_decay = epsilon_decay
        self.epsilon_min = epsilon_min
        self.radius_scale = radius_scale
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.beta = beta
        self.iterations = 0
        self.sensitivity: dict[str, float] = {}
        self.last_radii: dict[str, float] = {}

    @property
    def epsilon(self) -> float:
        return max(self.epsilon_min, self.epsilon_base * self.epsilon_decay ** self.iterations)

    def _layers(self) -> dict[str, list[nn.Parameter]]:
        return {name: ps for name, ps in layer_params(self.model).items()
                if all(p.requires_grad for p in ps)}

    @staticmethod
    def _norm(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.sqrt(sum((t.float() ** 2).sum() for t in tensors))

    def observe_gradients(self) -> None:
        """Update each layer's sensitivity from its current gradient."""
        for name, ps in self._layers().items():
            grads = [p.grad for p in ps if p.grad is not None]
            if not grads:
                continue
            ratio = float(self._norm(grads) / (self._norm([p.detach() for p in ps]) + 1e-8))
            old = self.sensitivity.get(name)
            self.sensitivity[name] = ratio if old is None else (
                self.beta * old + (1 - self.beta) * ratio)

    def radii(self) -> dict[str, float]:
        """Current radius of every trainable layer, in parameter-norm units."""
        layers = self._layers()
        known = [self.sensitivity[n] for n in layers if n in self.sensitivity]
        mean = sum(known) / len(known) if known else 0.0
        out = {}
        for name, ps in layers.items():
            s = self.sensitivity.get(name)
            scale = 1.0 if not s or not mean else min(self.max_scale,
                                                       max(self.min_scale, mean / s))
            norm = float(self._norm([p.detach() for p in ps]))
            out[name] = self.radius_scale * self.epsilon * scale * norm
        return out

    def snapshot(self) -> dict[str, list[torch.Tensor]]:
        """Weights before the optimizer step (and the radii they imply)."""
        self.last_radii = self.radii()
        return {name: [p.detach().clone() for p in ps] for name, ps in self._layers().items()}

    @torch.no_grad()
    def project(self, before: dict[str, list[torch.Tensor]]) -> float:
        """Pull each layer back inside its radius; returns the fraction of layers clipped."""
        layers = self._layers()
        clipped = 0
        for name, old in before.items():
            ps = layers.get(name)
            if ps is None:
                continue
            deltas = [p.detach() - o for p, o in zip(ps, old, strict=True)]
            norm = float(self._norm(deltas))
            rho = self.last_radii[name]
            if norm > rho:
                shrink = rho / norm
                for p, o, d in zip(ps, old, deltas, strict=True):
                    p.copy_(o + d * shrink)
                clipped += 1
        return clipped / max(len(before), 1)

    def end_iteration(self) -> None:
        self.iterations += 1

    def state_dict(self) -> dict:
        return {"iterations": self.iterations, "sensitivity": dict(self.sensitivity)}

    def load_state_dict(self, state: dict) -> None:
        self.iterations = int(state["iterations"])
        self.sensitivity = {k: float(v) for k, v in state["sensitivity"].items()}
