"""Warehouse floor plans as text.

``#`` shelf or wall, ``.`` aisle, ``P`` pick-up station, ``D`` drop-off station.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layout:
    """A parsed floor plan. Cells are numbered row-major: ``cell = row * width + col``."""

    rows: tuple[str, ...]

    def __post_init__(self) -> None:
        widths = {len(r) for r in self.rows}
        if len(widths) != 1:
            raise ValueError("layout rows must all have the same width")
        bad = set("".join(self.rows)) - set("#.PD")
        if bad:
            raise ValueError(f"unknown layout characters {sorted(bad)}")
        if not self.pickups or not self.dropoffs:
            raise ValueError("a layout needs at least one P and one D cell")

    @classmethod
    def from_text(cls, text: str) -> Layout:
        return cls(tuple(line.strip() for line in text.strip().splitlines() if line.strip()))

    @property
    def height(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return len(self.rows[0])

    def _cells(self, chars: str) -> list[int]:
        return [r * self.width + c for r, row in enumerate(self.rows) for c, ch in enumerate(row)
                if ch in chars]

    @property
    def walls(self) -> np.ndarray:
        """``(height, width)`` bool: True where AGVs cannot go."""
        return np.array([[ch == "#" for ch in row] for row in self.rows], dtype=bool)

    @property
    def free_cells(self) -> list[int]:
        return self._cells(".PD")

    @property
    def pickups(self) -> list[int]:
        return self._cells("P")

    @property
    def dropoffs(self) -> list[int]:
        return self._cells("D")


def warehouse_layout(
    blocks_x: int = 4, blocks_y: int = 3, block_w: int = 4, block_h: int = 2, margin: int = 2,
    aisle: int = 2,
) -> Layout:
    """Shelf blocks separated by aisles, with a margin of aisle around them.

    Aisles between blocks are ``aisle`` cells wide. Pick-up stations are the aisle cells
    just above and below the middle of each shelf block; drop-off stations are every
    other cell of the left and right outer columns.
    The default is 26 x 14: two-lane aisles, 96 shelf cells, 24 pick-ups, 12 drop-offs.
    """
    inner_w = blocks_x * block_w + (blocks_x - 1) * aisle
    inner_h = blocks_y * block_h + (blocks_y - 1) * aisle
    width, height = inner_w + 2 * margin, inner_h + 2 * margin
    grid = [["."] * width for _ in range(height)]
    for by in range(blocks_y):
        for bx in range(blocks_x):
            top = margin + by * (block_h + aisle)
            left = margin + bx * (block_w + aisle)
            for r in range(top, top + block_h):
                for c in range(left, left + block_w):
                    grid[r][c] = "#"
            mid = left + block_w // 2
            grid[top - 1][mid - 1] = "P"
            grid[top + block_h][mid] = "P"
    for r in range(1, height - 1, 2):
        grid[r][0] = "D"
        grid[r][width - 1] = "D"
    return Layout(tuple("".join(row) for row in grid))
