"""Vectorised multi-AGV warehouse, batched over environments and agents in torch.

Every tensor lives on ``device``; one ``step`` is a fixed handful of gathers and
scatters over ``(num_envs, num_agents)``, with no Python loop over agents or envs.

Rules, per step and per environment:

1. Each AGV picks stay/up/down/left/right. A move into a shelf, wall or off the grid
   leaves it in place and counts as a wall bump.
2. Swap conflicts (two AGVs trading cells) block both.
3. Vertex conflicts: an AGV may enter a cell only if no AGV stays there and it has the
   lowest index among those entering it; losers stay, which can block AGVs behind them,
   so this repeats until nothing changes. Following into a cell being vacated and
   rotations of three or more AGVs are allowed. Each AGV blocked by another counts as
   one collision.
4. An AGV on its target cell advances its task: at its pick-up it becomes loaded and
   gets a random drop-off; at its drop-off it delivers and gets a random pick-up.
5. Reward per AGV: ``step_cost + pickup_reward*picked + delivery_reward*delivered +
   collision_penalty*blocked + wall_penalty*bumped`` plus optional potential-based
   shaping ``shaping * (gamma * phi(s') - phi(s))`` with ``phi = -BFS distance to target
   / (height + width)``, which leaves optimal policies unchanged (Ng et al. 1999).
6. Episodes never terminate; all envs are truncated together after ``max_steps`` and
   reset, so the learner must bootstrap from ``info["final_obs"]``.

Observation per AGV (flat float32): an egocentric ``(2r+1)^2`` window with three
channels - obstacle (shelf, wall or outside), other AGVs, own target cell - then the
goal vector ``(d_row / height, d_col / width)`` and the loaded flag.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer.envs.layouts import Layout, warehouse_layout

# stay, up, down, left, right as (d_row, d_col)
MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))
ACTION_NAMES = ("stay", "up", "down", "left", "right")
AGV_LETTERS = "abcefghijklmnoqrstuvwxyz"


@dataclass
class WarehouseConfig:
    """Parameters of :class:`WarehouseEnv` (``--set env.<name>=...``)."""

    num_agents: int = 20
    """AGVs per warehouse"""
    max_steps: int = 256
    """time limit per episode (a truncation, never a termination)"""
    view_radius: int = 3
    """observation window is (2r+1) x (2r+1) cells centred on the AGV"""
    delivery_reward: float = 1.0
    """reward for reaching the drop-off while loaded"""
    pickup_reward: float = 0.5
    """reward for reaching the pick-up while empty"""
    step_cost: float = -0.01
    """reward added every step"""
    collision_penalty: float = -0.1
    """reward added when another AGV blocks the move"""
    wall_penalty: float = -0.05
    """reward added when a move hits a shelf or wall"""
    shaping: float = 0.0
    """coefficient of potential-based distance shaping (0: off)"""
    gamma: float = 0.99
    """discount used by the shaping term"""
    layout: list[str] | None = None
    """floor plan rows (see layouts.py); None: the default 26 x 14 warehouse"""
    layout_kwargs: dict[str, int] = field(default_factory=dict)
    """arguments of ``warehouse_layout`` when ``layout`` is None"""


def _bfs(walls: np.ndarray, start: int) -> np.ndarray:
    h, w = walls.shape
    dist = np.full(h * w, h * w, dtype=np.int64)
    dist[start] = 0
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        r, c = divmod(cell, w)
        for dr, dc in MOVES[1:]:
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and not walls[nr, nc]:
                n = nr * w + nc
                if dist[n] > dist[cell] + 1:
                    dist[n] = dist[cell] + 1
                    queue.append(n)
    return dist


class WarehouseEnv:
    """``num_envs`` warehouses of ``num_agents`` AGVs; the batch is envs x agents."""

    def __init__(
        self,
        num_envs: int = 64,
        config: WarehouseConfig | None = None,
        device: str | torch.device = "cpu",
        seed: int = 0,
        **overrides: Any,
    ) -> None:
        cfg = config or WarehouseConfig()
        if overrides:
            unknown = set(overrides) - set(cfg.__dict__)
            if unknown:
                raise ValueError(f"unknown warehouse option(s) {sorted(unknown)}; "
                                 f"known: {sorted(cfg.__dict__)}")
            cfg = WarehouseConfig(**{**cfg.__dict__, **overrides})
        self.cfg = cfg
        self.device = torch.device(device)
        self.layout = (Layout(tuple(cfg.layout)) if cfg.layout
                       else warehouse_layout(**cfg.layout_kwargs))
        lay, dev = self.layout, self.device
        self.height, self.width = lay.height, lay.width
        self.num_cells = self.height * self.width
        self.num_worlds = num_envs
        self.num_agents = cfg.num_agents
        if cfg.num_agents > len(lay.free_cells):
            raise ValueError("more AGVs than free cells")
        self.num_envs = num_envs * cfg.num_agents
        r = cfg.view_radius
        self.window = (2 * r + 1) ** 2
        self.obs_dim = 3 * self.window + 3
        self.num_actions = len(MOVES)

        walls = lay.walls
        h, w = walls.shape
        # next cell for every (cell, action); blocked moves map to the cell itself
        nxt = np.empty((h * w, len(MOVES)), dtype=np.int64)
        for cell in range(h * w):
            row, col = divmod(cell, w)
            for a, (dr, dc) in enumerate(MOVES):
                nr, nc = row + dr, col + dc
                ok = 0 <= nr < h and 0 <= nc < w and not walls[nr, nc]
                nxt[cell, a] = nr * w + nc if ok else cell
        self._next_cell = torch.as_tensor(nxt.reshape(-1), device=dev)
        self._free = torch.as_tensor(lay.free_cells, device=dev)
        self.stations = torch.as_tensor(lay.pickups + lay.dropoffs, device=dev)
        self.num_pickups = len(lay.pickups)
        self.num_dropoffs = len(lay.dropoffs)
        # BFS distance from every station to every cell: shaping and the baseline
        dist = np.stack([_bfs(walls, int(s)) for s in lay.pickups + lay.dropoffs])
        self.station_dist = torch.as_tensor(dist.reshape(-1), device=dev)

        # padded grid so every window is in bounds; outside counts as obstacle
        hp, wp = h + 2 * r, w + 2 * r
        self._padded_cells = hp * wp
        padded = np.ones((hp, wp), dtype=np.float32)
        padded[r:r + h, r:r + w] = walls
        self._padded_walls = torch.as_tensor(padded.reshape(-1), device=dev)
        rows, cols = np.divmod(np.arange(h * w), w)
        self._to_padded = torch.as_tensor((rows + r) * wp + cols + r, device=dev)
        dr, dc = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1), indexing="ij")
        self._offsets = torch.as_tensor((dr * wp + dc).reshape(-1), device=dev)
        self._centre = self.window // 2
        # (row / height, col / width) of every cell, for the goal vector
        self._rc = torch.as_tensor(np.stack([rows / h, cols / w], axis=1), dtype=torch.float32,
                                   device=dev)

        n, e = self.num_agents, self.num_worlds
        self._agent_ids = torch.arange(n, device=dev).expand(e, n)
        self._world_cell0 = (torch.arange(e, device=dev) * self.num_cells).unsqueeze(1)
        self._world_pad0 = (torch.arange(e, device=dev) * self._padded_cells).unsqueeze(1)
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(seed)
        self.pos = torch.zeros((e, n), dtype=torch.long, device=dev)
        self.target = torch.zeros((e, n), dtype=torch.long, device=dev)  # station index
        self.loaded = torch.zeros((e, n), dtype=torch.bool, device=dev)
        self.t = 0
        self._zero_stats()

    # ------------------------------------------------------------------ state
    def _zero_stats(self) -> None:
        e, n, dev = self.num_worlds, self.num_agents, self.device
        self.ep_return = torch.zeros((e, n), device=dev)
        self.ep_deliveries = torch.zeros(e, dtype=torch.long, device=dev)
        self.ep_collisions = torch.zeros(e, dtype=torch.long, device=dev)
        self.ep_wall_bumps = torch.zeros(e, dtype=torch.long, device=dev)

    def _random_stations(self, shape: tuple[int, ...], dropoff: bool) -> torch.Tensor:
        hi = self.num_dropoffs if dropoff else self.num_pickups
        idx = torch.randint(hi, shape, generator=self.generator, device=self.device)
        return idx + self.num_pickups if dropoff else idx

    def _reset_worlds(self) -> None:
        e, n = self.num_worlds, self.num_agents
        # distinct start cells: the first n of a random permutation of free cells
        keys = torch.rand((e, self._free.numel()), generator=self.generator, device=self.device)
        self.pos = self._free[keys.argsort(dim=1)[:, :n]]
        self.target = self._random_stations((e, n), dropoff=False)
        self.loaded = torch.zeros((e, n), dtype=torch.bool, device=self.device)
        self.t = 0
        self._zero_stats()

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self._reset_worlds()
        return self.observe()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically (positions, tasks, RNG, counters)."""
        return {
            "pos": self.pos.clone(), "target": self.target.clone(),
            "loaded": self.loaded.clone(), "t": self.t,
            "generator": self.generator.get_state(),
            "ep_return": self.ep_return.clone(), "ep_deliveries": self.ep_deliveries.clone(),
            "ep_collisions": self.ep_collisions.clone(),
            "ep_wall_bumps": self.ep_wall_bumps.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dev = self.device
        for key in ("pos", "target", "loaded", "ep_return", "ep_deliveries",
                    "ep_collisions", "ep_wall_bumps"):
            value = state[key]
            if value.shape != getattr(self, key).shape:
                raise ValueError(f"warehouse state {key} has shape {tuple(value.shape)}")
            setattr(self, key, value.to(dev).clone())
        self.t = int(state["t"])
        self.generator.set_state(state["generator"].cpu())

    # ------------------------------------------------------------ observation
    @property
    def target_cell(self) -> torch.Tensor:
        return self.stations[self.target]

    def distance_to_target(self) -> torch.Tensor:
        """BFS steps from each AGV to its target, ``(num_envs_worlds, num_agents)``."""
        return self.station_dist[self.target * self.num_cells + self.pos]

    def observe(self) -> torch.Tensor:
        e, n, k = self.num_worlds, self.num_agents, self.window
        ppos = self._to_padded[self.pos]                                 # (E, N)
        win = ppos.unsqueeze(-1) + self._offsets                         # (E, N, K)
        agents = torch.zeros((e, self._padded_cells), device=self.device)
        agents.scatter_(1, ppos, 1.0)
        obs = torch.empty((e, n, self.obs_dim), device=self.device)
        obs[..., :k] = self._padded_walls.expand(e, -1).gather(1, win.view(e, n * k)).view(e, n, k)
        obs[..., k:2 * k] = agents.gather(1, win.view(e, n * k)).view(e, n, k)
        obs[..., k + self._centre] = 0.0                                 # not itself
        tcell = self.target_cell
        obs[..., 2 * k:3 * k] = win == self._to_padded[tcell].unsqueeze(-1)
        obs[..., 3 * k:3 * k + 2] = self._rc[tcell] - self._rc[self.pos]
        obs[..., 3 * k + 2] = self.loaded
        return obs.view(e * n, self.obs_dim)

    # ------------------------------------------------------------------- step
    def resolve_moves(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Apply the movement rules; returns ``new_pos, blocked_by_agent, wall_bump``."""
        e, n = self.num_worlds, self.num_agents
        pos = self.pos
        desired = self._next_cell[pos * len(MOVES) + actions]
        wall_bump = (desired == pos) & (actions != 0)
        gpos = pos + self._world_cell0
        gdes = desired + self._world_cell0
        # swap conflicts: the AGV in my target cell wants my cell
        occupant = torch.full((e * self.num_cells,), -1, dtype=torch.long, device=self.device)
        occupant[gpos.view(-1)] = self._agent_ids.reshape(-1)
        other = occupant[gdes].view(e, n)
        other_des = gdes.gather(1, other.clamp(min=0))
        blocked = (gdes != gpos) & (other >= 0) & (other_des == gpos)
        # vertex conflicts: stayers own their cell (key -1), else the lowest index wins
        for _ in range(n + 1):
            gnew = torch.where(blocked, gpos, gdes)
            moving = gnew != gpos
            key = torch.where(moving, self._agent_ids, -1)
            claim = torch.full((e * self.num_cells,), n, dtype=torch.long, device=self.device)
            claim.scatter_reduce_(0, gnew.view(-1), key.reshape(-1), reduce="amin")
            lost = moving & (claim[gnew] != self._agent_ids)
            if not bool(lost.any()):
                break
            blocked = blocked | lost
        new_pos = torch.where(blocked, pos, desired)
        return new_pos, blocked, wall_bump

    def step(self, actions: torch.Tensor):
        cfg = self.cfg
        e, n = self.num_worlds, self.num_agents
        actions = actions.to(self.device).view(e, n).long()
        if cfg.shaping:
            phi_old = -self.distance_to_target().float() / (self.height + self.width)
        new_pos, blocked, bumped = self.resolve_moves(actions)
        self.pos = new_pos
        arrived = new_pos == self.target_cell
        picked = arrived & ~self.loaded
        delivered = arrived & self.loaded
        self.loaded = self.loaded ^ arrived
        new_drop = self._random_stations((e, n), dropoff=True)
        new_pick = self._random_stations((e, n), dropoff=False)
        self.target = torch.where(picked, new_drop, torch.where(delivered, new_pick, self.target))

        reward = (cfg.step_cost + cfg.pickup_reward * picked + cfg.delivery_reward * delivered
                  + cfg.collision_penalty * blocked + cfg.wall_penalty * bumped)
        if cfg.shaping:
            phi_new = -self.distance_to_target().float() / (self.height + self.width)
            # a finished task resets the potential: use phi of the reached target (0)
            phi_new = torch.where(arrived, torch.zeros_like(phi_new), phi_new)
            reward = reward + cfg.shaping * (cfg.gamma * phi_new - phi_old)
        reward = reward.float()
        self.ep_return += reward
        self.ep_deliveries += delivered.sum(1)
        self.ep_collisions += blocked.sum(1)
        self.ep_wall_bumps += bumped.sum(1)
        self.t += 1

        obs = self.observe()
        info: dict[str, Any] = {"delivered": delivered.view(-1), "blocked": blocked.view(-1)}
        if self.t >= cfg.max_steps:
            truncated = torch.ones(e * n, dtype=torch.bool, device=self.device)
            info["final_obs"] = obs
            info["episodes"] = self.episode_stats()
            self._reset_worlds()
            obs = self.observe()
        else:
            truncated = torch.zeros(e * n, dtype=torch.bool, device=self.device)
        terminated = torch.zeros(e * n, dtype=torch.bool, device=self.device)
        return obs, reward.view(-1), terminated, truncated, info

    def episode_stats(self) -> list[dict[str, float]]:
        """One dict per warehouse for the episode so far (the trainer logs their means)."""
        ret = self.ep_return.mean(1).tolist()
        dlv = self.ep_deliveries.tolist()
        col = self.ep_collisions.tolist()
        bump = self.ep_wall_bumps.tolist()
        n, t = self.num_agents, max(self.t, 1)
        return [{"return": ret[i], "length": float(self.t), "deliveries": float(dlv[i]),
                 "throughput_per_agent": dlv[i] / n / t * 100.0,
                 "collisions": float(col[i]), "wall_bumps": float(bump[i])}
                for i in range(self.num_worlds)]

    def close(self) -> None:
        pass

    # ----------------------------------------------------------------- render
    def render_text(self, world: int = 0) -> str:
        """ASCII frame: shelves ``#``, stations ``P``/``D``, AGVs ``a``, ``b``.. (upper case:
        loaded; the letters d and p are skipped so they never look like stations)."""
        grid = [list(row) for row in self.layout.rows]
        pos = self.pos[world].tolist()
        loaded = self.loaded[world].tolist()
        for i, (cell, full) in enumerate(zip(pos, loaded, strict=True)):
            r, c = divmod(cell, self.width)
            ch = AGV_LETTERS[i % len(AGV_LETTERS)]
            grid[r][c] = ch.upper() if full else ch
        return "\n".join("".join(row) for row in grid)

    def render_rgb(self, world: int = 0, cell_px: int = 16) -> np.ndarray:
        """``(H*cell_px, W*cell_px, 3)`` uint8 frame for GIFs (colours: ``LEGEND``)."""
        colours = {"#": SHELF, ".": AISLE, "P": PICKUP, "D": DROPOFF}
        img = np.zeros((self.height, self.width, 3), dtype=np.uint8)
        for r, row in enumerate(self.layout.rows):
            for c, ch in enumerate(row):
                img[r, c] = colours[ch]
        for cell, full in zip(self.pos[world].tolist(), self.loaded[world].tolist(),
                              strict=True):
            r, c = divmod(cell, self.width)
            img[r, c] = AGV_LOADED if full else AGV_EMPTY
        return np.kron(img, np.ones((cell_px, cell_px, 1), dtype=np.uint8))


SHELF, AISLE, PICKUP, DROPOFF = (90, 90, 90), (245, 245, 245), (150, 200, 255), (255, 210, 140)
AGV_EMPTY, AGV_LOADED = (40, 160, 40), (200, 40, 40)
LEGEND = (("shelf", SHELF), ("aisle", AISLE), ("pick-up", PICKUP), ("drop-off", DROPOFF),
          ("AGV", AGV_EMPTY), ("AGV carrying", AGV_LOADED))
"""What ``render_rgb``'s colours mean, as ``annotate`` draws it under a frame."""


def annotate(frame: np.ndarray, title: str, status: str,
             legend: tuple[tuple[str, tuple[int, int, int]], ...] = ()) -> np.ndarray:
    """``frame`` with ``title`` and ``status`` (e.g. the step counter) above it and a
    colour ``legend`` below, on white (needs pillow); a frame narrower than the title is
    centred on a canvas as wide as it."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=12)  # FreeType's: legible, with real spaces
        pad, line = 4, 16
    except (TypeError, ImportError, OSError):  # an older pillow, or no FreeType
        font, pad, line = ImageFont.load_default(), 4, 14
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    height, width = frame.shape[:2]
    width = max(width, *(int(probe.textlength(text, font=font)) + 2 * pad
                         for text in (title, status)))
    # the legend's entries, wrapped into rows that fit the frame's width
    rows: list[list[tuple[str, tuple[int, int, int], int]]] = [[]]
    x = pad
    for label, colour in legend:
        w = line + 3 + int(probe.textlength(label, font=font)) + 10
        if rows[-1] and x + w > width:
            rows.append([])
            x = pad
        rows[-1].append((label, colour, x))
        x += w
    top = 2 * line + pad
    bottom = (len(rows) * line + pad) if legend else 0
    image = Image.new("RGB", (width, top + height + bottom), (255, 255, 255))
    image.paste(Image.fromarray(frame), ((width - frame.shape[1]) // 2, top))
    draw = ImageDraw.Draw(image)
    for i, text in enumerate((title, status)):
        draw.text((pad, pad // 2 + i * line), text, fill=(0, 0, 0), font=font)
    for r, entries in enumerate(rows):
        y = top + height + pad // 2 + r * line
        for label, colour, x in entries:
            draw.rectangle((x, y + 1, x + line - 4, y + line - 3), fill=colour,
                           outline=(0, 0, 0))
            draw.text((x + line, y), label, fill=(0, 0, 0), font=font)
    return np.asarray(image)


def save_gif(frames: list[np.ndarray], path: str, fps: int = 8) -> None:
    """Write RGB frames as an animated GIF (needs pillow: ``pip install 'vrl[plots]'``)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("saving GIFs needs pillow: pip install 'vrl[plots]'") from exc
    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=1000 // fps, loop=0)


def record_episode(env: WarehouseEnv, act, steps: int | None = None, world: int = 0,
                   gif_path: str | None = None, png_dir: str | None = None,
                   title: str | None = None) -> list[str]:
    """Step ``env`` with ``act(obs) -> actions`` for one episode (or ``steps``); returns the
    text frames of ``world`` and optionally writes a GIF and/or one PNG per frame. With a
    ``title``, each image frame carries it, the step and deliveries so far, and the
    legend (``annotate``)."""
    steps = steps or env.cfg.max_steps

    def image(t: int) -> np.ndarray:
        frame = env.render_rgb(world)
        if title is None:
            return frame
        status = f"step {t}/{steps}   deliveries {int(env.ep_deliveries[world])}"
        return annotate(frame, title, status, LEGEND)

    obs = env.reset()
    texts, frames = [env.render_text(world)], [image(0)]
    for t in range(1, steps):  # the last step would auto-reset; stop before it
        obs, *_ = env.step(act(obs))
        texts.append(env.render_text(world))
        frames.append(image(t))
    if gif_path:
        save_gif(frames, gif_path)
    if png_dir:
        from pathlib import Path

        from PIL import Image

        Path(png_dir).mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(frames):
            Image.fromarray(f).save(Path(png_dir) / f"frame_{i:04d}.png")
    return texts
