import numpy as np
import pytest

from trainer.config import load_config
from trainer.hooks import MetricsRecorder
from trainer.train import Trainer

pytest.importorskip("gymnasium")


def test_cartpole_ppo_improves_return():
    from trainer.envs.gym_adapter import GymVecEnv

    cfg = load_config("ppo", preset="cleanrl", overrides=["total_steps=24576", "seed=1"])
    rec = MetricsRecorder()
    trainer = Trainer(GymVecEnv("CartPole-v1", cfg.num_envs), cfg, hooks=[rec])
    trainer.train()
    returns = [m["charts/episodic_return"] for m in rec.iterations
               if "charts/episodic_return" in m]
    early, late = np.mean(returns[:3]), np.mean(returns[-3:])
    assert early < 40  # a random CartPole policy lasts ~22 steps
    assert late > 2 * early and late > 60, (early, late)


def test_gym_adapter_final_obs_and_episodes():
    import torch

    from trainer.envs.gym_adapter import GymVecEnv

    env = GymVecEnv("CartPole-v1", 2)
    obs = env.reset(seed=0)
    assert obs.shape == (2, 4) and env.num_actions == 2
    ended = []
    for _ in range(200):
        obs, reward, term, trunc, info = env.step(torch.zeros(2, dtype=torch.long))
        if term.any():
            i = int(term.nonzero()[0])
            # pole fell: the final observation is out of bounds, the new one is a reset
            assert abs(info["final_obs"][i, 2]) > 0.2 or abs(info["final_obs"][i, 0]) > 2.4
            assert abs(obs[i]).max() < 0.06
            ended.extend(info["episodes"])
            break
    assert ended and ended[0]["length"] == ended[0]["return"]
