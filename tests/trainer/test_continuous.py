"""Continuous (Box) actions: the diagonal Gaussian policy, clipping at the env, learning,
exact resume, snapshots and `--from` checks (CleanRL's ppo_continuous_action.py)."""

import box_env  # noqa: F401 - registers the TargetBox-v0 family
import numpy as np
import pytest
import torch
from helpers import assert_same

from trainer.agent import Agent, GaussianHead, layer_params
from trainer.config import GSPOConfig, PPOConfig
from trainer.envs import EnvSpecError, make_env
from trainer.train import Trainer
from vrl import Repo
from vrl.cli import main
from vrl.errors import VrlError

INF = float("inf")


def test_logprob_and_entropy_are_normals_summed_over_dimensions():
    torch.manual_seed(0)
    agent = Agent(3, 2, [8], continuous=True)
    with torch.no_grad():
        agent.actor[-1].log_std.copy_(torch.tensor([-0.5, 0.7]))
    obs, actions = torch.randn(5, 3), torch.randn(5, 2) * 3
    _, logprob, entropy, _, mean = agent.get_action_and_value(obs, actions)
    normal = torch.distributions.Normal(agent.actor(obs), agent.actor[-1].log_std.exp())
    torch.testing.assert_close(mean, agent.actor(obs))
    torch.testing.assert_close(logprob, normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    # gradients reach the mean's layers and the log-std
    (logprob.sum() + entropy.sum()).backward()
    assert agent.actor[-1].log_std.grad is not None and agent.actor[0].weight.grad is not None


def test_sampling_uses_only_the_given_generator():
    torch.manual_seed(0)
    agent = Agent(3, 2, [8], continuous=True)
    obs = torch.randn(4096, 3)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    before = torch.random.get_rng_state()
    x, logprob, *_ = agent.get_action_and_value(obs, generator=a)
    y, *_ = agent.get_action_and_value(obs, generator=b)
    assert torch.equal(torch.random.get_rng_state(), before) and torch.equal(x, y)
    assert x.dtype == torch.float32 and x.shape == (4096, 2)
    # log_std 0 at the start: unit spread around a mean near 0 (last layer std 0.01)
    assert float(x.std()) == pytest.approx(1.0, abs=0.05)
    assert float(x.mean().abs()) < 0.05
    # no gradient through a sample (as with a categorical one), with grad mode on
    assert x.requires_grad is False and logprob.requires_grad


def test_log_std_is_part_of_the_actors_output_layer():
    agent = Agent(3, 2, [8, 8], continuous=True)
    assert isinstance(agent.actor[-1], GaussianHead)
    assert torch.equal(agent.actor[-1].log_std, torch.zeros(2))
    groups = layer_params(agent)
    assert list(groups) == ["critic.0", "critic.2", "critic.4", "actor.0", "actor.2", "actor.4"]
    assert [p.shape for p in groups["actor.4"]] == [(2, 8), (2,), (2,)]
    assert "actor.4.log_std" in agent.state_dict()
    # the discrete agent is unchanged: no log-std anywhere
    assert not any("log_std" in k for k in Agent(3, 2, [8]).state_dict())


def _config(cls=PPOConfig, **kw):
    base = dict(num_envs=4, num_steps=16, total_steps=4 * 16 * 4, hidden_sizes=[16],
                num_minibatches=2, update_epochs=2)
    return cls(**{**base, **kw})


def test_the_env_gets_clipped_actions_the_buffer_the_unclipped_sample():
    env = make_env("gym:box_env:TargetBox-v0", 4, env_kwargs={
        "dim": 2, "low": [-0.5, -INF], "high": [0.5, INF]})
    assert env.continuous_actions and env.num_actions == 2 and env.action_mask is None
    trainer = Trainer(env, _config())
    with torch.no_grad():
        trainer.agent.actor[-1].log_std.fill_(1.0)  # std e: many samples out of bounds
    trainer.collect_rollout()
    buf = trainer.buffer
    sent = np.stack([a for copy in env.envs for a in copy.unwrapped.received])
    stored = buf.actions.reshape(-1, 2).numpy()
    assert buf.actions.dtype == torch.float32 and buf.actions.shape == (16, 4, 2)
    assert (np.abs(stored[:, 0]) > 0.5).any() and (np.abs(stored[:, 1]) > 0.5).any()
    # row order of the buffer is (step, copy); the envs recorded copy by copy
    by_copy = stored.reshape(16, 4, 2).transpose(1, 0, 2).reshape(-1, 2)
    assert np.array_equal(sent[:, 0], np.clip(by_copy[:, 0], -0.5, 0.5))
    assert np.array_equal(sent[:, 1], by_copy[:, 1])  # an unbounded dimension: unclipped
    mean = trainer.agent.actor(buf.obs.reshape(-1, 3))
    normal = torch.distributions.Normal(mean, trainer.agent.actor[-1].log_std.exp())
    torch.testing.assert_close(buf.logprobs.reshape(-1),
                               normal.log_prob(buf.actions.reshape(-1, 2)).sum(-1))


def test_a_one_step_continuous_task_is_learned():
    """reward = -(a - obs[0])^2 with actions in [-2, 2]: the mean must follow the
    observation and the spread shrink; the initial policy (std 1) scores about -1.2."""
    env = make_env("gym:box_env:TargetBox-v0", 8)
    cfg = _config(num_envs=8, num_steps=32, total_steps=8 * 32 * 20, num_minibatches=4,
                  update_epochs=4, learning_rate=1e-2, ent_coef=0.0, seed=3)
    trainer = Trainer(env, cfg)
    first = trainer.train(iterations=1)["charts/episodic_return"]
    last = trainer.train()["charts/episodic_return"]
    assert first < -0.9 and last > -0.15, (first, last)
    assert float(trainer.agent.actor[-1].log_std.detach()) < -1.0
    obs = torch.rand(256, 3) * 2 - 1
    with torch.no_grad():
        error = (trainer.agent.actor(obs)[:, 0] - obs[:, 0]).abs().mean()
    assert float(error) < 0.15


class TorchTargetEnv:
    """The one-step target task as a snapshottable VecEnv (torch RNG), so a resumed run
    can be compared with one that was never interrupted."""

    obs_dim, num_actions, continuous_actions = 3, 2, True

    def __init__(self, num_envs):
        self.num_envs, self.device = num_envs, torch.device("cpu")
        self.gen = torch.Generator()

    def _draw(self):
        self.obs = torch.rand(self.num_envs, 3, generator=self.gen) * 2 - 1
        return self.obs.clone()

    def reset(self, seed=None):
        self.gen.manual_seed(seed or 0)
        return self._draw()

    def step(self, actions):
        assert actions.shape == (self.num_envs, 2)
        a = actions.clamp(-1, 1)
        reward = -((a - 0.5 * self.obs[:, :2]) ** 2).sum(-1)
        done = torch.ones(self.num_envs, dtype=torch.bool)
        episodes = [{"return": float(r), "length": 1.0} for r in reward]
        return self._draw(), reward, done, ~done, {"episodes": episodes}

    def state_dict(self):
        return {"gen": self.gen.get_state(), "obs": self.obs.clone()}

    def load_state_dict(self, state):
        self.gen.set_state(state["gen"])
        self.obs = state["obs"].clone()

    def close(self):
        pass


@pytest.mark.parametrize("cls, kw", [
    (PPOConfig, {}), (GSPOConfig, {"hessian_interval": 1}),
    (PPOConfig, {"norm_obs": True, "norm_reward": True})], ids=["ppo", "gspo", "normalised"])
def test_resume_is_bit_identical_to_a_straight_run(cls, kw):
    cfg = _config(cls, total_steps=4 * 16 * 4, **kw)
    straight = Trainer(TorchTargetEnv(4), cfg)
    straight.train()
    first = Trainer(TorchTargetEnv(4), cfg)
    first.train(iterations=2)
    resumed = Trainer(TorchTargetEnv(4), cfg)
    resumed.load_state_dict(first.state_dict())
    resumed.train()
    a, b = straight.state_dict(), resumed.state_dict()
    assert a["iteration"] == b["iteration"] == 4
    for key in ("model", "algo", "rng", "env", "episode_returns", "normalizer"):
        assert_same(a[key], b[key], key)
    if kw.get("norm_obs"):
        assert a["normalizer"]["obs"]["count"] == 4 * (16 * 4 + 1)
    assert not torch.equal(a["model"]["actor.2.log_std"], torch.zeros(2))  # it trained


def test_freezing_the_output_layer_freezes_the_log_std():
    trainer = Trainer(TorchTargetEnv(4), _config())
    trainer.freeze_layers(["actor.0", "actor.2"])
    before = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    trainer.train(iterations=1)
    after = trainer.agent.state_dict()
    assert torch.equal(before["actor.2.log_std"], after["actor.2.log_std"])
    assert torch.equal(before["actor.0.weight"], after["actor.0.weight"])
    assert not torch.equal(before["critic.0.weight"], after["critic.0.weight"])


# ------------------------------------------------------------------------------- CLI
PENDULUM = ["--env", "gym:Pendulum-v1", "--set", "num_envs=2", "--set", "num_steps=32",
            "--set", "hidden_sizes=[8]", "--set", "num_minibatches=2",
            "--set", "update_epochs=2", "--no-progress", "--device", "cpu"]


def _train(capsys, *args):
    code = main(["train", *args])
    err = capsys.readouterr().err
    assert code == 0, err


def test_pendulum_snapshots_and_resumes(ws, capsys):
    from trainer.eval import evaluate

    main(["init"])
    _train(capsys, *PENDULUM, "--steps", "256", "--iterations", "2", "--branch", "p")
    repo = Repo(ws)
    top = repo.read_commit(repo.resolve("p"))
    assert top.meta["trainer"]["continuous_actions"] is True
    assert top.meta["trainer"]["num_actions"] == 1 and top.meta["trainer"]["obs_dim"] == 3
    assert top.hparams["env_spec"] == "gym:Pendulum-v1"
    # two resumes of the same snapshot are bit-identical (Gymnasium envs are re-seeded
    # from the iteration on resume: deterministic, not the uninterrupted episode)
    for branch in ("a", "b"):
        _train(capsys, "--from", "p", "--steps", "256", "--branch", branch,
               "--no-progress", "--device", "cpu")
    a, b = repo.load("a"), repo.load("b")
    assert a["iteration"] == b["iteration"] == 4
    assert_same(a["model"], b["model"])
    assert_same(a["algo"], b["algo"])
    assert [e.commit.meta["iteration"] for e in repo.log("a")] == [4, 3, 2, 1]
    assert not torch.equal(a["model"]["actor.2.log_std"], repo.load("p")["model"]
                           ["actor.2.log_std"])
    # deterministic evaluation takes the mean: the same result twice
    results = [evaluate(repo, "a", episodes=1, greedy=True, seed=1) for _ in range(2)]
    assert results[0].policy == results[1].policy and results[0].policy["length"] == 200


@pytest.mark.parametrize("train_args, from_args, expected", [
    (["--env", "gym:CartPole-v1"], ["--env", "gym:Pendulum-v1"],
     "was trained on discrete actions, but gym:Pendulum-v1 has continuous (Box) actions"),
    (["--env", "gym:Pendulum-v1"], ["--env", "gym:CartPole-v1"],
     "was trained on continuous (Box) actions, but gym:CartPole-v1 has discrete actions"),
    (["--env", "gym:Pendulum-v1"], ["--env", "gym:box_env:TargetBox-v0",
                                    "--set", "env.dim=2"],
     "was trained on continuous actions of 1 floats, but gym:box_env:TargetBox-v0 has "
     "continuous actions of 2 floats"),
])
def test_from_a_snapshot_of_another_action_kind_is_a_one_line_error(
        ws, capsys, train_args, from_args, expected):
    main(["init"])
    common = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[8]",
              "--no-progress", "--device", "cpu"]
    _train(capsys, *train_args, *common, "--steps", "32", "--branch", "w")
    code = main(["train", "--from", "w", "--steps", "64", *common, *from_args])
    err = capsys.readouterr().err.strip()
    assert code == 1 and expected in err and "\n" not in err, err


