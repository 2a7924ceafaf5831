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
    """Both agents learn to walk right: the end is 4 steps away, the time limit is 6, so a
    random policy mostly runs out of time and a trained one arrives in about 4 steps."""
    from trainer.config import PPOConfig
    from trainer.hooks import MetricsRecorder
    from trainer.train import Trainer

    env = make_env("pettingzoo:pz_line_env:make", 2, env_kwargs={"speeds": (1, 1)})
    cfg = PPOConfig(num_envs=2, num_steps=32, total_steps=4 * 32 * 10, hidden_sizes=[8],
                    learning_rate=1e-2, seed=1, num_minibatches=4, update_epochs=4,
                    max_grad_norm=0.5)
    rec = MetricsRecorder()
    Trainer(env, cfg, hooks=[rec]).train()
    lengths = [r["charts/episodic_length"] for r in rec.iterations]
    returns = [r["charts/episodic_return"] for r in rec.iterations]
    assert len(lengths) == 10 and min(lengths) >= 4  # nobody arrives in fewer than 4 steps
    assert lengths[0] > 5.5 and returns[0] < 0.6  # untrained: mostly truncated at 6
    assert sum(lengths[-3:]) / 3 < 4.8 and min(returns[-3:]) > 0.9  # trained: ~4 steps
