import pytest
import torch

pytest.importorskip("pettingzoo")

from trainer.envs import make_env  # noqa: E402


def test_shared_policy_slots_termination_and_truncation():
    env = make_env("pettingzoo:pz_line_env:make", 2)
    assert (env.num_envs, env.obs_dim, env.num_actions) == (4, 5, 2)
    obs = env.reset(seed=0)
    assert obs[:, 0].tolist() == [1, 1, 1, 1]
    right = torch.ones(4, dtype=torch.long)
    for _ in range(3):
        _, rew, term, trunc, info = env.step(right)
        assert not term.any() and "episodes" not in info
    obs, rew, term, trunc, info = env.step(right)   # "fast" reaches the end
    assert rew.tolist() == [1, 0, 1, 0] and term.tolist() == [True, False, True, False]
    assert info["final_obs"][0, 4] == 1 and not trunc.any()
    _, rew, term, trunc, _ = env.step(right)        # "fast" has left: dummy terminal step
    assert term.tolist() == [True, False, True, False] and rew.tolist() == [0, 0, 0, 0]
    obs, rew, term, trunc, info = env.step(right)   # time limit: "slow" is truncated
    assert trunc.tolist() == [False, True, False, True]
    assert info["final_obs"][1, 0] == 1 and obs[1, 0] == 1  # final obs vs. reset obs
    assert [e["return"] for e in info["episodes"]] == [0.5, 0.5]


def test_trains_through_the_adapter():
    from trainer.config import PPOConfig
    from trainer.train import Trainer

    env = make_env("pettingzoo:pz_line_env:make", 2, env_kwargs={"speeds": (1, 1)})
    cfg = PPOConfig(num_envs=2, num_steps=32, total_steps=4 * 32 * 3, hidden_sizes=[8])
    m = Trainer(env, cfg).train()
    assert m["charts/episodic_length"] <= 6
