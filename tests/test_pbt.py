"""`vrl pbt`: rounds of `vrl train` runs, exploit commits (genealogy), explored values,
determinism under --seed, resume after the controller was stopped mid-round, bad input."""

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import commands_added

from trainer.pbt import apply_exploit, decide, explore, parse_explore
from trainer.pbt import pbt as pbt_command
from vrl import Repo
from vrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
         "--set", "num_minibatches=2", "--set", "update_epochs=2",
         "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--device", "cpu"]
PER_ITERATION = 2 * 16 * 4
ROUND = 3 * PER_ITERATION
FACTORS = (0.8, 1.2)
PBT = ["pbt", "p", "--population", "3", "--rounds", "2", "--steps-per-round", str(ROUND),
       "--explore", "learning_rate=factors:0.8,1.2",
       "--explore", "ent_coef=resample:choice:0,0.01", "--seed", "5", *SMALL]
MEMBERS = [f"pbt/p/m{i}" for i in range(3)]
SCRIPT = ("import sys; from vrl.cli import cli, main; from trainer.pbt import pbt; "
          "cli.add_command(pbt); sys.exit(main(sys.argv[1:]))")


@pytest.fixture(autouse=True, scope="module")
def registered():
    with commands_added(pbt_command):
        yield


def test_pbt_is_registered_as_a_vrl_command():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vrl.commands"]["pbt"] == "trainer.pbt:pbt"
    assert meta["project"]["optional-dependencies"]["ray"] == ["ray>=2.9"]


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def state_of(where):
    return json.loads((Path(where) / ".vrl/pbt/p/state.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished population of 3, 2 rounds, two members at a time."""
    where = tmp_path_factory.mktemp("pbt") / "store"
    where.mkdir()
    before = os.getcwd()
    os.chdir(where)
    try:
        os.environ.setdefault("VRL_AUTHOR", "tester")
        assert run("init")[0] == 0
        result = run(*PBT, "--workers", "2")
    finally:
        os.chdir(before)
    return where, result


def exploit_commit(repo, branch):
    """(id, commit) of the exploit commit on the branch's first-parent line."""
    oid = repo.resolve(branch)
    while oid:
        commit = repo.read_commit(oid)
        if "pbt" in commit.meta:
            return oid, commit
        oid = commit.parents[0] if commit.parents else None
    return None, None


def test_rounds_rank_exploit_and_record_the_genealogy(trained):
    where, (code, out, err) = trained
    assert code == 0, out + err
    repo = Repo(where)
    assert sorted(b for b in repo.branches() if b.startswith("pbt/")) == MEMBERS
    for branch in MEMBERS:  # every member trained both rounds
        assert repo.read_commit(repo.resolve(branch)).step == 2 * ROUND
    state = state_of(where)
    assert state["round"] == 2 and state["applied"]
    (first, second) = state["history"]
    assert len(first["exploits"]) == 1 and second["exploits"] == []  # none after the last
    x = first["exploits"][0]
    ranking = first["ranking"]
    assert x["member"] == ranking[-1] and x["from"] == ranking[0]  # worst copies best
    assert f"round 1: charts/episodic_return (round mean), best first: {ranking[0]}" in out
    loser, source = f"pbt/p/{x['member']}", f"pbt/p/{x['from']}"
    oid, commit = exploit_commit(repo, loser)
    assert oid is not None and exploit_commit(repo, source) == (None, None)
    record = commit.meta["pbt"]
    assert record["round"] == 1 and record["exploit"] == {"from": x["from"], "id": x["id"]}
    # the exploit commit's parent is the source's snapshot at the end of round 1, and it
    # holds that snapshot unchanged
    assert commit.parents == (x["id"],)
    src = repo.read_commit(x["id"])
    assert src.step == ROUND and commit.manifest == src.manifest
    assert x["id"] in [e.id for e in repo.log(source)]
    # explore: learning_rate multiplied by one of the factors, ent_coef kept or resampled
    old, new = record["explore"]["learning_rate"]
    assert old == src.hparams["learning_rate"]
    assert any(abs(new - old * f) <= 1e-4 * old for f in FACTORS), (old, new)
    assert record["explore"]["ent_coef"][1] in (0, 0.01)
    # the member trained round 2 with the explored values (its head's config says so)
    for key, (_, value) in record["explore"].items():
        assert commit.hparams[key] == value
        assert repo.read_commit(repo.resolve(loser)).hparams[key] == value
        assert state["members"][x["member"]]["hparams"][key] == value
    # the line it left is tagged; the reflog says why the branch jumped
    assert f"pbt/p/r1/{x['member']}" in repo.tags()
    code, log, _ = run("-C", str(where), "reflog", loser)
    assert code == 0 and f"pbt: exploit {x['member']} <- {x['from']} round 1" in log, log
    assert repo.current_branch() == "main"  # HEAD is back
    assert run("-C", str(where), "fsck")[0] == 0


def test_the_genealogy_command_it_prints_draws_every_member(trained, capsys, monkeypatch):
    where, (code, out, err) = trained
    assert "genealogy: vrl log --graph --oneline 'pbt/p/*'" in out
    monkeypatch.chdir(where)
    code, graph, err = run("log", "--graph", "--oneline", "pbt/p/*")
    assert code == 0, err
    for member in MEMBERS:
        assert f"({member}" in graph or f", {member}" in graph
    assert " exploits " in graph and "[forked from pbt/p/" in graph


def test_members_start_diverse_and_anneal_off(trained):
    where, _ = trained
    repo = Repo(where)
    # (an exploited member's own first line is kept by its tag pbt/p/r1/<member>)
    lines = {b: f"pbt/p/r1/{b[-2:]}" if f"pbt/p/r1/{b[-2:]}" in repo.tags() else b
             for b in MEMBERS}
    start = {b: repo.read_commit(repo.log(lines[b])[-1].id).hparams for b in MEMBERS}
    assert start["pbt/p/m0"]["learning_rate"] == 2.5e-4  # the config's value
    assert [start[b]["seed"] for b in MEMBERS] == [1, 2, 3]
    for b in MEMBERS[1:]:
        ratio = start[b]["learning_rate"] / 2.5e-4
        assert any(abs(ratio - f) < 1e-3 for f in FACTORS)
    assert not any(h["anneal_lr"] for h in start.values())


def test_running_it_again_does_nothing(trained, monkeypatch):
    where, _ = trained
    monkeypatch.chdir(where)
    repo = Repo(where)
    before = dict(repo.refs.list("refs/"))
    code, out, err = run("pbt", "p")
    assert code == 0, out + err
    assert "2 of 2 rounds done" in out and "start" not in out and "resume" not in out
    assert dict(repo.refs.list("refs/")) == before
    # another definition under the same name is refused
    code, out, err = run("pbt", "p", "--population", "4")
    assert code == 1 and "another population" in err and err.count("\n") == 1


def test_stopped_mid_round_resumes_and_decides_as_an_uninterrupted_run(trained, tmp_path):
    """The same command in a second store, stopped (SIGTERM) while the first member trains
    round 1, then run again: it continues that member in place, starts the others, and
    makes the same decisions with the same values as the uninterrupted run."""
    ws = tmp_path / "store"
    ws.mkdir()
    Repo.init(ws)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "VRL_AUTHOR": "tester"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *PBT], cwd=ws, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    repo = Repo(ws)
    deadline = time.monotonic() + 60
    while "pbt/p/m0" not in repo.branches() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "vrl pbt p" in err
    assert state_of(ws)["round"] == 0 and "pbt/p/m1" not in repo.branches()
    # a round is 3 tiny iterations: m0 may have reached its end before the signal; as if
    # it had stopped after its first iteration
    first = repo.log("pbt/p/m0")[-1].id
    repo.branch("pbt/p/m0", first, force=True)
    assert repo.read_commit(first).step == PER_ITERATION
    os.chdir(ws)
    code, out, err = run("pbt", "p")
    assert code == 0, out + err
    assert "resume  pbt/p/m0" in out and "start   pbt/p/m1" in out
    a, b = state_of(trained[0]), state_of(ws)
    assert b["members"] == a["members"]
    for ha, hb in zip(a["history"], b["history"], strict=True):
        assert hb["scores"] == ha["scores"] and hb["ranking"] == ha["ranking"]
        assert [(x["member"], x["from"], x["new"]) for x in hb["exploits"]] == \
            [(x["member"], x["from"], x["new"]) for x in ha["exploits"]]
    assert b["rng"] == a["rng"]


def test_decisions_come_from_the_seeded_rng():
    rules = parse_explore(["learning_rate=factors:0.8,1.2",
                           "ent_coef=resample:loguniform:1e-4,1e-2"])
    scores = {"m0": 1.0, "m1": None, "m2": 3.0, "m3": 2.0, "m4": 0.5, "m5": 2.5, "m6": 0.1,
              "m7": 0.2}

    def decisions(seed):
        rng = random.Random(seed)
        ranking, pairs = decide(rng, scores, 0.25, minimize=False)
        values = [explore(rng, {"learning_rate": 1e-3, "ent_coef": 0.01}, rules, 0.5)
                  for _ in pairs]
        return ranking, pairs, values

    ranking, pairs, values = decisions(1)
    assert ranking == ["m2", "m5", "m3", "m0", "m4", "m7", "m6", "m1"]  # no score: last
    assert [loser for loser, _ in pairs] == ["m6", "m1"] and \
        all(src in ("m2", "m5") for _, src in pairs)
    assert decisions(1) == (ranking, pairs, values)
    assert any(decisions(s)[1:] != (pairs, values) for s in range(2, 6))
    for v in values:
        assert v["learning_rate"] in (8e-4, 1.2e-3) and 1e-4 <= v["ent_coef"] <= 1e-2
    assert decide(random.Random(0), scores, 0.25, minimize=True)[0][0] == "m6"
    assert decide(random.Random(0), {"m0": 1.0, "m1": 2.0}, 0.25, False)[1] == [("m0", "m1")]


def test_a_resampled_choice_is_typed_as_set_reads_it():
    # YAML 1.1 reads 1e-4 as a string, which the trainer then refuses as a learning rate
    rules = parse_explore(["learning_rate=resample:choice:1e-4,2.5e-3",
                           "hidden_sizes=resample:choice:[64],[32]",
                           "anneal_lr=resample:choice:false"])
    for seed in range(8):
        value = explore(random.Random(seed),
                        {"learning_rate": 1e-3, "hidden_sizes": [16], "anneal_lr": True},
                        rules, 1.0)
        assert value["learning_rate"] in (1e-4, 2.5e-3)
        assert isinstance(value["learning_rate"], float)
        assert value["hidden_sizes"] in ([64], [32]) and value["anneal_lr"] is False


@pytest.mark.parametrize("args, message", [
    (["--explore", "learning_rate=factors:0.8,1.2"], "give --steps-per-round"),
    (["--steps-per-round", "10"], "give at least one --explore"),
    (["--steps-per-round", "10", "--explore", "learning_rate"], "give KEY=factors:"),
    (["--steps-per-round", "10", "--explore", "learning_rate=factors:0,1"],
     "factors must be positive"),
    (["--steps-per-round", "10", "--explore", "learning_rate=resample:normal:0,1"],
     "give KEY=factors:"),
    (["--steps-per-round", "10", "--explore", "lr=factors:0.8"], "--explore lr: not a ppo"),
    (["--steps-per-round", "10", "--explore", "learning_rate=factors:0.8", "--steps", "5"],
     "--steps is set by PBT"),
    (["--steps-per-round", "10", "--explore", "learning_rate=factors:0.8", "--branch", "x"],
     "--branch is set by PBT"),
    (["--steps-per-round", "10", "--explore", "learning_rate=factors:0.8", "--remote", "o"],
     "--remote is for --ray"),
    (["--steps-per-round", "10", "--explore", "ent_coef=resample:choice:-1"],
     "member m1: ent_coef"),
    (["--population", "1"], "--population must be at least 2"),
    (["--steps-per-round", "10", "--explore", "anneal_lr=factors:0.8"], "is not a number"),
    (["--steps-per-round", "10", "--explore", "learning_rate=factors:0.8", "--env",
      "pettingzoo:no_such_module:env"], "cannot import module 'no_such_module'"),
])
def test_bad_input_is_one_line_and_starts_nothing(ws, args, message):
    Repo.init(ws)
    code, out, err = run("pbt", "bad", *args, *SMALL)
    assert code != 0 and out == "" and err.count("\n") == 1 and message in err, err
    assert not (ws / ".vrl/pbt").exists() and not Repo(ws).branches()


def test_a_larger_rounds_exploits_after_the_old_last_round_and_goes_on(trained, tmp_path,
                                                                       monkeypatch):
    import shutil

    where = tmp_path / "store"
    shutil.copytree(trained[0], where)
    monkeypatch.chdir(where)
    code, out, err = run("pbt", "p", "--rounds", "3")
    assert code == 0, out + err
    assert "round 2: " in out and "round 3/3: members to 1152 steps" in out
    state = state_of(where)
    assert [h["round"] for h in state["history"]] == [1, 2, 3]
    assert not state["history"][1]["final"] and len(state["history"][1]["exploits"]) == 1
    assert state["history"][2]["final"] and state["history"][2]["exploits"] == []
    repo = Repo(where)
    x = state["history"][1]["exploits"][0]
    oid, commit = exploit_commit(repo, f"pbt/p/{x['member']}")
    assert commit.meta["pbt"]["round"] == 2 and commit.parents == (x["id"],)
    assert all(repo.read_commit(repo.resolve(b)).step == 3 * ROUND for b in MEMBERS)


def test_first_seed_offsets_the_members_seeds_and_is_part_of_the_definition(ws, monkeypatch):
    Repo.init(ws)
    monkeypatch.chdir(ws)
    args = ["pbt", "s", "--population", "2", "--rounds", "1", "--steps-per-round",
            str(PER_ITERATION), "--explore", "learning_rate=factors:0.8,1.2",
            "--first-seed", "7", *SMALL]
    code, out, err = run(*args)
    assert code == 0, out + err
    repo = Repo(ws)
    assert [repo.read_commit(repo.resolve(f"pbt/s/m{i}")).hparams["seed"]
            for i in range(2)] == [7, 8]
    state = json.loads((ws / ".vrl/pbt/s/state.json").read_text())
    assert [m["seed"] for m in state["members"].values()] == [7, 8]
    code, out, err = run("pbt", "s", "--first-seed", "1")
    assert code != 0 and "exists with another first_seed" in err, err
    assert run("pbt", "s")[0] == 0  # the definition is stored: no need to repeat it


def test_an_exploit_stopped_after_the_jump_keeps_the_old_line_tagged(ws, monkeypatch):
    import numpy as np

    repo = Repo.init(ws)
    src = repo.commit({"w": np.ones(2, np.float32)}, env=False, step=8,
                      hparams={"learning_rate": 0.1}, ref="refs/heads/pbt/x/m0")
    old = repo.commit({"w": np.zeros(2, np.float32)}, env=False, step=8,
                      hparams={"learning_rate": 0.2}, ref="refs/heads/pbt/x/m1")
    args = (repo, "x", 1, "m1", "m0", src, {"learning_rate": 0.2}, {"learning_rate": 0.12})
    commit = Repo.commit

    def power_cut(self, *a, **kw):
        raise OSError("power cut")

    monkeypatch.setattr(Repo, "commit", power_cut)  # after the branch jumped, before its commit
    with pytest.raises(OSError):
        apply_exploit(*args)
    monkeypatch.setattr(Repo, "commit", commit)
    assert repo.resolve("pbt/x/m1") == src and repo.tags()["pbt/x/r1/m1"] == old
    cid = apply_exploit(*args)  # the controller applies its decision again
    assert repo.tags()["pbt/x/r1/m1"] == old  # the line it left is still reachable
    c = repo.read_commit(cid)
    assert c.parents == (src,) and c.meta["pbt"]["exploit"]["id"] == src
    assert c.hparams["learning_rate"] == 0.12
    assert apply_exploit(*args) == cid == repo.resolve("pbt/x/m1")  # and once only
