"""The Stable-Baselines3 integration with the real library: what the callback commits, and
that a model loaded from a commit trains on bit-for-bit as the run it was taken from."""

import subprocess
import sys

import pytest

pytest.importorskip("stable_baselines3")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import A2C, DQN, PPO, SAC, TD3  # noqa: E402
from stable_baselines3.common.callbacks import EvalCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

from vrl import VrlError  # noqa: E402
from vrl.integrations import sb3, sb3_args  # noqa: E402
from vrl.integrations.sb3 import SnapshotCallback, load  # noqa: E402


def _ppo(env="CartPole-v1", **kw):
    kw.setdefault("policy_kwargs", {"net_arch": [8]})
    return PPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=2, device="cpu", seed=3,
               **kw)


def _sac():
    return SAC("MlpPolicy", "Pendulum-v1", buffer_size=200, learning_starts=20, batch_size=16,
               policy_kwargs={"net_arch": [8]}, device="cpu", seed=3)


def _a2c():
    return A2C("MlpPolicy", "Acrobot-v1", n_steps=8, policy_kwargs={"net_arch": [8]},
               device="cpu", seed=3)


def _td3():
    return TD3("MlpPolicy", "Pendulum-v1", buffer_size=200, learning_starts=20, batch_size=16,
               policy_kwargs={"net_arch": [8]}, device="cpu", seed=3)


def _dqn():
    # the exploration rate is still falling when the run is resumed
    return DQN("MlpPolicy", "CartPole-v1", buffer_size=200, learning_starts=20, batch_size=16,
               train_freq=4, target_update_interval=40, exploration_fraction=0.9,
               policy_kwargs={"net_arch": [8]}, device="cpu", seed=3)


def _ppo_sde():
    return _ppo("Pendulum-v1", use_sde=True, sde_sample_freq=8)


def _sac_sde():
    return SAC("MlpPolicy", "Pendulum-v1", buffer_size=200, learning_starts=20, batch_size=16,
               use_sde=True, policy_kwargs={"net_arch": [8]}, device="cpu", seed=3)


def _log(repo):
    return [e.commit for e in reversed(repo.log())]


def _same_tensors(a, b):
    assert a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


def test_commits_every_n_steps_at_rollout_boundaries_and_at_the_end(repo):
    model = _ppo(policy_kwargs={"net_arch": [8], "activation_fn": torch.nn.Tanh})
    callback = SnapshotCallback(repo, every=64)
    model.learn(192, callback=callback)
    commits = _log(repo)
    assert [c.message for c in commits] == ["PPO step 64", "PPO step 128", "PPO final step 192"]
    assert [c.step for c in commits] == [64, 128, 192]
    assert len(callback.commits) == 3 and callback.commits[-1] == repo.head()
    first = commits[0]
    assert first.hparams["policy"] == "MlpPolicy" and first.hparams["env"] == "CartPole-v1"
    assert first.hparams["n_steps"] == 32 and first.hparams["clip_range"] == 0.2
    assert first.hparams["policy_kwargs"] == {
        "net_arch": [8], "activation_fn": {"$class": "torch.nn.modules.activation.Tanh"}}
    assert first.meta["sb3"]["algo"] == "PPO" and first.meta["sb3"]["exact"] is True
    assert first.meta["sb3"]["env"]["id"] == "CartPole-v1"
    # the logger's values from the last dump (the iteration that ended at this step) and
    # from the update after it, which no dump has cleared yet
    assert first.metrics["time/total_timesteps"] == 64
    assert first.metrics["train/n_updates"] == 2 * 2  # two updates of n_epochs=2
    assert "rollout/ep_rew_mean" in first.metrics
    assert commits[-1].metrics["train/n_updates"] == 6 * 2
    # the last commit is the final model, its optimizer and counters
    final = load(repo)
    assert _same_tensors(final.policy.state_dict(), model.policy.state_dict())
    assert final.num_timesteps == 192 and final._n_updates == model._n_updates == 12
    assert isinstance(final.policy.mlp_extractor.policy_net[1], torch.nn.Tanh)
    state = final.policy.optimizer.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg"], v["exp_avg"]) for i, v in
               model.policy.optimizer.state_dict()["state"].items())
    # an env built otherwise than the run's cannot take its state: training goes on from a
    # reset, and load says so
    with pytest.warns(UserWarning, match="environment's state is not restored"):
        other = load(repo, env=make_vec_env("CartPole-v1", n_envs=2))
    assert other._last_obs is None and other.num_timesteps == 192