@pytest.mark.parametrize("spec, message", [
    ("Box2D-v0", "the env has action space Box(-1.0, 1.0, (2, 2), float32): a Box action "
                 "must be one vector (shape (k,)), not shape (2, 2)"),
    ("MultiDiscreteAction-v0", "the env has action space MultiDiscrete([2 3]): "
                               "MultiDiscrete actions are not supported"),
    ("MultiBinaryAction-v0", "MultiBinary(3): MultiBinary actions are not supported"),
    ("IntBox-v0", "Box(-1, 1, (2,), int64): an integer Box is not supported"),
    ("MixedBox-v0", "agents mix discrete and continuous actions (agent 0: Discrete(3), "
                    "agent 1: Box(-1.0, 1.0, (1,), float32))"),
    ("BoxShapes-v0", "agents have different action spaces (agent 0: Box(-1.0, 1.0, (1,), "
                     "float32), agent 1: Box(-1.0, 1.0, (2,), float32)); one shared policy "
                     "needs the same Box shape"),
])
def test_unsupported_action_spaces_are_one_line_errors(spec, message):
    with pytest.raises(EnvSpecError) as info:
        make_env(f"gym:box_env:{spec}", 1)
    text = str(info.value)
    assert message in text and "\n" not in text and isinstance(info.value, VrlError)


