"""`vrl merge` / `Repo.merge`: merge commits of snapshots (vrl/merge.py)."""

import os

import numpy as np
import pytest
import torch
from helpers import assert_same, before_ref_moves, raw, vrl

from vrl import Repo
from vrl.errors import VrlError
from vrl.rng import rng_state


def _model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"0.weight": torch.randn(6, 4, generator=g),
            "0.bias": torch.randn(6, generator=g),
            "1.weight": torch.randn(3, 6, generator=g).to(torch.bfloat16),
            "1.half": torch.randn(5, generator=g).to(torch.float16),
            "1.wide": torch.randn(7, generator=g, dtype=torch.float64),
            "bn.num_batches_tracked": torch.tensor(seed, dtype=torch.int64)}


def _state(seed: int, opt_scale: float = 1.0) -> dict:
    """A training-style snapshot: model, optimizer (Adam-shaped), RNG and a counter."""
    g = torch.Generator().manual_seed(100 + seed)
    optim = {"state": {0: {"step": torch.tensor(float(seed + 1)),
                           "exp_avg": torch.randn(6, 4, generator=g) * opt_scale}},
             "param_groups": [{"lr": 0.1 * (seed + 1), "params": [0]}]}
    torch.manual_seed(seed)
    return {"model": _model(seed), "optimizer": optim, "rng": rng_state(),
            "iteration": torch.tensor(seed * 10)}


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def _refs(repo: Repo) -> dict:
    return {**repo.refs.list(), "HEAD": repo.refs.read_raw("HEAD")}


@pytest.fixture
def two(repo):
    """main and lr-low, forked from a common base: (repo, base, main, lr-low) ids."""
    base = repo.commit(_state(0), message="base", hparams={"lr": 1.0, "seed": 1})
    repo.branch("lr-low")
    main = repo.commit(_state(1), message="main", hparams={"lr": 1.0, "seed": 1})
    low = repo.commit(_state(2), message="low", hparams={"lr": 0.1, "seed": 1},
                      ref="refs/heads/lr-low")
    return repo, base, main, low


def test_average_of_identical_parents_is_bit_identical(repo):
    state = _state(3)
    state["model"]["nan"] = torch.tensor([float("nan"), -0.0, 1e-45, 3.0])
    repo.commit(state, message="a")
    repo.branch("b")
    repo.commit(state, message="b", allow_empty=True, ref="refs/heads/b")
    repo.branch("c")
    repo.commit(state, message="c", allow_empty=True, ref="refs/heads/c")
    # float64 weights that do not sum exactly: only keeping identical inputs as they are
    # gives the same bits back
    cid = repo.merge(["b", "c"], "weighted:0.1,0.7,0.2")
    merged = repo.load(cid)
    for name, tensor in state["model"].items():
        assert raw(merged["model"][name]) == raw(tensor), name
    mine = repo.read_manifest(repo.read_commit(cid).manifest).tensors
    theirs = repo.read_manifest(repo.read_commit(repo.resolve("b")).manifest).tensors
    assert all(mine[n].id == theirs[n].id for n in mine)  # stored by reference
    assert repo.read_commit(cid).meta["merge"]["tensors"]["combined"] == 0


def test_average_of_two_is_the_exact_elementwise_mean(two):
    repo, _, main, low = two
    cid = repo.merge("lr-low")
    c = repo.read_commit(cid)
    assert c.parents == (main, low)
    got = repo.load(cid)["model"]
    a, b = _model(1), _model(2)
    for name in ("0.weight", "0.bias"):  # float32 computed in float64, then cast
        want = ((_f64(a[name]) + _f64(b[name])) / 2).astype(np.float32)
        assert got[name].numpy().tobytes() == want.tobytes(), name
    want = ((_f64(a["1.half"]) + _f64(b["1.half"])) / 2).astype(np.float16)
    assert got["1.half"].numpy().tobytes() == want.tobytes()
    want = torch.from_numpy((_f64(a["1.weight"]) + _f64(b["1.weight"])) / 2).float()
    assert raw(got["1.weight"]) == raw(want.to(torch.bfloat16))  # as torch rounds
    # integers are never averaged: the first parent's
    assert got["bn.num_batches_tracked"].item() == 1