def _ppo_normalized():
    return _ppo(VecNormalize(make_vec_env("Pendulum-v1", n_envs=2), gamma=0.9))


@pytest.mark.parametrize("make, n", [(_ppo, 64), (lambda: _ppo(make_vec_env("CartPole-v1",
                                                                            n_envs=2)), 128),
                                     (_ppo_normalized, 128), (_a2c, 40), (_sac, 40),
                                     (_td3, 40), (_dqn, 60), (_ppo_sde, 64), (_sac_sde, 40)],
                         ids=["ppo", "ppo-2-envs", "ppo-vec-normalize", "a2c", "sac", "td3",
                              "dqn", "ppo-gsde", "sac-gsde"])
def test_a_loaded_snapshot_trains_on_bit_for_bit(repo, make, n):
    straight = make()
    # the replay buffer is committed on request only: off-policy training samples from it
    straight.learn(2 * n, callback=SnapshotCallback(repo, every=n, replay_buffer=True))
    algo = type(straight).__name__
    middle = next(e for e in repo.log() if e.commit.message == f"{algo} step {n}")
    head, reflog = repo.head(), repo.refs.reflog("HEAD")
    resumed = load(repo, middle.id[:12])
    assert repo.head() == head and repo.refs.reflog("HEAD") == reflog  # HEAD never moved
    assert resumed.num_timesteps == n
    assert not _same_tensors(resumed.policy.state_dict(), straight.policy.state_dict())
    resumed.learn(n, reset_num_timesteps=False)
    assert resumed.num_timesteps == straight.num_timesteps == 2 * n
    assert resumed._n_updates == straight._n_updates > 0
    assert _same_tensors(resumed.policy.state_dict(), straight.policy.state_dict())
    for name in straight._get_torch_save_params()[1]:  # SAC's log_ent_coef
        assert torch.equal(getattr(resumed, name), getattr(straight, name))


def test_without_the_replay_buffer_a_resume_is_not_exact(repo):
    straight = _dqn()
    straight.learn(120, callback=SnapshotCallback(repo, every=60))
    resumed = load(repo, "HEAD~1")
    assert "replay_buffer" not in repo.load("HEAD~1")
    resumed.learn(60, reset_num_timesteps=False)
    assert resumed.num_timesteps == 120
    assert not _same_tensors(resumed.policy.state_dict(), straight.policy.state_dict())


def test_the_best_tag_follows_the_best_evaluation(repo, tmp_path):
    model = _ppo()
    env = Monitor(gym.make("CartPole-v1"))
    env.reset(seed=0)  # (the evaluations' episodes, the same at every run)
    evaluation = EvalCallback(env, eval_freq=32, n_eval_episodes=2, verbose=0)
    callback = SnapshotCallback(repo, every=1000, eval_callback=evaluation)
    model.learn(256, callback=[evaluation, callback])
    evals = [(e.id, e.commit) for e in repo.log() if e.commit.meta["sb3"]["kind"] == "eval"]
    assert len(evals) == 256 // 32
    rewards = [c.metrics["eval/mean_reward"] for _, c in reversed(evals)]
    assert max(rewards) == evaluation.best_mean_reward
    assert len(set(rewards)) > 1  # (the tag has a choice to make)
    best = next(i for i, c in reversed(evals) if c.metrics["eval/mean_reward"] == max(rewards))
    assert repo.tags() == {"best/main": best}
    step = repo.read_commit(best).step
    assert repo.read_commit(best).message == f"PPO eval step {step} mean_reward {max(rewards):.4g}"
    assert all(c.meta["sb3"]["exact"] is False for _, c in evals)
    # a periodic commit carries no evaluation of an earlier policy
    assert "eval/mean_reward" not in repo.read_commit(repo.head()).metrics


