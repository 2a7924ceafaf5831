"""Render one warehouse episode of the shortest-path baseline as text and as a GIF.

    python bench/trainer_render.py [--steps 64]

Writes bench/out/trainer_warehouse_baseline.gif and .txt (needs pillow).
"""

from __future__ import annotations

import argparse

from trainer_common import OUT

from trainer.envs.baseline import ShortestPathPolicy
from trainer.envs.warehouse import WarehouseEnv, record_episode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    env = WarehouseEnv(1)
    policy = ShortestPathPolicy(env)
    OUT.mkdir(parents=True, exist_ok=True)
    texts = record_episode(env, lambda obs: policy.act(), steps=args.steps,
                           gif_path=str(OUT / "trainer_warehouse_baseline.gif"))
    (OUT / "trainer_warehouse_baseline.txt").write_text(
        "\n\n".join(f"t={t}\n{frame}" for t, frame in enumerate(texts)))
    print(texts[-1])


if __name__ == "__main__":
    main()