def test_weighted_three_parents(repo):
    repo.commit(_state(0), message="base")
    for name, seed in (("b", 2), ("c", 3)):
        repo.branch(name)
        repo.commit(_state(seed), message=name, ref=f"refs/heads/{name}")
    repo.commit(_state(1), message="main")
    cid = repo.merge(["b", "c"], "weighted:1,2,3")
    got = repo.load(cid)["model"]["0.weight"].numpy()
    x = [_f64(_model(s)["0.weight"]) for s in (1, 2, 3)]
    want = ((x[0] * 1 + x[1] * 2 + x[2] * 3) / 6).astype(np.float32)
    assert got.tobytes() == want.tobytes()
    c = repo.read_commit(cid)
    assert len(c.parents) == 3
    assert c.meta["merge"]["rules"] == [{"strategy": "weighted", "weights": [1.0, 2.0, 3.0]}]
    with pytest.raises(VrlError, match="2 weights for 3 snapshots"):
        repo.merge(["b", "c"], "weighted:1,2")


def test_take_by_pattern_the_last_matching_rule_wins(two):
    repo, _, main, low = two
    cid = repo.merge("lr-low", ["average", "take:0.*=lr-low"])
    mine = repo.read_manifest(repo.read_commit(cid).manifest).tensors
    theirs = repo.read_manifest(repo.read_commit(low).manifest).tensors
    ours = repo.read_manifest(repo.read_commit(main).manifest).tensors
    assert mine["model/0.weight"].id == theirs["model/0.weight"].id
    assert mine["model/0.bias"].id == theirs["model/0.bias"].id
    assert mine["model/1.half"].id not in (theirs["model/1.half"].id, ours["model/1.half"].id)
    repo.reset(main)
    before = _refs(repo)
    # the other way round, `average` decides every tensor: the take rule is refused
    with pytest.raises(VrlError, match="overrides it for every tensor"):
        repo.merge("lr-low", ["take:0.*=lr-low", "average"])
    with pytest.raises(VrlError, match="matches no tensor"):
        repo.merge("lr-low", ["average", "take:actor.*=lr-low"])
    with pytest.raises(VrlError, match="not one of the snapshots merged"):
        repo.merge("lr-low", ["average", f"take:0.*={repo.resolve('lr-low~1')}"])
    assert _refs(repo) == before


def test_task_arithmetic_against_the_merge_base(two):
    repo, base, main, low = two
    cid = repo.merge("lr-low", "task-arithmetic:0.7")
    c = repo.read_commit(cid)
    assert c.meta["merge"]["base"] == base
    got = repo.load(cid)["model"]["0.weight"].numpy()
    o, a, b = (_f64(_model(s)["0.weight"]) for s in (0, 1, 2))
    want = (o + 0.7 * ((a - o) + (b - o))).astype(np.float32)
    assert got.tobytes() == want.tobytes()


def test_task_arithmetic_needs_a_common_ancestor(repo):
    repo.commit(_state(1), message="main")
    repo.commit(_state(2), message="orphan", ref="refs/heads/other")  # a new root
    before = _refs(repo)
    with pytest.raises(VrlError, match="share no history"):
        repo.merge("other", "task-arithmetic:1")
    assert _refs(repo) == before
    cid = repo.merge("other")  # averaging needs no base
    assert repo.read_commit(cid).meta["merge"]["base"] is None


def test_optimizer_dropped_by_default_or_averaged(two):
    repo, _, main, low = two
    dropped = repo.load(repo.merge("lr-low"))
    assert dropped["optimizer"]["state"] == {}
    assert dropped["optimizer"]["param_groups"] == _state(1)["optimizer"]["param_groups"]
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(6, 4))]).load_state_dict(
        dropped["optimizer"])  # a fresh optimizer's state: it loads
    repo.reset(main)
    averaged = repo.load(repo.merge("lr-low", optimizer="average"))["optimizer"]
    a, b = (_state(s)["optimizer"]["state"][0] for s in (1, 2))
    want = ((_f64(a["exp_avg"]) + _f64(b["exp_avg"])) / 2).astype(np.float32)
    assert averaged["state"][0]["exp_avg"].numpy().tobytes() == want.tobytes()
    assert averaged["state"][0]["step"].item() == 2.0  # a step counter: the first parent's


def test_rng_counters_and_hparams_come_from_the_first_parent(two):
    repo, base, main, low = two
    cid = repo.merge("lr-low")
    merged, first = repo.load(cid), repo.load(main)
    assert_same(merged["rng"], first["rng"])
    assert_same(merged["iteration"], first["iteration"])
    c = repo.read_commit(cid)
    assert c.hparams == {"lr": 1.0, "seed": 1}
    recipe = c.meta["merge"]
    assert recipe["hparams_differ"] == ["lr"]
    assert recipe["revs"] == ["main", "lr-low"] and recipe["base"] == base
    assert recipe["strategy"] == ["average"] and recipe["optimizer"] == "drop"
    assert c.stats["parent"] == main  # statistics against the first parent


