import pytest
import torch
from torch import nn

from trainer.agent import Agent
from trainer.algos.gspo import GSPO
from trainer.algos.radius import TrustRadius
from trainer.algos.replay import PrioritizedSampler
from trainer.algos.shaper import GradientShaper, hutchinson_diagonal
from trainer.config import GSPOConfig, PPOConfig
from trainer.devices import Precision
from trainer.envs.warehouse import WarehouseEnv
from trainer.train import Trainer


def test_hutchinson_matches_exact_hessian_diagonal():
    torch.manual_seed(0)
    n = 30
    m = torch.randn(n, n)
    a = m @ m.T / n + torch.diag(torch.rand(n) * 5)

    def f(x):
        return 0.5 * x @ a @ x + torch.sin(x).sum() + (x ** 4).sum() * 0.1

    x0 = torch.randn(n)
    exact = torch.diagonal(torch.autograd.functional.hessian(f, x0))
    x = nn.Parameter(x0.clone())
    (g,) = torch.autograd.grad(f(x), [x], create_graph=True)
    gen = torch.Generator().manual_seed(1)
    (est,) = hutchinson_diagonal([g], [x], probes=400, generator=gen)
    corr = torch.corrcoef(torch.stack([est, exact]))[0, 1]
    assert corr > 0.95, corr
    (one,) = hutchinson_diagonal([torch.autograd.grad(f(x), [x], create_graph=True)[0]], [x], 1,
                                 torch.Generator().manual_seed(1))
    assert torch.corrcoef(torch.stack([one, exact]))[0, 1] < corr  # more probes help


class Quadratic(nn.Module):
    """0.5 * (100 x0^2 + x1^2): x0 is stiff and, at this learning rate, oscillates."""

    def __init__(self):
        super().__init__()
        self.x = nn.Parameter(torch.tensor([1.0, 1.0]))

    def loss(self):
        return 0.5 * (100 * self.x[0] ** 2 + self.x[1] ** 2)


def run_quadratic(shaped: bool, steps: int = 60):
    model = Quadratic()
    opt = torch.optim.SGD(model.parameters(), lr=0.0199)  # lr * 100 = 1.99: on the edge
    shaper = GradientShaper(model, interval=5, generator=torch.Generator().manual_seed(0))
    trace = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model.loss()
        if shaped and shaper.wants_hessian:
            shaper.backward_with_hessian(loss)
            shaper.commit_curvature()
        else:
            loss.backward()
        if shaped:
            shaper.shape()
        opt.step()
        trace.append(model.x.detach().clone())
    return torch.stack(trace), shaper


def test_shaper_damps_the_oscillating_parameter():
    plain, _ = run_quadratic(shaped=False)
    shaped, shaper = run_quadratic(shaped=True)
    assert plain[-1, 0].abs() > 0.4                       # still bouncing between +-x
    assert shaped[-1, 0].abs() < 1e-3 * plain[-1, 0].abs()
    # the flat, non-oscillating coordinate is left (almost) alone
    assert shaped[-1, 1].item() == pytest.approx(plain[-1, 1].item(), rel=0.05)
    # for a diagonal Hessian one Rademacher probe is exact: z * (H z) = z^2 h = h
    assert shaper.curvature["x"].tolist() == [100.0, 1.0]


def make_gspo(**kw):
    torch.manual_seed(0)
    agent = Agent(6, 3, [32, 32])
    cfg = GSPOConfig(shaper=False, replay=False, **kw)
    return GSPO(agent, cfg, Precision("fp32", torch.device("cpu")))


def test_no_layer_update_exceeds_its_radius():
    gspo = make_gspo(learning_rate=0.05, radius_scale=0.02)
    x = torch.randn(64, 6)
    clipped = 0.0
    for i in range(20):
        before = {n: p.detach().clone() for n, p in gspo.agent.named_parameters()}
        _, logp, _, v, _ = gspo.agent.get_action_and_value(x, torch.zeros(64, dtype=torch.long))
        gspo.optimize(-(logp.mean()) + (v - i).pow(2).mean())
        clipped += gspo._stats["gspo/radius_clipped_fraction"][-1]
        after = dict(gspo.agent.named_parameters())
        for layer, rho in gspo.radius.last_radii.items():
            delta = torch.sqrt(sum(((after[f"{layer}.{k}"].detach() - before[f"{layer}.{k}"]) ** 2
                                    ).sum() for k in ("weight", "bias")))
            assert delta <= rho * (1 + 1e-5), (layer, float(delta), rho)
    assert clipped > 0  # the bound was active, so the assertion above had teeth


