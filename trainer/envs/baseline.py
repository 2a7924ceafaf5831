"""A classical, non-learned warehouse controller for scale: shortest path with waiting.

Each AGV moves along a BFS shortest path to its target, choosing at random among the
moves that shorten the distance (spreads traffic over parallel aisles). If that cell
holds another AGV it waits; after ``patience`` consecutive waits it takes a random move
into a free cell, which breaks some of the head-on deadlocks of one-lane aisles.
"""

from __future__ import annotations

import torch

from trainer.envs.warehouse import MOVES, WarehouseEnv


class ShortestPathPolicy:
    def __init__(self, env: WarehouseEnv, patience: int = 1, seed: int = 0) -> None:
        self.env = env
        self.patience = patience
        self.generator = torch.Generator(device=env.device)
        self.generator.manual_seed(seed)
        self.waited = torch.zeros((env.num_worlds, env.num_agents), dtype=torch.long,
                                  device=env.device)

    def _noise(self, shape: torch.Size) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, device=self.env.device)

    def act(self) -> torch.Tensor:
        """Actions ``(num_worlds * num_agents,)`` for the env's current state."""
        env = self.env
        e, m = env.num_worlds, len(MOVES)
        nxt = env._next_cell.view(-1, m)[env.pos]                      # (E, N, 5)
        dist = env.station_dist[env.target.unsqueeze(-1) * env.num_cells + nxt]
        here = env.distance_to_target().unsqueeze(-1)
        closer = dist < here
        best = torch.where(closer, self._noise(nxt.shape) + 1.0,
                           torch.zeros(nxt.shape, device=env.device)).argmax(-1)
        occupied = torch.zeros((e, env.num_cells), dtype=torch.bool, device=env.device)
        occupied.scatter_(1, env.pos, True)
        next_cell = nxt.gather(-1, best.unsqueeze(-1)).squeeze(-1)
        blocked = occupied.gather(1, next_cell) & (next_cell != env.pos)
        self.waited = torch.where(blocked, self.waited + 1, torch.zeros_like(self.waited))
        action = torch.where(blocked, torch.zeros_like(best), best)
        # random escape among moves into free, unoccupied cells (stay if there is none)
        free = (nxt != env.pos.unsqueeze(-1)) & ~occupied.gather(1, nxt.view(e, -1)).view_as(nxt)
        noise = self._noise(nxt.shape)
        escape = torch.where(free, noise + 1.0, noise * 0).argmax(-1)
        stuck = self.waited > self.patience
        action = torch.where(stuck, escape, action)
        self.waited = torch.where(stuck, torch.zeros_like(self.waited), self.waited)
        return action.reshape(-1)


def run_baseline(env: WarehouseEnv, seed: int = 0, episodes: int = 1) -> list[dict[str, float]]:
    """Run whole episodes in every warehouse of ``env``; returns their statistics."""
    policy = ShortestPathPolicy(env, seed=seed)
    env.reset(seed=seed)
    stats: list[dict[str, float]] = []
    while len(stats) < episodes * env.num_worlds:
        _, _, _, _, info = env.step(policy.act())
        stats.extend(info.get("episodes", ()))
    return stats