def test_refusals_leave_every_ref_as_it_was(two):
    repo, _, main, low = two
    bad = _state(2)
    bad["model"]["0.bias"] = torch.zeros(7)
    repo.commit(bad, message="wide", ref="refs/heads/wide")
    odd = _state(2)
    odd["model"]["0.bias"] = odd["model"]["0.bias"].double()
    repo.commit(odd, message="f64", ref="refs/heads/f64")
    before, objects = _refs(repo), sorted(repo.objects.ids())
    with pytest.raises(VrlError, match=r"'model/0\.bias': shape \[6\] in main but \[7\] in wide"):
        repo.merge("wide")
    with pytest.raises(VrlError, match=r"'model/0\.bias': float32 in main but float64 in f64"):
        repo.merge("f64")
    with pytest.raises(VrlError, match="unknown strategy"):
        repo.merge("lr-low", "median")
    for spec in ("weighted:1,nan", "task-arithmetic:inf", "weighted:1,x"):
        with pytest.raises(VrlError, match=f"{spec}: .* must be finite numbers"):
            repo.merge("lr-low", spec)
    with pytest.raises(VrlError, match="same snapshot"):
        repo.merge("main")
    assert _refs(repo) == before
    assert sorted(repo.objects.ids()) == objects  # nothing half-written
    assert repo.head() == main


@pytest.mark.parametrize("journal", [True, False])
def test_a_merge_is_never_re_parented_onto_a_commit_that_raced_it(tmp_path, journal):
    from vrl.errors import RefConflictError

    path = tmp_path / "repo"
    first = Repo.init(path)
    first.commit(_state(0), message="base", env=False)
    first.commit(_state(2), message="side", env=False, ref="refs/heads/side")
    merger, other = Repo(path, journal=journal), Repo(path)
    raced = []
    before_ref_moves(merger, lambda: raced or raced.append(
        other.commit(_state(1), message="raced", env=False)))
    with pytest.raises(RefConflictError, match="moved while merging"):
        merger.merge("side")
    assert Repo(path).head() == raced[0]  # the other commit stands, no merge on top of it


def test_branch_option_creates_the_branch_from_the_first_rev(two):
    repo, _, main, low = two
    cid = repo.merge(["main", "lr-low"], branch="soup")
    assert repo.branches()["soup"] == cid
    assert repo.read_commit(cid).parents == (main, low)
    assert repo.head() == main  # the current branch did not move
    with pytest.raises(VrlError, match="a new branch starts from the first revision"):
        repo.merge("lr-low", branch="new")
    again = repo.merge("lr-low", branch="soup", strategy="weighted:1,1")  # onto its head
    assert repo.read_commit(again).parents == (cid, low)


def test_cli_end_to_end_with_a_safetensors_workspace(ws, capsys):
    from safetensors.torch import save_file

    def policy(seed: int) -> None:
        m = _model(seed)
        del m["1.wide"]
        save_file(m, "policy.safetensors")

    vrl(capsys, "init")
    policy(0)
    vrl(capsys, "commit", "-m", "base", "--no-env", "--set", "lr=1")
    vrl(capsys, "checkout", "-b", "lr-low")
    policy(2)
    vrl(capsys, "commit", "-m", "low", "--no-env", "--set", "lr=0.1")
    vrl(capsys, "checkout", "main")
    policy(1)
    vrl(capsys, "commit", "-m", "main", "--no-env", "--set", "lr=1")
    policy(5)  # uncommitted: the merge would overwrite it
    code, _, err = vrl(capsys, "merge", "lr-low")
    assert code == 1 and "uncommitted changes" in err
    repo = Repo(".")
    head = repo.head()
    assert repo.head() == head
    vrl(capsys, "checkout", "-f", "main")
    code, out, err = vrl(capsys, "merge", "lr-low", "-s", "average", "-s", "take:0.*=lr-low",
                         "-m", "soup")
    assert code == 0, err
    repo = Repo(".")
    cid = repo.head()
    assert out.startswith(f"[main {cid[:12]}] soup\nMerge:  {head[:12]} ")
    assert "Wrote policy.safetensors" in out
    code, out, _ = vrl(capsys, "status")
    assert "no changes since HEAD" in out  # the workspace holds the merge
    with open("policy.safetensors", "rb") as f:  # in the layout of the files merged
        assert b"vrl.tree" not in f.read(4096)
    code, out, _ = vrl(capsys, "show")
    assert code == 0
    assert f"Merge:  {head[:12]} {repo.resolve('lr-low')[:12]}" in out
    assert "strategy: average, take:0.*=lr-low" in out and "hparams differing: lr" in out
    assert "  base:     " in out and "Metadata:" not in out
    code, out, _ = vrl(capsys, "log", "--oneline")
    lines = [line.split(" ", 1)[1] for line in out.splitlines()]  # (lineage notes aside)
    assert code == 0 and len(lines) == 4 and all(line.startswith(want) for line, want in zip(
        lines, ["(HEAD -> main) soup", "main", "(lr-low) low", "base"], strict=True)), lines
    code, out, _ = vrl(capsys, "fsck")
    assert code == 0 and "ok" in out
    code, _, err = vrl(capsys, "merge", "lr-low", "-s", "take:nothing*=lr-low")
    assert code == 1 and err.count("\n") == 1 and "matches no tensor" in err
    assert Repo(".").head() == cid