def test_small_steps_are_not_clipped():
    gspo = make_gspo(learning_rate=1e-6)
    x = torch.randn(8, 6)
    gspo.optimize(gspo.agent.get_value(x).pow(2).mean())
    assert gspo._stats["gspo/radius_clipped_fraction"] == [0.0]


def test_epsilon_decays_per_iteration_to_its_floor():
    r = TrustRadius(nn.Linear(2, 2), epsilon_base=0.2, epsilon_decay=0.995, epsilon_min=0.05)
    assert r.epsilon == 0.2
    r.end_iteration()
    assert r.epsilon == pytest.approx(0.199)
    r.iterations = 10_000
    assert r.epsilon == 0.05


def test_sensitive_layers_get_smaller_radii():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    r = TrustRadius(model, radius_scale=1.0, min_scale=0.1, max_scale=10)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[1].weight.grad *= 100  # layer "1" reacts far more strongly
    r.observe_gradients()
    radii = r.radii()
    norm = lambda m: torch.sqrt(sum((p ** 2).sum() for p in m.parameters())).item()  # noqa: E731
    assert radii["1"] / norm(model[1]) < 0.2 * 1.0 < radii["0"] / norm(model[0])


def test_replay_frequencies_match_priorities():
    gen = torch.Generator().manual_seed(0)
    s = PrioritizedSampler(5, alpha=0.7, generator=gen)
    s.update(torch.arange(5), torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0]))
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0]) ** 0.7
    expected = expected / expected.sum()
    n = 200_000
    idx, _ = s.sample(n, beta=0.5)
    counts = torch.bincount(idx, minlength=5).double()
    chi2 = ((counts - n * expected) ** 2 / (n * expected)).sum().item()
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001


def test_replay_importance_weights():
    s = PrioritizedSampler(4, alpha=1.0, generator=torch.Generator().manual_seed(0))
    s.update(torch.arange(4), torch.tensor([1.0, 1.0, 2.0, 4.0]))
    idx, w = s.sample(1000, beta=0.5)
    p = torch.tensor([1.0, 1.0, 2.0, 4.0]) / 8
    expected = (4 * p[idx]) ** -0.5 / (4 * p.min()) ** -0.5
    assert torch.allclose(w, expected)
    assert w.max() == 1.0 and w[idx == 3].max() == pytest.approx((0.25 / 1.0) ** 0.5)
    s.update(torch.tensor([0]), torch.tensor([0.0]))  # eps keeps it sampleable
    assert s.probabilities()[0] > 0


def warehouse_trainer(cfg):
    env = WarehouseEnv(2, num_agents=4, max_steps=24, layout_kwargs=dict(blocks_x=2, blocks_y=2))
    return Trainer(env, cfg)


SMALL = dict(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * 3, hidden_sizes=[16],
             num_minibatches=4, update_epochs=2, max_grad_norm=0.5)


def test_gspo_with_mechanisms_off_is_exactly_ppo():
    ppo = warehouse_trainer(PPOConfig(**SMALL, clip_coef=0.2))
    gspo = warehouse_trainer(GSPOConfig(**SMALL, epsilon_base=0.2, shaper=False, radius=False,
                                        replay=False))
    ppo.train()
    gspo.train()
    for a, b in zip(ppo.agent.parameters(), gspo.agent.parameters(), strict=True):
        assert torch.equal(a, b)


def _spy_shaper(t, log):
    """Record, per shaping step, how many gradient entries changed; check they only shrank."""
    real = t.algo.shaper.shape

    def shape():
        params = [p for p in t.agent.parameters() if p.grad is not None]
        before = [p.grad.clone() for p in params]
        stats = real()
        for p, g in zip(params, before, strict=True):
            assert (p.grad.abs() <= g.abs() * (1 + 1e-6)).all()  # damping never amplifies
        log.append(sum(int((p.grad != g).sum()) for p, g in zip(params, before, strict=True)))
        return stats

    t.algo.shaper.shape = shape


