import pytest
import torch
from helpers import assert_same

from trainer.config import GSPOConfig, PPOConfig
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import Hook, MetricsRecorder
from trainer.train import Trainer


class FakeEnv:
    """Two slots; slot 0 is truncated and slot 1 terminated every second step."""

    num_envs, obs_dim, num_actions = 2, 3, 2
    device = torch.device("cpu")

    def reset(self, seed=None):
        self.t = 0
        return torch.zeros(2, 3)

    def step(self, actions):
        self.t += 1
        end = self.t % 2 == 0
        info = {}
        if end:
            info["final_obs"] = torch.full((2, 3), 5.0)
            info["episodes"] = [{"return": 2.0, "length": 2.0}] * 2
        return (torch.full((2, 3), float(self.t)), torch.ones(2),
                torch.tensor([False, end]), torch.tensor([end, False]), info)

    def close(self):
        pass


def test_truncation_bootstraps_termination_does_not():
    cfg = PPOConfig(num_envs=2, num_steps=4, total_steps=8, hidden_sizes=[4], num_minibatches=2)
    trainer = Trainer(FakeEnv(), cfg)
    trainer.collect_rollout()
    buf = trainer.buffer
    v_final = trainer.agent.get_value(torch.full((1, 3), 5.0)).item()
    assert buf.rewards[1, 0].item() == pytest.approx(1 + 0.99 * v_final)
    assert buf.rewards[1, 1].item() == 1.0
    assert buf.rewards[0].tolist() == [1.0, 1.0]
    assert buf.dones[:, 0].tolist() == [0, 1, 0, 1] and buf.dones[:, 1].tolist() == [0, 1, 0, 1]


def small_warehouse_trainer(config_cls=PPOConfig, **kw):
    cfg = config_cls(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * 6, hidden_sizes=[16],
                     num_minibatches=4, update_epochs=2, **kw)
    env = WarehouseEnv(2, num_agents=4, max_steps=24, layout_kwargs=dict(blocks_x=2, blocks_y=2))
    return Trainer(env, cfg)


def params(trainer):
    return [p.detach().clone() for p in trainer.agent.parameters()]


@pytest.mark.parametrize("norm", [False, True], ids=["raw", "normalised"])
@pytest.mark.parametrize("config_cls", [PPOConfig, GSPOConfig])
def test_resume_from_state_dict_is_bit_identical(config_cls, norm):
    """Also with observation and reward normalisation: their running statistics are part
    of the state."""
    extra = {} if config_cls is PPOConfig else {"hessian_interval": 2}
    if norm:
        extra.update(norm_obs=True, norm_reward=True)
    a = small_warehouse_trainer(config_cls, **extra)
    a.train(iterations=2)
    state = a.state_dict()  # no copy: the snapshot must not alias live tensors
    if norm:
        assert state["normalizer"]["obs"]["count"] > 0 and \
            "returns" in state["normalizer"]["reward"]
    rec_a = MetricsRecorder()
    a.hooks.append(rec_a)
    a.train()
    b = small_warehouse_trainer(config_cls, **extra)
    b.load_state_dict(state)
    rec_b = MetricsRecorder()
    b.hooks.append(rec_b)
    b.train()
    assert a.iteration == b.iteration == 6
    assert all(torch.equal(x, y) for x, y in zip(params(a), params(b), strict=True))
    assert_same(a.state_dict()["normalizer"], b.state_dict()["normalizer"])
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith(("perf/", "charts/SPS"))}  # noqa: E731
    assert [strip(m) for m in rec_a.iterations] == [strip(m) for m in rec_b.iterations]


def test_hooks_receive_events_in_order():
    events = []

    class Spy(Hook):
        def on_start(self, trainer):
            events.append("start")

        def on_iteration_end(self, trainer, iteration, metrics):
            events.append(("iter", iteration, "losses/approx_kl" in metrics))
            if iteration == 3:
                trainer.request_stop()

        def on_evaluation(self, trainer, iteration, metrics):
            events.append(("eval", iteration, "eval/return" in metrics))

        def on_end(self, trainer, metrics):
            events.append("end")

    t = small_warehouse_trainer(eval_interval=2, eval_episodes=2)
    t.eval_env = WarehouseEnv(2, num_agents=4, max_steps=24,
                              layout_kwargs=dict(blocks_x=2, blocks_y=2))
    t.hooks.append(Spy())
    t.train()
    assert events == ["start", ("iter", 1, True), ("iter", 2, True), ("eval", 2, True),
                      ("iter", 3, True), "end"]


