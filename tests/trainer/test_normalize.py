"""Observation and reward normalisation (norm_obs / norm_reward): the running statistics,
what reaches the policy and the buffer, the reward scale, exact resume, evaluation with
the stored statistics, and learning (CleanRL's ppo_continuous_action.py wrappers)."""

import box_env  # noqa: F401 - registers the TargetBox-v0 family
import numpy as np
import pytest
import torch
from helpers import assert_same
from test_trainer import small_warehouse_trainer

from trainer.config import PPOConfig
from trainer.distributed import DistContext
from trainer.envs import make_env
from trainer.normalize import EPS, Normalizer, RunningMeanStd
from trainer.train import Trainer
from vrl import Repo
from vrl.cli import main


def test_running_statistics_equal_numpys_over_the_same_data():
    rng = np.random.default_rng(0)
    data = rng.normal([3.0, -200.0, 0.01], [1.0, 50.0, 0.001], size=(1000, 3))
    rms = RunningMeanStd((3,))
    start = 0
    for size in (1, 2, 7, 100, 1, 389, 500):  # uneven batches, single rows included
        rms.update(torch.as_tensor(data[start:start + size], dtype=torch.float32))
        start += size
        seen = data[:start].astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(rms.mean.numpy(), seen.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(rms.var.numpy(), seen.var(0), rtol=1e-9)
        assert rms.count == start
    rms.update(torch.zeros(0, 3))  # an empty batch (every agent finished) changes nothing
    assert rms.count == start


class TwoRanks(DistContext):
    """Rank 0 of two; the other rank's observation batches are given (its all-reduce
    contribution is computed from them)."""

    def __init__(self, others):
        super().__init__(rank=0, world_size=2)
        object.__setattr__(self, "others", list(others))

    def all_reduce_mean(self, tensors):
        (t,) = tensors
        x = self.others.pop(0).double()
        theirs = torch.cat([torch.tensor([float(len(x))], dtype=torch.float64), x.sum(0),
                            (x * x).sum(0)])
        t.copy_((t + theirs) / 2)


def test_under_torchrun_every_rank_merges_the_batches_of_all_ranks():
    rng = np.random.default_rng(1)
    mine = [rng.normal(5, 2, (n, 2)) for n in (3, 0, 5)]
    theirs = [rng.normal(-1, 3, (n, 2)) for n in (4, 2, 0)]
    rms = RunningMeanStd((2,))
    dist = TwoRanks([torch.as_tensor(b) for b in theirs])
    for batch in mine:
        rms.update(torch.as_tensor(batch), dist)
    seen = np.concatenate(mine + theirs)
    np.testing.assert_allclose(rms.mean.numpy(), seen.mean(0), rtol=1e-6)
    np.testing.assert_allclose(rms.var.numpy(), seen.var(0), rtol=1e-5)
    assert rms.count == len(seen)


class RampEnv:
    """One slot; observation t * [1, 100] + [5, -300] (far from zero mean, unit scale);
    reward r_t = t; the episode is truncated every third step (final_obs = [7, 7])."""

    num_envs, obs_dim, num_actions = 1, 2, 2
    device = torch.device("cpu")

    def __init__(self, rewards=None):
        self.rewards = rewards

    def _obs(self):
        return torch.tensor([[5.0 + self.t, -300.0 + 100.0 * self.t]])

    def reset(self, seed=None):
        self.t = 0
        return self._obs()

    def step(self, actions):
        self.t += 1
        end = self.t % 3 == 0
        info = {"final_obs": torch.full((1, 2), 7.0)} if end else {}
        if end:
            info["episodes"] = [{"return": 0.0, "length": 3.0}]
        reward = float(self.t) if self.rewards is None else self.rewards[self.t - 1]
        return (self._obs(), torch.tensor([reward]), torch.tensor([False]),
                torch.tensor([end]), info)

    def close(self):
        pass


def _ramp_trainer(**kw):
    cfg = PPOConfig(num_envs=1, num_steps=6, total_steps=12, hidden_sizes=[4],
                    num_minibatches=2, **kw)
    return Trainer(RampEnv(), cfg)


def _normalised(rows, x, clip=10.0):
    seen = np.asarray(rows, dtype=np.float64)
    return np.clip((np.asarray(x) - seen.mean(0)) / np.sqrt(seen.var(0) + EPS), -clip, clip)


def test_normalised_observations_reach_the_policy_the_buffer_and_the_bootstrap():
    trainer = _ramp_trainer(norm_obs=True)
    seen = []
    policy_input = trainer.agent.get_action_and_value

    def spy(x, *args, **kwargs):
        seen.append(x.clone())
        return policy_input(x, *args, **kwargs)

    trainer.agent.get_action_and_value = spy
    trainer.collect_rollout()
    raw = [[5.0 + t, -300.0 + 100.0 * t] for t in range(7)]
    for t in range(6):
        # normalised by the statistics of every observation up to and including it
        expected = _normalised(raw[:t + 1], raw[t])
        np.testing.assert_allclose(trainer.buffer.obs[t, 0].numpy(), expected, rtol=1e-6,
                                   atol=1e-6)
        assert torch.equal(seen[t], trainer.buffer.obs[t])
    assert float(trainer.buffer.obs.abs().max()) <= 10.0
    # truncated at step 2: bootstrapped with V of the *normalised* final observation
    final = torch.as_tensor(_normalised(raw[:4], [7.0, 7.0]), dtype=torch.float32)
    v_final = trainer.agent.get_value(final.reshape(1, 2)).item()
    assert trainer.buffer.rewards[2, 0].item() == pytest.approx(3 + 0.99 * v_final, rel=1e-5)
    assert torch.equal(trainer.next_obs, torch.tensor([raw[6]]))  # next_obs stays raw
    # the update's value of the next observation also normalises it
    assert trainer.normalizer.obs_rms.count == 7


def test_reward_scale_matches_a_hand_computation_with_an_episode_end():
    gamma = 0.9
    norm = Normalizer(1, 1, norm_obs=False, norm_reward=True, gamma=gamma, clip_obs=10,
                      clip_reward=10, device=torch.device("cpu"))
    rewards = [1.0, 2.0, -3.0, 4.0, 0.5]
    dones = [False, True, False, False, True]
    returns, seen, out = 0.0, [], []
    for r, d in zip(rewards, dones, strict=True):
        out.append(float(norm.reward(torch.tensor([r]), torch.tensor([d]))[0]))
        returns = returns * gamma + r
        seen.append(returns)
        expected = r / np.sqrt(np.var(seen) + EPS)
        assert out[-1] == pytest.approx(float(np.clip(expected, -10, 10)), rel=1e-6)
        if d:
            returns = 0.0
    # the discounted returns by hand: 1, 2.9 | -3, 1.3, 1.67 (reset after each end)
    np.testing.assert_allclose(seen, [1.0, 2.9, -3.0, 1.3, 1.67])
    assert out[0] == 10.0  # the first step has no spread yet: clipped
    assert norm.returns.tolist() == [0.0]


def test_reward_normalisation_reaches_the_buffer_not_the_logged_returns():
    trainer = _ramp_trainer(norm_reward=True, gamma=0.5)
    metrics = trainer.train(iterations=1)
    assert metrics["charts/episodic_return"] == 0.0  # the env's own figure, unscaled
    returns, seen, expected = 0.0, [], []
    for t in range(1, 7):
        returns = returns * 0.5 + t
        seen.append(returns)
        expected.append(np.clip(t / np.sqrt(np.var(seen) + EPS), -10, 10))
        if t % 3 == 0:
            returns = 0.0
    rewards = trainer.buffer.rewards[:, 0].numpy().astype(np.float64)
    bootstrapped = [2, 5]  # truncations add gamma * V(final_obs)
    keep = [t for t in range(6) if t not in bootstrapped]
    np.testing.assert_allclose(rewards[keep], np.asarray(expected)[keep], rtol=1e-6)


def test_multi_agent_rows_of_finished_agents_do_not_count():
    norm = Normalizer(3, 2, norm_obs=True, norm_reward=True, gamma=0.9, clip_obs=10,
                      clip_reward=10, device=torch.device("cpu"))
    alive = torch.tensor([True, False, True])
    norm.observe(torch.tensor([[1.0, 2.0], [100.0, 100.0], [3.0, 4.0]]), alive)
    assert norm.obs_rms.mean.tolist() == [2.0, 3.0] and norm.obs_rms.count == 2
    norm.reward(torch.tensor([1.0, 50.0, 3.0]), torch.zeros(3, dtype=torch.bool), alive)
    assert norm.returns.tolist() == [1.0, 0.0, 3.0] and norm.ret_rms.count == 2


def test_without_normalisation_the_state_and_rollout_are_unchanged():
    """Defaults off: nothing normalised, and a snapshot from before normalisation (no
    `normalizer` key) loads, as fresh statistics where the options are turned on."""
    plain = small_warehouse_trainer()
    assert plain.state_dict()["normalizer"] == {}
    first_obs = plain.next_obs.clone()
    plain.collect_rollout()
    assert torch.equal(plain.buffer.obs[0], first_obs)  # the env's observations as they are
    old = plain.state_dict()
    del old["normalizer"]
    turned_on = small_warehouse_trainer(norm_obs=True, norm_reward=True)
    turned_on.train(iterations=1)
    turned_on.load_state_dict(old)
    # fresh: the statistics of the restored observation alone
    assert turned_on.normalizer.obs_rms.count == turned_on.env.num_envs
    torch.testing.assert_close(turned_on.normalizer.obs_rms.mean,
                               old["next_obs"].double().mean(0))
    assert turned_on.normalizer.ret_rms.count == 0
    assert turned_on.normalizer.returns.tolist() == [0.0] * turned_on.env.num_envs
    turned_on.train(iterations=1)
    assert turned_on.normalizer.obs_rms.count > 0


def test_trainer_evaluation_uses_the_statistics_without_updating_them():
    trainer = _ramp_trainer(norm_obs=True)
    trainer.eval_env = RampEnv()
    trainer.train(iterations=1)
    before = trainer.normalizer.state_dict()
    seen = []
    policy_input = trainer.agent.get_action_and_value
    trainer.agent.get_action_and_value = lambda x, *a, **k: (seen.append(x.clone()),
                                                             policy_input(x, *a, **k))[1]
    trainer.evaluate(num_episodes=1)
    assert_same(before, trainer.normalizer.state_dict())
    stats = trainer.normalizer.obs_rms
    raw = torch.tensor([[5.0, -300.0]], dtype=torch.float64)
    expected = ((raw - stats.mean) / torch.sqrt(stats.var + EPS)).float()
    torch.testing.assert_close(seen[0], expected)


def test_a_one_step_continuous_task_is_learned_with_normalised_rewards():
    """The target task of test_continuous with rewards scaled by their running std (and
    observations normalised): it is still learned, the logged returns unscaled."""
    env = make_env("gym:box_env:TargetBox-v0", 8)
    cfg = PPOConfig(num_envs=8, num_steps=32, total_steps=8 * 32 * 20, hidden_sizes=[16],
                    num_minibatches=4, update_epochs=4, learning_rate=1e-2, ent_coef=0.0,
                    seed=3, norm_reward=True, norm_obs=True)
    trainer = Trainer(env, cfg)
    first = trainer.train(iterations=1)["charts/episodic_return"]
    last = trainer.train()["charts/episodic_return"]
    assert first < -0.9 and last > -0.15, (first, last)
    assert trainer.normalizer.ret_rms.count == 8 * 32 * 20


# ------------------------------------------------------------------ snapshots and eval
PENDULUM = ["--env", "gym:Pendulum-v1", "--set", "num_envs=2", "--set", "num_steps=32",
            "--set", "hidden_sizes=[8]", "--set", "num_minibatches=2", "--set",
            "update_epochs=2", "--set", "norm_obs=true", "--set", "norm_reward=true",
            "--no-progress", "--device", "cpu"]


def test_snapshots_hold_the_statistics_and_eval_uses_them(ws, capsys):
    from trainer.eval import _actor, evaluate, run_episodes

    main(["init"])
    assert main(["train", *PENDULUM, "--steps", "256", "--iterations", "2",
                 "--branch", "p"]) == 0
    for branch in ("a", "b"):  # --from resumes the statistics: bit-identical twice
        assert main(["train", "--from", "p", "--steps", "256", "--branch", branch,
                     "--no-progress", "--device", "cpu"]) == 0
    repo = Repo(ws)
    p, a, b = repo.load("p"), repo.load("a"), repo.load("b")
    assert float(p["normalizer"]["obs"]["count"]) == 2 * (2 * 32 + 1)
    assert_same(a["normalizer"], b["normalizer"])
    assert_same(a["model"], b["model"])
    assert float(a["normalizer"]["obs"]["count"]) > float(p["normalizer"]["obs"]["count"])
    # eval: the stored statistics, frozen; the same as normalising by hand
    result = evaluate(repo, "a", episodes=1, greedy=True, seed=1)
    from trainer.agent import Agent

    env = make_env("gym:Pendulum-v1", 1, seed=1)
    agent = Agent(3, 1, [8], continuous=True)
    agent.load_state_dict({k: torch.as_tensor(v) for k, v in a["model"].items()})
    mean = torch.as_tensor(a["normalizer"]["obs"]["mean"])
    var = torch.as_tensor(a["normalizer"]["obs"]["var"])
    by_hand = run_episodes(env, _actor(agent, True, 1, torch.device("cpu"), lambda o: (
        ((o.double() - mean) / torch.sqrt(var + EPS)).clamp(-10, 10).float())), 1, 1)
    unnormalised = run_episodes(make_env("gym:Pendulum-v1", 1, seed=1),
                                _actor(agent, True, 1, torch.device("cpu")), 1, 1)
    assert result.policy["return"] == pytest.approx(by_hand[0]["return"], rel=1e-6)
    assert result.policy["return"] != pytest.approx(unnormalised[0]["return"], rel=1e-6)
