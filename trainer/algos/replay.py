"""GSPO mechanism 3: prioritized replay over the samples of the current rollout.

Minibatch samples are drawn with replacement with probability
``P(i) = p_i^alpha / sum_k p_k^alpha`` and weighted by the importance weight
``w_i = (N * P(i))^-beta / max_j (N * P(j))^-beta`` (Schaul et al. 2016), beta annealed
linearly from ``beta0`` to 1 over the run. A sample's priority is the magnitude of its
loss gradient at the network outputs, ``||dl_i/d(logits_i, value_i)||`` (the per-sample
gradient a full backward would back-propagate), refreshed whenever it is trained on.
Fresh samples start with equal priority, so the first epoch is uniform.
"""

from __future__ import annotations

import torch


class PrioritizedSampler:
    def __init__(self, size: int, alpha: float = 0.6, eps: float = 1e-6,
                 device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None) -> None:
        self.alpha = alpha
        self.eps = eps
        self.generator = generator
        self.priorities = torch.ones(size, device=device)

    def reset(self, size: int | None = None) -> None:
        size = size or self.priorities.numel()
        self.priorities = torch.ones(size, device=self.priorities.device)

    def probabilities(self) -> torch.Tensor:
        scaled = self.priorities ** self.alpha
        return scaled / scaled.sum()

    def sample(self, k: int, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` indices drawn with replacement and their importance weights."""
        probs = self.probabilities()
        idx = torch.multinomial(probs, k, replacement=True, generator=self.generator)
        n = probs.numel()
        weights = (n * probs[idx]) ** (-beta)
        max_weight = (n * probs.min()) ** (-beta)
        return idx, weights / max_weight

    def update(self, idx: torch.Tensor, priorities: torch.Tensor) -> None:
        self.priorities[idx] = priorities.detach().float().abs() + self.eps
