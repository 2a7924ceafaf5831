"""Diffs of training snapshots: model layers first, optimizer state by parameter, other
state apart, step counters out of the statistics, natural order, --only."""

import json
import math

import pytest
import torch
from helpers import vrl

from vrl.diff import StateLayout, is_counter, natural_key


def training_state(model, opt, iteration):
    return {"model": model.state_dict(), "algo": {"optimizer": opt.state_dict()},
            "rng": {"torch": torch.get_rng_state()},
            "env": {"pos": torch.full((3,), iteration)},
            "iteration": iteration}


def train_steps(model, opt, n):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()


def make_run(repo, declare=True):
    """A first snapshot of a 13-layer MLP trained 3 Adam steps (13 so that `model/2` and
    `model/10` test the natural order); ``declare``: the metadata the trainer writes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(12)],
                                torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    train_steps(model, opt, 3)
    names = [n for n, _ in model.named_parameters()]
    meta = {"state_layout": {"model_prefix": "model/", "optimizer_params": names}}
    repo.commit(training_state(model, opt, 1), message="a", env=False,
                meta=meta if declare else None)
    return model, opt, meta


def test_natural_order_and_counters():
    assert sorted(["state/10", "state/2", "state/1/x", "a10b", "a9b"], key=natural_key) == [
        "a9b", "a10b", "state/1/x", "state/2", "state/10"]
    assert is_counter("algo/optimizer/state/3/step", ())
    assert not is_counter("algo/optimizer/state/3/step", (1,))  # not a scalar
    assert not is_counter("model/log_alpha", ())


def test_training_snapshot_summary_and_sections(repo):
    model, opt, meta = make_run(repo)
    for p in model[0].parameters():  # frozen: no gradient, so Adam leaves its state alone
        p.requires_grad_(False)
    train_steps(model, opt, 1)
    cid = repo.commit(training_state(model, opt, 2), message="b", env=False, meta=meta)
    diff = repo.diff(cid).with_layout(repo.read_commit(cid).meta)
    names = [lc.layer for lc in diff.layers]
    assert names == sorted(names, key=natural_key)
    assert names.index("model/2") < names.index("model/10")
    model_layers = diff.section("model")
    assert [lc.layer for lc in model_layers][:3] == ["model/0", "model/1", "model/2"]
    assert len(model_layers) == 13
    assert {lc.layer for lc in diff.section("other")} == {"env", "rng"}
    frozen = [lc for lc in model_layers if lc.layer == "model/0"][0]
    assert frozen.status == "unchanged" and not frozen.material
    optim = {diff.layout.parameter(lc.layer): lc for lc in diff.section("optimizer")}
    assert optim["0.weight"].status == "unchanged"
    assert optim["12.bias"].material
    text = diff.summary()
    moved = sum(lc.material for lc in model_layers)
    assert text.startswith(f"{moved} of 13 model layers changed materially; optimizer state "
                           f"of {len(optim) - 2} of 26 parameters changed materially; "
                           "other state changed: env, rng")


def test_step_counter_is_left_out_of_the_statistics(repo):
    """Adam's `step` went 3 -> 4: on the old code it dominated the layer's relative change
    (|4-3| against moments of ~1e-2) and made every optimizer entry material."""
    model, opt, meta = make_run(repo)
    old = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    train_steps(model, opt, 1)
    cid = repo.commit(training_state(model, opt, 2), message="b", env=False, meta=meta)
    new = opt.state_dict()["state"][0]
    expected = math.sqrt(sum(float((new[k] - old[k]).pow(2).sum())
                             for k in ("exp_avg", "exp_avg_sq"))) / math.sqrt(
        sum(float(old[k].pow(2).sum()) for k in ("exp_avg", "exp_avg_sq")))
    layer = {lc.layer: lc for lc in repo.diff(cid).layers}["algo/optimizer/state/0"]
    assert layer.rel == pytest.approx(expected, rel=1e-4)
    assert layer.max_abs < 0.5  # the counter moved by 1.0


def test_counter_only_change_is_not_material(repo):
    repo.commit({"opt": {"state": {"0": {"step": torch.tensor(3.0),
                                         "m": torch.ones(4)}}}}, env=False)
    cid = repo.commit({"opt": {"state": {"0": {"step": torch.tensor(4.0),
                                               "m": torch.ones(4)}}}}, env=False)
    (layer,) = repo.diff(cid).layers
    assert layer.status == "changed" and layer.rel == 0.0 and not layer.material


def test_layout_is_derived_without_metadata(repo):
    make_run(repo, declare=False)
    diff = repo.diff("HEAD")
    assert diff.layout == StateLayout("model/")
    assert diff.summary().startswith("13 of 13 model layers changed materially; "
                                     "optimizer state of 26 of 26 parameters")
    plain = StateLayout.derive(["0", "2", "actor.0"])
    assert plain.model_prefix is None and plain.kind("anything") == "model"


def test_cli_diff_sections_only_and_json(ws, capsys):
    from vrl import Repo

    repo = Repo.init(ws)
    model, opt, meta = make_run(repo)
    train_steps(model, opt, 1)
    repo.commit(training_state(model, opt, 2), message="b", env=False, meta=meta)
    code, out, _ = vrl(capsys, "diff", "HEAD")
    assert code == 0
    blocks = out.split("\n\n")
    assert blocks[0].splitlines()[0].split()[:3] == ["model", "layer", "(model/)"]
    rows = [line.split()[0] for line in blocks[0].splitlines()[1:]]
    assert rows == [str(i) for i in range(13)]  # natural order, prefix stripped
    optim = blocks[1].splitlines()
    assert optim[0].split()[:3] == ["optimizer", "state", "parameter"]
    assert optim[1].split()[:2] == ["algo/optimizer/state/0", "0.weight"]
    assert optim[3].split()[:2] == ["algo/optimizer/state/2", "1.weight"]
    assert optim[-1].split()[:2] == ["algo/optimizer/state/25", "12.bias"]
    assert blocks[2].splitlines()[0].startswith("other state (not a layer)")
    assert out.splitlines()[-1].startswith("13 of 13 model layers changed materially")

    code, out, _ = vrl(capsys, "diff", "HEAD", "--only", "model/1", "--only", "rng")
    assert code == 0
    rows = [line.split()[0] for line in out.split("\n\n")[0].splitlines()[1:]]
    assert rows == ["1", "10", "11", "12"]
    assert "optimizer state" not in out
    assert out.splitlines()[-1].startswith(
        "4 of 4 model layers changed materially (only model/1, rng); other state changed: rng")

    code, out, _ = vrl(capsys, "show", "HEAD", "--json", "--only", "algo/")
    layers = json.loads(out)["diff"]["layers"]
    assert layers["algo/optimizer/state/3"] == {**layers["algo/optimizer/state/3"],
                                                "kind": "optimizer", "parameter": "1.bias"}
    assert all(v["kind"] == "optimizer" for v in layers.values())


def test_only_on_a_plain_checkpoint(repo):
    repo.commit({"actor.0.weight": torch.zeros(2), "critic.0.weight": torch.zeros(2)},
                env=False)
    cid = repo.commit({"actor.0.weight": torch.ones(2), "critic.0.weight": torch.ones(2)},
                      env=False)
    diff = repo.diff(cid).with_only(["actor"])
    assert [lc.layer for lc in diff.layers] == ["actor.0"]
    assert diff.summary().startswith("1 of 1 layers changed materially (only actor); ")
