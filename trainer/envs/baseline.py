"""A classical, non-learned warehouse controller for scale: shortest path with waiting.

Each AGV follows the BFS shortest path to its target. If the next cell is occupied it
waits; after waiting ``patience`` steps in a row it takes a random free move, which
breaks the head-on deadlocks pure waiting runs into in one-lane aisles.
"""

from __future__ import annotations

import torch

from trainer.envs.warehouse import MOVES, WarehouseEnv


class ShortestPathPolicy:
    def __init__(self, env: WarehouseEnv, patience: int = 2, seed: int = 0) -> None:
        self.env = env
        self.patience = patience
        self.generator = torch.Generator(device=env.device)
        self.generator.manual_seed(seed)
        self.waited = torch.zeros((env.num_worlds, env.num_agents), dtype=torch.long,
                                  device=env.device)

    def act(self) -> torch.Tensor:
        """Actions ``(num_worlds * num_agents,)`` for the env's current state."""
        env = self.env
        m = len(MOVES)
        nxt = env._next_cell.view(-1, m)[env.pos]                      # (E, N, 5)
        dist = env.station_dist[env.target.unsqueeze(-1) * env.num_cells + nxt]
        dist[..., 0] += 1  # prefer moving when a move also keeps the distance
        best = dist.argmin(-1)
        at_goal = env.pos == env.target_cell
        best = torch.where(at_goal, torch.zeros_like(best), best)
        # wait if the chosen cell holds another AGV right now
        occupied = torch.zeros((env.num_worlds, env.num_cells), dtype=torch.bool,
                               device=env.device)
        occupied.scatter_(1, env.pos, True)
        target_cell = nxt.gather(-1, best.unsqueeze(-1)).squeeze(-1)
        blocked = occupied.gather(1, target_cell) & (target_cell != env.pos)
        self.waited = torch.where(blocked, self.waited + 1, torch.zeros_like(self.waited))
        action = torch.where(blocked, torch.zeros_like(best), best)
        # random escape among moves into free, unoccupied cells (stay if there is none)
        free = (nxt != env.pos.unsqueeze(-1)) & ~occupied.gather(
            1, nxt.view(env.num_worlds, -1)).view_as(nxt)
        noise = torch.rand(nxt.shape, generator=self.generator, device=env.device)
        rand = torch.where(free, noise + 1.0, noise * 0).argmax(-1)
        stuck = self.waited > self.patience
        action = torch.where(stuck, rand, action)
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