def test_evaluation_does_not_disturb_training():
    a = small_warehouse_trainer()
    b = small_warehouse_trainer()
    b.eval_env = WarehouseEnv(2, num_agents=4, max_steps=24,
                              layout_kwargs=dict(blocks_x=2, blocks_y=2))
    a.train(iterations=2)
    b.train(iterations=1)
    b.evaluate()
    b.train(iterations=1)
    assert all(torch.equal(x, y) for x, y in zip(params(a), params(b), strict=True))


def test_frozen_layers_do_not_change():
    t = small_warehouse_trainer()
    assert t.layer_names() == ["critic.0", "critic.2", "actor.0", "actor.2"]
    t.freeze_layers(["actor.0", "critic.2"])
    before = dict(t.agent.named_parameters())
    before = {k: v.detach().clone() for k, v in before.items()}
    t.train(iterations=2)
    for name, p in t.agent.named_parameters():
        frozen = name.startswith(("actor.0.", "critic.2."))
        assert torch.equal(p, before[name]) == frozen, name
    assert t.state_dict()["frozen_layers"] == ["actor.0", "critic.2"]
    t.unfreeze_layers(["actor.0"])
    assert t.frozen_layers == {"critic.2"}
    with pytest.raises(KeyError):
        t.freeze_layers(["nope"])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("config_cls", [PPOConfig, GSPOConfig])
def test_mixed_precision_runs(precision, config_cls):
    """The networks really run in the lower precision (autocast), the weights stay fp32
    and learn, and fp16 goes through the gradient scaler."""
    cfg = config_cls(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * 2, hidden_sizes=[16],
                     num_minibatches=4, update_epochs=2)
    env = WarehouseEnv(2, num_agents=4, max_steps=24, layout_kwargs=dict(blocks_x=2, blocks_y=2))
    t = Trainer(env, cfg, precision=precision)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    seen: dict[str, set] = {"train": set(), "eval": set()}

    def record(module, inputs, output):
        seen["train" if torch.is_grad_enabled() else "eval"].add(output.dtype)

    handles = [m.register_forward_hook(record) for m in t.agent.modules()
               if isinstance(m, torch.nn.Linear)]
    before = {k: v.detach().clone() for k, v in t.agent.named_parameters()}
    scaled = []
    if t.algo.scaler is not None:
        real_scale = t.algo.scaler.scale
        t.algo.scaler.scale = lambda loss: scaled.append(loss.detach()) or real_scale(loss)
    m = t.train()
    for h in handles:
        h.remove()
    # every Linear ran in the low precision, in the rollout and in the update
    assert seen["train"] == {low} and seen["eval"] == {low}, seen
    assert all(p.dtype == torch.float32 for p in t.agent.parameters())  # fp32 master weights
    assert any(not torch.equal(p, before[k]) for k, p in t.agent.named_parameters())
    assert torch.isfinite(torch.tensor(m["losses/value_loss"]))
    assert ("precision/loss_scale" in m) == (precision == "fp16")
    if precision == "fp16":
        assert scaled and m["precision/loss_scale"] > 1  # the loss really was scaled


@pytest.mark.parametrize("config_cls", [PPOConfig, GSPOConfig])
def test_one_sample_minibatches_still_update_the_policy(config_cls):
    """num_minibatches = the rollout's size: advantage normalisation of one sample must
    not turn every update into a skipped NaN step (silently no learning)."""
    cfg = config_cls(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * 6, hidden_sizes=[16],
                     num_minibatches=2 * 4 * 16, update_epochs=1)
    t = Trainer(WarehouseEnv(2, num_agents=4, max_steps=24,
                             layout_kwargs=dict(blocks_x=2, blocks_y=2)), cfg)
    before = params(t)
    t.train(iterations=1)
    assert t.algo.skipped_steps == 0
    assert not all(torch.equal(b, p) for b, p in zip(before, params(t), strict=True))