def test_a_merge_survives_push_clone_and_gc(ws, capsys):
    from safetensors.torch import save_file

    os.makedirs("a")
    os.chdir("a")
    vrl(capsys, "init")
    save_file({"w": torch.ones(3)}, "policy.safetensors")
    vrl(capsys, "commit", "-m", "base", "--no-env")
    vrl(capsys, "checkout", "-b", "side")
    save_file({"w": torch.full((3,), 3.0)}, "policy.safetensors")
    vrl(capsys, "commit", "-m", "side", "--no-env")
    vrl(capsys, "checkout", "main")
    save_file({"w": torch.full((3,), 2.0)}, "policy.safetensors")
    vrl(capsys, "commit", "-m", "main", "--no-env")
    code, _, err = vrl(capsys, "merge", "side")
    assert code == 0, err
    merged = Repo(".").head()
    vrl(capsys, "branch", "-d", "side")  # only the merge keeps it now
    code, _, err = vrl(capsys, "gc", "--now")
    assert code == 0, err
    assert Repo(".").fsck()["ok"]
    vrl(capsys, "remote", "add", "origin", str(ws / "shared.vrl"))
    code, _, err = vrl(capsys, "push", "-q", "--create")
    assert code == 0, err
    os.chdir(ws)
    code, _, err = vrl(capsys, "clone", str(ws / "shared.vrl"), "b", "-q")
    assert code == 0, err
    clone = Repo("b")
    assert clone.head() == merged and len(clone.read_commit(merged).parents) == 2
    assert clone.load()["w"].tolist() == [2.5, 2.5, 2.5]
    assert [e.commit.message for e in clone.log()][-1] == "base"
    assert len(clone.log()) == 4 and clone.fsck()["ok"]