def _spy_radius(t, log):
    """Record, per step and layer, (update norm before projection, after, radius)."""
    radius = t.algo.radius
    real = radius.project

    def project(before):
        layers = radius._layers()

        def norms():
            return {n: float(radius._norm([p.detach() - o for p, o in
                                           zip(layers[n], before[n], strict=True)]))
                    for n in before}

        pre = norms()
        out = real(before)
        post = norms()
        log.append({n: (pre[n], post[n], radius.last_radii[n]) for n in before})
        return out

    radius.project = project


def _spy_replay(t, log):
    """Record, per update epoch, the drawn indices and the sampling probabilities."""
    real = t.algo.minibatches

    def minibatches(batch_size, progress):
        probs = t.algo.sampler.probabilities().clone()
        drawn = []
        for idx, weights in real(batch_size, progress):
            drawn.append(idx)
            yield idx, weights
        log.append((torch.cat(drawn), probs))

    t.algo.minibatches = minibatches


@pytest.mark.parametrize("mechanism,key", [("shaper", "gspo/mean_damping"),
                                           ("radius", "gspo/radius_clipped_fraction"),
                                           ("replay", "gspo/replay_beta")])
def test_each_mechanism_alone(mechanism, key):
    """Each mechanism, switched on alone, reports its metric and really acts: the shaper
    damps gradients, the radius bounds each layer's step by its own radius, replay draws
    minibatches by priority."""
    flags = {m: m == mechanism for m in ("shaper", "radius", "replay")}
    t = warehouse_trainer(GSPOConfig(**SMALL, hessian_interval=2, **flags))
    log: list = []
    {"shaper": _spy_shaper, "radius": _spy_radius, "replay": _spy_replay}[mechanism](t, log)
    m = t.train()
    assert key in m
    others = {"shaper": "gspo/mean_damping", "radius": "gspo/radius_clipped_fraction",
              "replay": "gspo/replay_beta"}
    assert all(k not in m for n, k in others.items() if n != mechanism)
    if mechanism == "radius":
        assert m["gspo/epsilon"] == pytest.approx(0.2 * 0.995 ** 2)  # used by update 3
    else:
        assert m["gspo/epsilon"] == 0.2

    if mechanism == "shaper":
        # once curvature is known (after the first Hessian step) gradients are damped
        assert log[0] == 0 and all(n > 0 for n in log[2:]), log
        assert 0 < m["gspo/mean_damping"] < 1
    elif mechanism == "radius":
        assert log
        clipped = 0
        for step in log:
            for layer, (pre, post, rho) in step.items():
                assert post <= rho * (1 + 1e-5), (layer, post, rho)
                clipped += pre > rho * (1 + 1e-5)
            radii = [rho for _, _, rho in step.values()]
            assert max(radii) > 10 * min(radii)  # a radius per layer, not one for all
        assert clipped > 0  # some layer wanted a bigger step and was pulled back
    else:
        uniques = [idx.unique().numel() / probs.numel() for idx, probs in log]
        assert max(uniques) < 0.9  # drawn with replacement: not PPO's permutation
        skewed = [(idx, probs) for idx, probs in log if probs.max() > 1.5 * probs.mean()]
        assert skewed  # priorities moved away from uniform
        # high-priority samples are drawn more often: the mean probability of the drawn
        # samples exceeds the 1/N of uniform draws
        lift = sum(float(probs[idx].mean() * probs.numel()) for idx, probs in skewed)
        assert lift / len(skewed) > 1.05, lift / len(skewed)


def test_frozen_layers_get_no_hessian_work():
    t = warehouse_trainer(GSPOConfig(**SMALL, hessian_interval=1))
    t.freeze_layers(["actor.0"])
    t.train()
    assert "actor.2.weight" in t.algo.shaper.curvature
    assert not any(k.startswith("actor.0.") for k in t.algo.shaper.curvature)
    assert "actor.0" not in t.algo.radius.last_radii


def test_replay_priorities_follow_gradient_magnitude():
    t = warehouse_trainer(GSPOConfig(**SMALL, shaper=False, radius=False))
    t.train(iterations=1)
    p = t.algo.sampler.priorities
    assert p.max() / p.mean() > 1.5  # no longer uniform after training on them
