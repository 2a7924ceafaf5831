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


@pytest.mark.parametrize("mask", ["obs", "info"])
def test_dict_observations_are_flattened_and_masks_read(mask):
    env = make_env("pettingzoo:pz_line_env:make", 2, env_kwargs={"mask": mask})
    assert (env.num_envs, env.obs_dim, env.num_actions) == (4, 5, 3)
    obs = env.reset(seed=0)
    assert obs.tolist() == [[1, 0, 0, 0, 0]] * 4 and env.alive.all()
    assert env.action_mask.tolist() == [[True, True, False]] * 4
    obs, *_ = env.step(torch.ones(4, dtype=torch.long))
    assert obs[0].tolist() == [0, 1, 0, 0, 0]
    with pytest.raises(RuntimeError, match="illegal action"):
        env.step(torch.full((4,), 2))


@pytest.mark.parametrize("kwargs, message", [
    ({"action_sizes": (2, 3)}, "agents have different action spaces (agent 'fast': "
                               "Discrete(2), agent 'slow': Discrete(3))"),
    ({"continuous": True}, "agents mix discrete and continuous actions (agent 'fast': "
                           "Discrete(2), agent 'slow': Box(-1.0, 1.0, (1,), float32))"),
    ({"nope": 1}, "unexpected keyword argument 'nope'"),
])
def test_every_agents_spaces_are_checked(kwargs, message):
    from trainer.envs import EnvSpecError

    with pytest.raises(EnvSpecError) as info:
        make_env("pettingzoo:pz_line_env:make", 1, env_kwargs=kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_pettingzoo_specs_are_one_line_errors():
    from trainer.envs import EnvSpecError

    with pytest.raises(EnvSpecError, match="cannot import module 'no_such_mod'"):
        make_env("pettingzoo:no_such_mod:make", 1)
    with pytest.raises(EnvSpecError, match="module 'pz_line_env' has no 'nope'"):
        make_env("pettingzoo:pz_line_env:nope", 1)
    with pytest.raises(EnvSpecError, match="is not a PettingZoo ParallelEnv"):
        make_env("pettingzoo:pz_line_env:make_aec", 1)


def _spy_update_inputs(trainer):
    """Record the observations the update's forward passes (the loss) see."""
    seen = []
    forward = trainer.agent.get_action_and_value

    def spy(x, action=None, *args, **kwargs):
        if action is not None:  # the update; the rollout samples without actions
            seen.append(x.detach().clone())
        return forward(x, action, *args, **kwargs)

    trainer.agent.get_action_and_value = spy
    return seen


def test_finished_agents_are_masked_from_loss_and_step_count():
    """"fast" may arrive early (then its row is an all-zero observation until "slow" is
    truncated at step 6): those rows must reach no loss term and count as no step."""
    from trainer.config import PPOConfig
    from trainer.train import Trainer

    env = make_env("pettingzoo:pz_line_env:make", 2, env_kwargs={"mask": "obs"})
    cfg = PPOConfig(num_envs=2, num_steps=30, total_steps=4 * 30 * 5, hidden_sizes=[8],
                    update_epochs=2, num_minibatches=2, learning_rate=1e-2, seed=0)
    trainer = Trainer(env, cfg)
    seen = _spy_update_inputs(trainer)
    metrics = trainer.run_iteration()
    buf = trainer.buffer
    finished = buf.obs.abs().sum(-1) == 0  # an agent's observation is never all zero
    assert finished.any() and not finished[:, 1::2].any()  # only "fast" finishes early
    live = int((~finished).sum())
    assert trainer.global_step == metrics["charts/global_step"] == live < 30 * 4
    assert metrics["charts/SPS"] * (metrics["perf/rollout_s"] + metrics["perf/update_s"]) \
        == pytest.approx(live)
    trained = torch.cat(seen)
    assert len(trained) == 2 * (live - live % 2)  # 2 epochs of all live samples
    assert (trained.abs().sum(-1) > 0).all()
    # the masked action (jump) was never sampled by a live agent (else the env raises)
    assert not (buf.actions[~finished] == 2).any()


def test_run_length_counts_only_live_agent_steps():
    """total_steps are agent-steps: with finished agents the run takes more iterations
    than the slots alone would need, and stops within one iteration of the target."""
    from trainer.config import PPOConfig
    from trainer.train import Trainer

    # "fast" needs >= 4 of the 12 steps, "slow" never arrives: up to 1/3 of rows finished
    env = make_env("pettingzoo:pz_line_env:make", 2, env_kwargs={"max_steps": 12})
    cfg = PPOConfig(num_envs=2, num_steps=30, total_steps=4 * 30 * 6, hidden_sizes=[8],
                    learning_rate=1e-2, seed=0, num_minibatches=4, update_epochs=4)
    trainer = Trainer(env, cfg)
    assert trainer.num_iterations == 6
    trainer.train()
    per_iteration = trainer.global_step / trainer.iteration
    assert trainer.iteration > 6 and trainer.num_iterations == trainer.iteration
    assert cfg.total_steps - per_iteration < trainer.global_step <= cfg.total_steps


def test_vrl_train_with_dict_observations_and_masks(tmp_path):
    import json

    from click.testing import CliRunner

    from trainer.cli import train

    out = tmp_path / "run"
    result = CliRunner().invoke(train, [
        "--env", "pettingzoo:pz_line_env:make", "--steps", "480", "--device", "cpu",
        "--set", "num_envs=2", "--set", "num_steps=30", "--set", "hidden_sizes=[8]",
        "--set", "num_minibatches=4",
        "--set", "env.mask=obs", "--out", str(out), "--no-progress", "--no-store"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert 480 - 120 < lines[-1]["charts/global_step"] <= 480
    assert "env/team_return" in lines[-1]
