import math

import pytest
import torch

from trainer.agent import Agent
from trainer.algos.ppo import PPO, compute_gae, ppo_loss
from trainer.config import PPOConfig
from trainer.devices import Precision


def test_gae_hand_computed():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])  # the episode ends with step 1
    adv, ret = compute_gae(rewards, values, dones, torch.tensor([2.0]), gamma=0.5,
                           gae_lambda=0.5)
    # t=2: 3 + .5*2 - 1.5 = 2.5 ; t=1: 2 - 1 = 1 (no bootstrap) ; t=0: 1 + .5*1 - .5 + .25*1
    assert adv.squeeze(1).tolist() == pytest.approx([1.25, 1.0, 2.5])
    assert ret.squeeze(1).tolist() == pytest.approx([1.75, 2.0, 4.0])


def test_gae_lambda_one_is_discounted_return_minus_value():
    torch.manual_seed(0)
    r, v = torch.rand(5, 2), torch.rand(5, 2)
    nv = torch.rand(2)
    adv, _ = compute_gae(r, v, torch.zeros(5, 2), nv, gamma=0.9, gae_lambda=1.0)
    g = nv.clone()
    for t in reversed(range(5)):
        g = r[t] + 0.9 * g
        assert torch.allclose(adv[t], g - v[t], atol=1e-6)


def loss_inputs():
    ratio = torch.tensor([1.5, 0.5])
    return dict(newlogprob=ratio.log(), entropy=torch.tensor([0.6, 0.4]),
                newvalue=torch.tensor([1.0, 2.0]), mb_logprobs=torch.zeros(2),
                mb_advantages=torch.tensor([1.0, 1.0]), mb_returns=torch.tensor([1.5, 1.0]),
                mb_values=torch.tensor([0.5, 2.5]))


def test_ppo_loss_hand_computed():
    loss, stats = ppo_loss(**loss_inputs(), clip_coef=0.2, ent_coef=0.01, vf_coef=0.5,
                           norm_adv=False)
    # policy: max(-1.5, -1.2) and max(-0.5, -0.8) -> mean(-1.2, -0.5) = -0.85
    assert stats["losses/policy_loss"].item() == pytest.approx(-0.85)
    # value: max(0.25, (0.7-1.5)^2) and max(1.0, (2.3-1)^2) -> 0.5 * mean(.64, 1.69)
    assert stats["losses/value_loss"].item() == pytest.approx(0.5825)
    assert stats["losses/entropy"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-0.85 - 0.01 * 0.5 + 0.5 * 0.5825)
    assert stats["losses/clipfrac"].item() == 1.0
    kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert stats["losses/approx_kl"].item() == pytest.approx(kl, rel=1e-5)


def test_ppo_loss_unclipped_value_and_weights():
    _, stats = ppo_loss(**loss_inputs(), clip_coef=0.2, ent_coef=0.0, vf_coef=0.5,
                        clip_vloss=False, norm_adv=False, weights=torch.tensor([2.0, 0.0]))
    assert stats["losses/policy_loss"].item() == pytest.approx(-1.2)
    assert stats["losses/value_loss"].item() == pytest.approx(0.5 * (2 * 0.25) / 2)


def test_advantage_normalisation():
    inputs = loss_inputs()
    inputs["mb_advantages"] = torch.tensor([3.0, 1.0])  # normalised to +-1/sqrt(2)
    _, stats = ppo_loss(**inputs, clip_coef=0.2, ent_coef=0.0, vf_coef=0.5)
    a = 1 / math.sqrt(2)
    expected = (max(-a * 1.5, -a * 1.2) + max(a * 0.5, a * 0.8)) / 2
    assert stats["losses/policy_loss"].item() == pytest.approx(expected, rel=1e-5)


def test_one_sample_minibatch_is_not_normalised_to_nan():
    inputs = {k: v[:1] for k, v in loss_inputs().items()}
    inputs["mb_advantages"] = torch.tensor([3.0])
    loss, stats = ppo_loss(**inputs, clip_coef=0.2, ent_coef=0.0, vf_coef=0.5)
    assert torch.isfinite(loss)
    assert stats["losses/policy_loss"].item() == pytest.approx(-3.0 * 1.2)  # clipped ratio


def make_ppo(precision="fp32"):
    torch.manual_seed(0)
    agent = Agent(3, 2, [8])
    return PPO(agent, PPOConfig(), Precision(precision, torch.device("cpu")))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_non_finite_gradient_step_is_skipped_and_counted(precision):
    ppo = make_ppo(precision)
    before = [p.detach().clone() for p in ppo.agent.parameters()]
    x = torch.randn(4, 3)
    loss = ppo.agent.get_value(x).sum() * float("nan")
    applied, _ = ppo.optimize(loss)
    assert not applied and ppo.skipped_steps == 1
    assert all(torch.equal(b, p) for b, p in zip(before, ppo.agent.parameters(), strict=True))
    applied, _ = ppo.optimize(ppo.agent.get_value(x).sum())
    assert applied and ppo.skipped_steps == 1
    assert not all(torch.equal(b, p) for b, p in zip(before, ppo.agent.parameters(),
                                                     strict=True))