# ---------------------------------------------------------------------- multi-agent
def _run_two_iterations(env):
    trainer = Trainer(env, _config(num_envs=2, num_steps=16, total_steps=2 * 16 * env.num_envs,
                                   update_epochs=1))
    with torch.no_grad():
        trainer.agent.actor[-1].log_std.fill_(1.0)  # many samples out of bounds
    metrics = trainer.train()
    assert trainer.iteration == 2 and np.isfinite(metrics["losses/policy_loss"])
    return trainer, metrics


def test_a_multi_agent_gym_env_with_box_actions():
    """A Tuple of Box spaces with different bounds: each agent's actions are clipped to
    its own Box (the env asserts it), the buffer keeps the raw samples."""
    env = make_env("gym:box_env:MABox-v0", 2)
    assert (env.num_envs, env.num_actions, env.continuous_actions) == (4, 2, True)
    assert env.action_mask is None
    trainer, metrics = _run_two_iterations(env)
    assert "env/team_return" in metrics
    sent = np.stack([pair for copy in env.envs for pair in copy.unwrapped.received])
    assert sent.shape[1:] == (2, 2) and np.abs(sent[:, 0]).max() == pytest.approx(1.0)
    assert np.abs(sent[:, 1]).max() == pytest.approx(2.0)
    assert float(trainer.buffer.actions.abs().max()) > 2.0


@pytest.mark.parametrize("mask", [None, "obs", "info"])
def test_a_pettingzoo_env_with_box_actions(mask):
    """Every agent has a Box action: the env raises on any action out of bounds, and
    action masks (which select discrete actions) are not applied."""
    env = make_env("pettingzoo:pz_line_env:make", 2,
                   env_kwargs={"continuous": "all", "mask": mask})
    assert (env.num_envs, env.num_actions, env.continuous_actions) == (4, 1, True)
    trainer, metrics = _run_two_iterations(env)
    assert env.action_mask is None and trainer.buffer.action_masks is None
    assert float(trainer.buffer.actions.abs().max()) > 1.0
    assert "charts/episodic_return" in metrics


def test_greedy_evaluation_takes_the_mean():
    from trainer.eval import _actor

    torch.manual_seed(0)
    agent = Agent(3, 2, [8], continuous=True)
    obs = torch.randn(6, 3)
    with torch.no_grad():
        mean = agent.actor(obs)
    assert torch.equal(_actor(agent, True, 0, torch.device("cpu"))(obs), mean)
    sampled = _actor(agent, False, 0, torch.device("cpu"))(obs)
    assert sampled.shape == mean.shape and not torch.equal(sampled, mean)
