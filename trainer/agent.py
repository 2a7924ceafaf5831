"""Actor-critic MLPs with a shared interface for every environment (CleanRL's ``Agent``).

Discrete actions: a categorical policy over the actor's logits (``ppo.py``). Continuous
actions: a diagonal Gaussian whose mean is the actor's output and whose state-independent
log-std is a learnable parameter of the actor's output layer (``ppo_continuous_action.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant bias, as in the PPO implementation details."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class GaussianHead(nn.Linear):
    """The actor's output layer for continuous actions: a Linear that outputs the mean
    and also owns the state-independent ``log_std`` (zeros at the start).

    Keeping ``log_std`` in the output layer (``actor.N.log_std``) makes it part of that
    layer for everything that works per layer (freezing, trust radii, store statistics),
    and the actor stays an ``nn.Sequential`` whose prefixes can be frozen."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.log_std = nn.Parameter(torch.zeros(out_features))


def mlp(sizes: list[int], out_std: float, head: type[nn.Linear] = nn.Linear) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1], strict=True):
        layers += [layer_init(nn.Linear(a, b)), nn.Tanh()]
    layers.append(layer_init(head(sizes[-2], sizes[-1]), std=out_std))
    return nn.Sequential(*layers)


def sample_categorical(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel-max sampling from our own generator, so eval and logging never shift the
    training RNG stream (needed for exact resume)."""
    u = torch.rand(logits.shape, generator=generator, device=logits.device)
    gumbel = -torch.log(-torch.log(u.clamp_(1e-20, 1.0)))
    return (logits + gumbel).argmax(dim=-1)


HALF_LOG_2PI = 0.5 * float(np.log(2 * np.pi))


def sample_normal(mean: torch.Tensor, std: torch.Tensor, generator: torch.Generator | None
                  ) -> torch.Tensor:
    """``mean + std * N(0, 1)`` from our own generator (see :func:`sample_categorical`);
    a sample, like a categorical one, carries no gradient."""
    noise = torch.randn(mean.shape, generator=generator, device=mean.device)
    return (mean + std * noise).detach()


def normal_logprob_entropy(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-density of ``action`` and entropy of the diagonal Gaussian, each summed over
    the action dimensions (``torch.distributions.Normal``'s, without its checks)."""
    z = (action - mean) * torch.exp(-log_std)
    logprob = (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1)
    entropy = (0.5 + HALF_LOG_2PI + log_std).expand_as(mean).sum(-1)
    return logprob, entropy


def frozen_prefix_depth(net: nn.Sequential) -> int:
    """How many leading modules of ``net`` (input side) have only frozen parameters.

    A parameter-free module (an activation) belongs to the layer before it, so the depth
    of a frozen first Linear in ``Linear, Tanh, Linear, ...`` is 2."""
    depth = 0
    for i, module in enumerate(net):
        params = list(module.parameters())
        if params and any(p.requires_grad for p in params):
            break
        depth = i + 1
    return depth


@dataclass
class PrefixFeatures:
    """Outputs of the frozen input-side prefixes of the actor and the critic for a batch.

    Frozen layers do not change during an update, so their outputs on the rollout are
    computed once (without autograd) and every minibatch of every epoch starts after
    them: the prefix gets no forward recomputation and no backward pass at all."""

    actor: torch.Tensor
    actor_depth: int
    critic: torch.Tensor
    critic_depth: int

    def __getitem__(self, idx: torch.Tensor) -> PrefixFeatures:
        return PrefixFeatures(self.actor[idx], self.actor_depth, self.critic[idx],
                              self.critic_depth)


class Agent(nn.Module):
    """Separate actor and critic MLPs with tanh activations.

    ``continuous=False``: ``num_actions`` discrete actions (categorical policy).
    ``continuous=True``: actions are vectors of ``num_actions`` floats (diagonal Gaussian;
    the actor's last layer is a :class:`GaussianHead`)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_sizes: list[int],
                 continuous: bool = False) -> None:
        super().__init__()
        self.continuous = continuous
        self.critic = mlp([obs_dim, *hidden_sizes, 1], out_std=1.0)
        self.actor = mlp([obs_dim, *hidden_sizes, num_actions], out_std=0.01,
                         head=GaussianHead if continuous else nn.Linear)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1).float()

    @torch.no_grad()
    def encode_frozen_prefix(self, x: torch.Tensor) -> PrefixFeatures | None:
        """The frozen prefixes' outputs on ``x`` (None when neither network has one)."""
        da, dc = frozen_prefix_depth(self.actor), frozen_prefix_depth(self.critic)
        if da == 0 and dc == 0:
            return None
        return PrefixFeatures(self.actor[:da](x), da, self.critic[:dc](x), dc)

    def get_action_and_value(
        self,
        x: torch.Tensor,
        action: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        action_mask: torch.Tensor | None = None,
        features: PrefixFeatures | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns ``action, logprob, entropy, value, logits`` (float32 outside autocast).

        ``action_mask`` (bool, True = legal) gives illegal actions probability 0 (discrete
        actions only). With ``features`` (see :meth:`encode_frozen_prefix`) the networks
        start after their frozen prefixes and ``x`` is not used. For continuous actions
        ``logits`` is the Gaussian's mean (the deterministic action), and ``logprob`` and
        ``entropy`` are summed over the action dimensions."""
        if features is not None:
            logits = self.actor[features.actor_depth:](features.actor).float()
            value = self.critic[features.critic_depth:](features.critic).squeeze(-1).float()
        else:
            logits = self.actor(x).float()
            value = self.get_value(x)
        if self.continuous:
            log_std = self.actor[-1].log_std.float()
            if action is None:
                action = sample_normal(logits, log_std.exp(), generator)
            logprob, entropy = normal_logprob_entropy(logits, log_std, action)
            return action, logprob, entropy, value, logits
        if action_mask is not None:
            # the most negative finite number, not -inf: exp() is exactly 0 and
            # 0 * log_prob stays 0 in the entropy instead of NaN
            logits = logits.masked_fill(~action_mask, torch.finfo(logits.dtype).min)
        log_probs = torch.log_softmax(logits, dim=-1)
        if action is None:
            action = sample_categorical(logits, generator)
        logprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, logprob, entropy, value, logits


def layer_params(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameters grouped by the module that owns them (``actor.0`` -> weight, bias).

    A "layer" is the unit of freezing, trust radii and store statistics.
    """
    groups: dict[str, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        owner = name.rsplit(".", 1)[0] if "." in name else name
        groups.setdefault(owner, []).append(param)
    return groups
