"""The default configuration learns the warehouse within README's budget (slow: about
1.5 minutes of one core; `pytest -m slow tests/trainer/test_learning.py`).
bench/trainer_defaults.py --check runs the same check over several seeds."""

import pytest
import torch

from trainer.config import PPOConfig
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import MetricsRecorder
from trainer.train import Trainer

README_STEPS = 819_200  # README's first command: vrl train --steps 819200


@torch.no_grad()
def random_return(worlds: int) -> float:
    env = WarehouseEnv(worlds, seed=0)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    while True:
        _, _, _, _, info = env.step(torch.randint(env.num_actions, (env.num_envs,),
                                                  generator=gen))
        if info.get("episodes"):
            return sum(ep["return"] for ep in info["episodes"]) / len(info["episodes"])


@pytest.mark.slow
def test_defaults_learn_the_warehouse_within_the_readme_budget():
    cfg = PPOConfig(total_steps=README_STEPS, seed=1)
    rec = MetricsRecorder()
    Trainer(WarehouseEnv(cfg.num_envs, seed=1, gamma=cfg.gamma), cfg, hooks=[rec]).train()
    logged = [m for m in rec.iterations if "env/deliveries" in m]
    first, last = logged[0], logged[-1]
    assert last["env/deliveries"] >= 3 * max(first["env/deliveries"], 1.0)
    baseline = random_return(cfg.num_envs)  # about -5.6
    assert last["charts/episodic_return"] > baseline + 6, (baseline, last)
