"""Multi-agent Gymnasium layout (Tuple spaces, per-agent rewards, shared or per-agent
dones), flattened Dict/nested observations, action masks, and space errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")

from trainer.config import PPOConfig  # noqa: E402
from trainer.envs import EnvSpecError, check_spec, make_env  # noqa: E402
from trainer.hooks import MetricsRecorder  # noqa: E402
from trainer.train import Trainer  # noqa: E402
from vrl.errors import VrlError  # noqa: E402

SPEC = "gym:ma_gym_env:MALine-v0"
RIGHT = 1


def act(n, a=RIGHT):
    return torch.full((n,), a, dtype=torch.long)


def test_tuple_spaces_give_one_row_per_agent_and_a_shared_done_ends_the_episode():
    env = make_env(SPEC, 2)  # 2 copies x 2 agents
    assert (env.num_envs, env.obs_dim, env.num_actions) == (4, 5, 4)
    assert env.action_mask is None
    obs = env.reset(seed=0)
    assert obs[:, 0].tolist() == [1, 1, 1, 1]
    for _ in range(3):
        obs, rew, term, trunc, info = env.step(act(4))
        assert not term.any() and not trunc.any() and not rew.any() and "final_obs" not in info
    obs, rew, term, trunc, info = env.step(act(4))  # everybody arrives: one shared done
    assert rew.tolist() == [1, 1, 1, 1] and term.all() and not trunc.any()
    assert info["final_obs"][:, 4].tolist() == [1, 1, 1, 1]  # last obs: at the end
    assert obs[:, 0].tolist() == [1, 1, 1, 1]  # already the next episode
    assert info["episodes"] == [{"return": 1.0, "team_return": 2.0, "length": 4.0}] * 2
    assert env.alive.all()


@pytest.mark.parametrize("reward", ["tuple", "array", "team"])
def test_reward_forms(reward):
    env = make_env(SPEC, 1, env_kwargs={"reward": reward, "speeds": [1, 0]})
    env.reset(seed=0)
    for _ in range(4):
        _, rew, *_ = env.step(act(2))
    # a scalar is a team reward: every agent gets it
    assert rew.tolist() == ([1.0, 1.0] if reward == "team" else [1.0, 0.0])


def test_time_limit_is_truncation_not_termination():
    env = make_env(SPEC, 1)
    env.reset(seed=0)
    for _ in range(7):
        env.step(act(2, 0))
    obs, rew, term, trunc, info = env.step(act(2, 0))  # step 8: TimeLimit
    assert trunc.tolist() == [True, True] and not term.any()
    assert info["final_obs"][:, 0].tolist() == [1, 1]
    assert info["episodes"][0]["length"] == 8


def test_per_agent_dones_finished_agent_is_not_alive_until_the_episode_ends():
    env = make_env(SPEC, 1, env_kwargs={"dones": "per_agent", "speeds": [1, 0]})
    env.reset(seed=0)
    for _ in range(3):
        env.step(act(2))
    _, rew, term, trunc, info = env.step(act(2))  # agent 0 arrives, agent 1 cannot move
    assert rew.tolist() == [1, 0] and term.tolist() == [True, False]
    assert info["final_obs"][0, 4] == 1 and "episodes" not in info
    assert env.alive.tolist() == [False, True]
    for _ in range(3):
        _, rew, term, trunc, info = env.step(act(2))
        # the finished agent's row: no reward, terminated (nothing to bootstrap), not alive
        assert rew.tolist() == [0, 0] and term.tolist() == [True, False]
        assert env.alive.tolist() == [False, True]
    _, rew, term, trunc, info = env.step(act(2))  # time limit for agent 1: episode over
    assert trunc.tolist() == [False, True] and info["episodes"][0]["return"] == 0.5
    assert env.alive.tolist() == [True, True]


def test_nested_dict_observations_are_flattened():
    env = make_env(SPEC, 1, env_kwargs={"obs": "nested"})
    obs = env.reset(seed=0)
    # Dict keys sorted: extra = (MultiBinary(2) [1,0], MultiDiscrete([2,3]) [1,2] one-hot),
    # then pos = Discrete(5) 0 one-hot
    assert env.obs_dim == 12
    assert obs[0].tolist() == [1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0]
    for _ in range(4):
        obs, *_ = env.step(act(2))
    assert obs[0, 7:].tolist() == [1, 0, 0, 0, 0]  # reset after arriving


def test_smaller_observations_are_zero_padded():
    env = make_env(SPEC, 1, env_kwargs={"obs": "growing", "num_agents": 3})
    obs = env.reset(seed=0)
    assert env.obs_dim == 7
    assert obs.tolist() == [[1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 1, 0],
                            [1, 0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("mask", ["obs", "info"])
def test_action_masks_from_dict_observation_or_info(mask):
    env = make_env(SPEC, 1, env_kwargs={"mask": mask})
    obs = env.reset(seed=0)
    assert env.obs_dim == 5 and obs[0].tolist() == [1, 0, 0, 0, 0]  # mask not in the obs
    assert env.action_mask.tolist() == [[True, True, False, False]] * 2  # no left at 0
    env.step(act(2))
    assert env.action_mask.tolist() == [[True, True, True, False]] * 2
    with pytest.raises(RuntimeError, match="illegal action"):
        env.step(act(2, 3))  # the env really refuses what the mask forbids


@pytest.mark.parametrize("mask", ["obs", "info"])
def test_training_honours_action_masks(mask):
    """The env raises on an illegal action (1 in 4 actions for a random policy): training
    runs only if the rollout samples from masked logits, and the update must use the
    same masks or the ratios of the first epoch are not 1."""
    env = make_env(SPEC, 2, env_kwargs={"mask": mask})
    cfg = PPOConfig(num_envs=2, num_steps=16, total_steps=4 * 16 * 3, hidden_sizes=[8],
                    update_epochs=1, num_minibatches=1, seed=0)
    trainer = Trainer(env, cfg)
    metrics = trainer.train()
    buf = trainer.buffer
    taken = buf.action_masks.gather(-1, buf.actions.unsqueeze(-1))
    assert taken.all() and not buf.action_masks[..., 3].any()
    # one epoch, one minibatch: the first (only) step sees ratio 1 if the update masks too
    assert metrics["losses/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["losses/clipfrac"] == 0.0


def test_masked_logits_give_illegal_actions_probability_zero():
    from trainer.agent import Agent

    agent = Agent(3, 4, [8])
    x = torch.randn(64, 3)
    mask = torch.tensor([[True, False, True, False]]).expand(64, 4)
    gen = torch.Generator().manual_seed(0)
    action, logprob, entropy, _, _ = agent.get_action_and_value(x, generator=gen,
                                                                 action_mask=mask)
    assert set(action.tolist()) <= {0, 2}
    assert torch.isfinite(logprob).all() and torch.isfinite(entropy).all()
    assert entropy.max() <= np.log(2) + 1e-6  # two legal actions at most
    _, lp_illegal, *_ = agent.get_action_and_value(x, torch.ones(64, dtype=torch.long),
                                                   action_mask=mask)
    assert (lp_illegal < -1e30).all()


def test_finished_agents_are_not_trained_on_or_counted():
    """Agent 1 never arrives, agent 0 often does: agent 0's rows after it arrived carry
    the observation of the end cell (one-hot index 2) until the episode ends. Such rows
    must not reach the loss, and the step count is the number of live rows."""
    env = make_env(SPEC, 2, env_kwargs={"dones": "per_agent", "speeds": [1, 0],
                                        "length": 3})
    cfg = PPOConfig(num_envs=2, num_steps=32, total_steps=4 * 32 * 4, hidden_sizes=[8],
                    update_epochs=1, num_minibatches=2, learning_rate=3e-3, seed=2)
    trainer = Trainer(env, cfg)
    seen = []
    forward = trainer.agent.get_action_and_value

    def spy(x, action=None, *args, **kwargs):
        if action is not None:  # the update (the rollout samples without actions)
            seen.append(x.detach().clone())
        return forward(x, action, *args, **kwargs)

    trainer.agent.get_action_and_value = spy
    metrics = trainer.run_iteration()
    obs = trainer.buffer.obs
    # agent 0 is at the end cell only after it arrived; agent 1 never gets there
    finished = obs[..., 2] == 1
    assert finished.any() and not finished[:, 1::2].any()
    live = int((~finished).sum())
    assert trainer.global_step == live == int(trainer.buffer.alive.sum())
    assert metrics["charts/global_step"] == live < 32 * 4
    assert metrics["charts/SPS"] * (metrics["perf/rollout_s"] + metrics["perf/update_s"]) \
        == pytest.approx(live)
    trained = torch.cat(seen)
    assert len(trained) == live - live % 2  # every live sample (minibatches of live // 2)
    assert not (trained[:, 2] == 1).any()


def test_python_api_trains_end_to_end_and_learns():
    """Both agents must walk 4 cells right within 8 steps (a random policy mostly runs
    out of time); with masks (no jumping, no left at the start) and per-agent dones."""
    env = make_env(SPEC, 4, env_kwargs={"mask": "obs", "dones": "per_agent"})
    cfg = PPOConfig(num_envs=4, num_steps=32, total_steps=8 * 32 * 12, hidden_sizes=[16],
                    learning_rate=1e-2, ent_coef=0.0, seed=1)
    rec = MetricsRecorder()
    trainer = Trainer(env, cfg, hooks=[rec])
    trainer.train()
    returns = [r["charts/episodic_return"] for r in rec.iterations
               if "charts/episodic_return" in r]
    assert returns[0] < 0.6 and min(returns[-3:]) > 0.9, returns
    assert trainer.global_step <= cfg.total_steps


def test_vrl_train_with_a_gym_module_spec(tmp_path):
    """``vrl train --env gym:MODULE:ID`` imports MODULE, which registers ID."""
    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(here.parent.parent), str(here), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, vrl.cli; sys.exit(vrl.cli.main())", "train",
         "--env", SPEC, "--steps", "256",
         "--device", "cpu", "--set", "num_envs=2", "--set", "num_steps=16",
         "--set", "hidden_sizes=[8]", "--set", "env.mask=obs", "--no-store",
         "--no-progress", "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and lines[-1]["charts/global_step"] == 256
    assert "env/team_return" in lines[-1] or "charts/episodic_return" not in lines[-1]


@pytest.mark.parametrize("spec, message", [
    ("gym:ma_gym_env:BoxAction-v0",
     "the env has action space Box(-1.0, 1.0, (2, 2), float32): a Box action must be one "
     "vector (shape (k,)), not shape (2, 2)"),
    ("gym:ma_gym_env:MixedActions-v0",
     "agents have different action spaces (agent 0: Discrete(5), agent 1: Discrete(3))"),
    ("gym:ma_gym_env:SequenceObs-v0", "unsupported observation space Sequence(Discrete(3)"),
    ("gym:no_such_module:X-v0", "cannot import module 'no_such_module'"),
    ("gym:needs_missing_dep:X-v0", "cannot import 'needs_missing_dep': it needs "
                                   "'vrl_test_no_such_dependency', which is not installed"),
    ("gym:NoSuchEnv-v0", "use gym:MODULE:ID to import the module that registers it"),
    ("gym:", "unknown env 'gym:'"),
])
def test_unsupported_envs_are_one_line_errors(spec, message):
    with pytest.raises(EnvSpecError) as info:
        make_env(spec, 1)
    text = str(info.value)
    assert message in text and "\n" not in text
    assert isinstance(info.value, VrlError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("spec, message", [
    ("gym:no_such_module:X-v0", "cannot import module 'no_such_module'"),
    ("gym:NoSuchEnv-v0", "use gym:MODULE:ID to import the module that registers it"),
    ("gym:", "unknown env 'gym:'"),
    ("CartPole-v1", "unknown env 'CartPole-v1'; use warehouse, gym:ID"),
    ("pettingzoo:no_such_module:env", "cannot import module 'no_such_module'"),
    ("pettingzoo:pz_line_env:no_such_factory", "module 'pz_line_env' has no 'no_such_factory'"),
])
def test_check_spec_refuses_what_make_env_refuses_without_making_an_env(spec, message):
    # sweeps and PBT check the env this way before any trial starts
    for check in (lambda: check_spec(spec), lambda: make_env(spec, 1)):
        with pytest.raises(EnvSpecError) as info:
            check()
        assert message in str(info.value) and "\n" not in str(info.value)


def test_check_spec_passes_a_spec_that_names_an_env():
    for spec in ("warehouse", "gym:CartPole-v1", "gym:ma_gym_env:BoxAction-v0",
                 "pettingzoo:pz_line_env:make"):
        check_spec(spec)  # (BoxAction's unsupported space only shows once it is made)


def test_tuple_actions_need_per_agent_observations():
    import gymnasium as gym
    from gymnasium import spaces

    from trainer.envs.gym_adapter import GymVecEnv

    class SharedObs(gym.Env):
        observation_space = spaces.Box(0, 1, (3,), np.float32)
        action_space = spaces.Tuple([spaces.Discrete(2)] * 2)

    gym.register("SharedObsTest-v0", entry_point=SharedObs)
    with pytest.raises(EnvSpecError, match="needs a Tuple observation space with one entry "
                                           "per agent"):
        GymVecEnv("SharedObsTest-v0", 1)


def test_wrong_number_of_rewards_is_a_one_line_error():
    env = make_env(SPEC, 1, env_kwargs={"num_agents": 3, "reward": "short"})
    env.reset(seed=0)
    with pytest.raises(EnvSpecError, match="step returned 2 reward values for 3 agents"):
        env.step(act(3))


def test_single_agent_envs_keep_working():
    """Blackjack's Tuple of Discretes is one agent's observation (Discrete actions)."""
    env = make_env("gym:Blackjack-v1", 2)
    obs = env.reset(seed=0)
    assert (env.num_envs, env.obs_dim, env.num_actions) == (2, 32 + 11 + 2, 2)
    assert obs.sum(-1).tolist() == [3, 3] and env.alive is None
    _, _, term, trunc, info = env.step(act(2, 0))  # stick: the hand ends
    assert term.all() and len(info["episodes"]) == 2


def test_taxi_action_mask_from_info():
    import gymnasium as gym

    taxi = "Taxi-v4" if "Taxi-v4" in gym.registry else "Taxi-v3"
    env = make_env(f"gym:{taxi}", 2)
    env.reset(seed=0)
    for _ in range(5):
        expected = [env.envs[i].unwrapped.action_mask(env.envs[i].unwrapped.s)
                    for i in range(2)]
        assert env.action_mask.tolist() == np.array(expected, bool).tolist()
        env.step(torch.multinomial(env.action_mask.float(), 1).squeeze(-1))