def test_an_eval_callback_left_out_of_learn_is_an_error(repo):
    evaluation = EvalCallback(gym.make("CartPole-v1"), eval_freq=32)
    with pytest.raises(VrlError, match=r"callback=\[eval_callback, snapshot_callback\]"):
        _ppo().learn(64, callback=SnapshotCallback(repo, every=32, eval_callback=evaluation))


def test_an_argument_that_was_not_recorded_must_be_passed_to_load(repo):
    model = _ppo(learning_rate=lambda progress: 3e-4 * progress)
    model.learn(32, callback=SnapshotCallback(repo, every=32))
    recorded = repo.read_commit(repo.head()).hparams["learning_rate"]
    assert recorded == {"$object": f"{__name__}.{_qualname()}.<locals>.<lambda>"}
    with pytest.raises(VrlError, match="pass learning_rate=... to load"):
        load(repo)
    assert load(repo, learning_rate=1e-3).learning_rate == 1e-3


def _qualname():
    return test_an_argument_that_was_not_recorded_must_be_passed_to_load.__qualname__


def test_load_refuses_a_snapshot_of_something_else(repo):
    repo.commit({"w": torch.zeros(2)}, message="not sb3")
    with pytest.raises(VrlError, match="not a snapshot of a Stable-Baselines3 model"):
        load(repo)


def test_without_stable_baselines3_the_error_says_what_to_install(repo, monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # `import` fails
    for call in (lambda: SnapshotCallback(repo, every=10), lambda: load(repo)):
        with pytest.raises(VrlError) as info:
            call()
        assert str(info.value) == sb3.HINT and "pip install 'vrl[sb3]'" in sb3.HINT


def test_importing_the_module_does_not_import_stable_baselines3():
    code = ("import sys, vrl.integrations.sb3\n"
            "print([m for m in ('stable_baselines3', 'gymnasium') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_schedules_are_recorded_by_value():
    from stable_baselines3.common import utils

    assert sb3_args.to_json(utils.FloatSchedule(0.25)) == 0.25
    assert sb3_args.to_json(utils.LinearSchedule(1.0, 0.1, 0.5)) == {
        "$schedule": "LinearSchedule", "start": 1.0, "end": 0.1, "end_fraction": 0.5}
    with pytest.warns(UserWarning, match="deprecated"):  # as older releases built them
        closure = utils.get_schedule_fn(0.25)
    assert sb3_args.to_json(closure) == 0.25


def test_the_committed_gsde_noise_is_kept_through_the_first_resample_only(repo):
    model = _ppo_sde()
    model.learn(64, callback=SnapshotCallback(repo, every=32))
    committed = repo.load("HEAD~1")["sde"]
    resumed = load(repo, "HEAD~1")
    dist = resumed.policy.action_dist
    assert torch.equal(dist.exploration_mat, committed["exploration_mat"])
    resumed.policy.reset_noise(1)  # what the resumed rollout does first: kept
    assert torch.equal(dist.exploration_mat, committed["exploration_mat"])
    assert "reset_noise" not in vars(resumed.policy)
    resumed.policy.reset_noise(1)  # later ones sample, as SB3's do
    assert not torch.equal(dist.exploration_mat, committed["exploration_mat"])
    _ppo().learn(32, callback=SnapshotCallback(repo, every=32))
    assert "sde" not in repo.load("HEAD")  # nothing without gSDE


@pytest.mark.parametrize("make", [_ppo_sde, _sac_sde], ids=["ppo-gsde", "sac-gsde"])
def test_a_final_gsde_snapshot_resumes_as_the_run_would_have_gone_on(repo, make):
    # the final commit is taken after training ended: the next rollout samples new noise
    straight = make()
    straight.learn(64, callback=SnapshotCallback(repo, every=1000, replay_buffer=True))
    assert repo.read_commit(repo.head()).meta["sb3"]["kind"] == "final"
    straight.learn(32, reset_num_timesteps=False)
    resumed = load(repo, "HEAD")
    resumed.learn(32, reset_num_timesteps=False)
    assert resumed.num_timesteps == straight.num_timesteps == 96
    assert _same_tensors(resumed.policy.state_dict(), straight.policy.state_dict())
