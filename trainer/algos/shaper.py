"""GSPO mechanism 1: the gradient shaper.

Every ``interval`` optimizer steps the diagonal of the loss Hessian is estimated with
Hutchinson probes (Rademacher ``z``; ``E[z * (H z)] = diag H``; ``H z`` by double
backward). Two per-parameter statistics are kept as exponential moving averages:

* curvature      ``h_i = EMA |diag H|_i``
* sign-flip rate ``f_i = EMA 1[sign g_i(t) != sign g_i(t-1)]`` (1 = flips every step)

and every gradient is damped as

    g_i <- g_i / (1 + kappa * f_i * h_i / mean_{j in the same tensor} h_j)

so only parameters that are both oscillating (high ``f``) and stiff relative to their
neighbours (high ``h``) are slowed; flat or steadily moving ones keep their full gradient.
"""

from __future__ import annotations

import torch
from torch import nn


def rademacher(shape: torch.Size, generator: torch.Generator | None,
               device: torch.device) -> torch.Tensor:
    bits = torch.randint(0, 2, shape, generator=generator, device=device)
    return bits.float() * 2 - 1


def hutchinson_diagonal(grads: list[torch.Tensor], params: list[nn.Parameter], probes: int,
                        generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """Estimate ``diag H`` from ``grads`` built with ``create_graph=True``."""
    est = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    for k in range(probes):
        zs = [rademacher(p.shape, generator, p.device) for p in params]
        hz = torch.autograd.grad(grads, params, grad_outputs=[z.to(g.dtype) for z, g in
                                                              zip(zs, grads, strict=True)],
                                 retain_graph=k < probes - 1, allow_unused=True)
        for e, z, h in zip(est, zs, hz, strict=True):
            if h is not None:
                e.add_(z * h.float())
    return [e / probes for e in est]


class GradientShaper:
    """Keeps curvature and sign-flip statistics per parameter and damps gradients."""

    def __init__(self, model: nn.Module, interval: int = 5, probes: int = 1,
                 beta: float = 0.9, strength: float = 1.0,
                 generator: torch.Generator | None = None) -> None:
        self.model = model
        self.interval = interval
        self.probes = probes
        self.beta = beta
        self.strength = strength
        self.generator = generator
        self.steps = 0
        self.curvature: dict[str, torch.Tensor] = {}
        self.flip_rate: dict[str, torch.Tensor] = {}
        self.prev_sign: dict[str, torch.Tensor] = {}

    def _named(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    @property
    def wants_hessian(self) -> bool:
        return self.steps % self.interval == 0

    def backward_with_hessian(self, loss: torch.Tensor, extra_inputs: list[torch.Tensor] = (),
                              scale: float = 1.0) -> list[torch.Tensor | None]:
        """Backward that also updates the curvature EMA; sets ``p.grad`` like
        ``loss.backward()`` and returns the gradients of ``extra_inputs``. ``scale`` is
        the loss scale of fp16 training, divided out of the Hessian estimate."""
        named = self._named()
        params = [p for _, p in named]
        grads = torch.autograd.grad(loss, params + list(extra_inputs), create_graph=True,
                                    allow_unused=True)
        pgrads, extra = list(grads[:len(params)]), list(grads[len(params):])
        used = [(n, p, g) for (n, p), g in zip(named, pgrads, strict=True) if g is not None]
        diag = hutchinson_diagonal([g for *_, g in used], [p for _, p, _ in used],
                                   self.probes, self.generator)
        self.pending_diag = {n: d / scale for (n, _, _), d in zip(used, diag, strict=True)}
        for _, p, g in used:
            p.grad = g.detach()
        return [None if g is None else g.detach() for g in extra]

    def commit_curvature(self) -> None:
        """Fold the pending (possibly all-reduced) Hessian estimate into the EMA."""
        for name, d in getattr(self, "pending_diag", {}).items():
            h = d.abs()
            old = self.curvature.get(name)
            self.curvature[name] = h if old is None else self.beta * old + (1 - self.beta) * h
        self.pending_diag = {}

    def shape(self) -> dict[str, float]:
        """Update flip statistics from the current gradients and damp them in place."""
        self.steps += 1
        damped, total, factor_sum = 0, 0, 0.0
        for name, p in self._named():
            if p.grad is None:
                continue
            sign = torch.sign(p.grad)
            prev = self.prev_sign.get(name)
            flipped = (torch.zeros_like(sign) if prev is None
                       else (sign * prev < 0).float())
            rate = self.flip_rate.get(name)
            rate = (1 - self.beta) * flipped if rate is None else (
                self.beta * rate + (1 - self.beta) * flipped)
            self.flip_rate[name] = rate
            self.prev_sign[name] = sign
            h = self.curvature.get(name)
            if h is None:
                continue
            relative = h / (h.mean() + 1e-12)
            factor = 1.0 / (1.0 + self.strength * rate * relative)
            p.grad.mul_(factor.to(p.grad.dtype))
            damped += int((factor < 0.9).sum())
            total += factor.numel()
            factor_sum += float(factor.sum())
        if total == 0:
            return {}
        return {"gspo/damped_fraction": damped / total, "gspo/mean_damping": factor_sum / total}

    def state_dict(self) -> dict:
        return {"steps": self.steps, "curvature": dict(self.curvature),
                "flip_rate": dict(self.flip_rate), "prev_sign": dict(self.prev_sign)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.curvature = {k: v.clone() for k, v in state["curvature"].items()}
        self.flip_rate = {k: v.clone() for k, v in state["flip_rate"].items()}
        self.prev_sign = {k: v.clone() for k, v in state["prev_sign"].items()}