def test_snapshotter_runs_merge_and_load_back_into_a_model(repo):
    """Two Snapshotter runs forked from one snapshot: their soup loads into the model and
    a fresh optimizer (dropped state), RNG from the first run."""
    from vrl import Snapshotter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(branch: str, seed: int) -> None:
        repo.load_into(model, "main", optimizer=opt)
        torch.manual_seed(seed)
        with Snapshotter(repo, model, opt, branch=branch, committer="thread",
                         env=False) as snap:
            for it in range(3):
                loss = model(torch.randn(16, 4)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                snap.step(it)

    repo.commit(model, opt, message="start")
    repo.branch("run-a")  # (a Snapshotter on a missing branch would start a new root)
    repo.branch("run-b")
    train("run-a", 1)
    train("run-b", 2)
    cid = repo.merge(["run-a", "run-b"], branch="soup")
    a, b = repo.load("run-a"), repo.load("run-b")
    soup = repo.load(cid)
    assert soup["optimizer"]["state"] == {}
    assert_same(soup["rng"], a["rng"])
    for name, tensor in soup["model"].items():
        want = ((_f64(a["model"][name]) + _f64(b["model"][name])) / 2).astype(np.float32)
        assert tensor.numpy().tobytes() == want.tobytes(), name
    fresh = torch.optim.Adam(model.parameters(), lr=1e-2)
    repo.load_into(model, "soup", optimizer=fresh)
    assert fresh.state_dict()["state"] == {}
    assert repo.read_commit(cid).meta["merge"]["base"] == repo.resolve("main")


def test_bfloat16_and_half_rounding_match_torch():
    from vrl.merge_math import combine
    from vrl.safetensors_file import RawTensor

    values = torch.tensor([1.0, -2.5, 3.0e38, -3.0e38, 1e-40, float("inf"), float("nan"),
                           -0.0, 1.00390625, 0.1], dtype=torch.float64)
    other = torch.tensor([1.0078125, -2.5, 3.0e38, 3.0e38, -1e-40, 1.0, 2.0, 0.0,
                          1.0, 0.3], dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, y = values.to(dtype), other.to(dtype)
        raws = [RawTensor(str(dtype).removeprefix("torch."), tuple(t.shape), raw(t))
                for t in (x, y)]
        want = ((x.double() + y.double()) / 2).float().to(dtype)
        got = torch.frombuffer(bytearray(combine(raws, (1.0, 1.0))), dtype=dtype)
        assert got[6].isnan()  # (torch's own NaN bits differ between its cast paths)
        got[6] = want[6] = 0
        assert raw(got) == raw(want), dtype


def test_float8_cannot_be_combined_but_can_be_taken(repo):
    state = {"w": torch.randn(4).to(torch.float8_e4m3fn), "b": torch.randn(3)}
    repo.commit(state, message="a")
    repo.branch("x")
    state2 = {"w": torch.randn(4).to(torch.float8_e4m3fn), "b": torch.randn(3)}
    repo.commit(state2, message="x", ref="refs/heads/x")
    with pytest.raises(VrlError, match="'w': vrl cannot compute in float8_e4m3fn"):
        repo.merge("x")
    cid = repo.merge("x", ["average", "take:w=x"])
    assert raw(repo.load(cid)["w"]) == raw(state2["w"])


def test_merging_safetensors_files_never_imports_torch(ws, capsys):
    import subprocess
    import sys

    from safetensors.numpy import save_file

    def policy(value: float) -> None:
        save_file({"w": np.full(4, value, np.float32), "b": np.arange(3, dtype=np.int64)},
                  "policy.safetensors")

    vrl(capsys, "init")
    policy(1.0)
    vrl(capsys, "commit", "-m", "base", "--no-env")
    vrl(capsys, "branch", "side")
    policy(2.0)
    vrl(capsys, "commit", "-m", "main", "--no-env")
    vrl(capsys, "checkout", "side")
    policy(4.0)
    vrl(capsys, "commit", "-m", "side", "--no-env")
    vrl(capsys, "checkout", "main")
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` fails
            "from vrl.cli import main; sys.exit(main(['merge', 'side', '--json']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    import json

    report = json.loads(done.stdout)
    assert report["merge"]["strategy"] == ["average"] and len(report["parents"]) == 2
    from safetensors.numpy import load_file

    assert load_file("policy.safetensors")["w"].tolist() == [3.0] * 4


def test_merge_base_is_the_best_common_ancestor():
    from vrl.merge import merge_base
    from vrl.objects import Commit

    graph = {"r": (), "a": ("r",), "b": ("r",), "m": ("a", "b"), "c": ("m",), "d": ("b",),
             "e": ("a",), "x": ()}
    order = list(graph)

    def read(oid):
        return Commit(manifest="0" * 64, parents=graph[oid], message="", author="",
                      time=f"2026-01-01T00:00:{order.index(oid):02d}Z")

    assert merge_base(read, ["c", "d"]) == "b"  # r is below b
    assert merge_base(read, ["c", "d", "e"]) == "r"  # an octopus: what all three share
    assert merge_base(read, ["c", "a"]) == "a"  # an ancestor of the other
    assert merge_base(read, ["d", "e"]) == "r"
    assert merge_base(read, ["c", "x"]) is None
    graph["f"], graph["g"] = ("a", "b"), ("b", "a")  # criss-cross: a and b both best
    order.extend(["f", "g"])
    assert merge_base(read, ["f", "g"]) == "b"  # the newer of the two


def test_tied_weights_stay_tied(repo):
    def tied(seed: int) -> dict:
        shared = torch.randn(5, 3, generator=torch.Generator().manual_seed(seed))
        return {"embed.weight": shared, "head.weight": shared, "bias": torch.zeros(5)}

    repo.commit(tied(0), message="a")
    repo.branch("b")
    repo.commit(tied(1), message="b", ref="refs/heads/b")
    repo.commit(tied(2), message="a2")
    merged = repo.load(repo.merge("b"))
    assert merged["embed.weight"].data_ptr() == merged["head.weight"].data_ptr()
    want = ((_f64(tied(2)["embed.weight"]) + _f64(tied(1)["embed.weight"])) / 2)
    assert merged["head.weight"].numpy().tobytes() == want.astype(np.float32).tobytes()
