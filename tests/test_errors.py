"""Bad input gives one clear line and exit code 1, never a traceback, and changes nothing
(issue 9, "clear errors"): commit options, hyperparameter files, hand-made commits, .pt
files that are not checkpoints or need pickle, and the hints vrl prints."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from helpers import vrl
from safetensors.torch import save_file

from vrl import Repo
from vrl.objects import canonical_json


def _policy(path, seed=0):
    g = torch.Generator().manual_seed(seed)
    save_file({"w": torch.randn(4, 4, generator=g), "b": torch.randn(4, generator=g)},
              str(path))


@pytest.fixture
def cli_repo(ws, capsys):
    """A repository with one commit of policy.safetensors, in the current directory."""
    assert vrl(capsys, "init")[0] == 0
    _policy(ws / "policy.safetensors")
    assert vrl(capsys, "commit", "-m", "first")[0] == 0
    return Repo(ws)


def assert_one_line_error(code, out, err, *needles):
    assert code == 1, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _state(repo):
    """Everything a failed command must leave alone: refs, reflogs, objects."""
    root = repo.vrl_dir
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "index"}


# ------------------------------------------------------------------ commit options


@pytest.mark.parametrize("bad", ["abc", "true", "[1, 2]", "", "1e-3x"])
def test_metric_must_be_a_number(cli_repo, capsys, bad):
    _policy("policy.safetensors", seed=1)
    before = _state(cli_repo)
    line = assert_one_line_error(*vrl(capsys, "commit", "--metric", f"return={bad}"),
                                 "return", "number")
    assert "Usage" not in line
    assert _state(cli_repo) == before


def test_metrics_accept_nan_inf_and_yaml12_floats(cli_repo, capsys):
    _policy("policy.safetensors", seed=1)
    code, out, err = vrl(capsys, "commit", "--metric", "a=nan", "--metric", "b=-inf",
                         "--metric", "c=3e-4", "--metric", "d=7", "--metric", "e=inf",
                         "--metric", "f=.5")
    assert code == 0, err
    metrics = Repo(".").read_commit(Repo(".").head()).metrics
    # non-finite floats are stored as strings by the canonical encoding
    assert metrics == {"a": "nan", "b": "-inf", "c": 3e-4, "d": 7, "e": "inf", "f": 0.5}
    assert isinstance(metrics["c"], float)


def test_set_and_hparams_file_parse_numbers_as_yaml_1_2(cli_repo, capsys, ws):
    _policy("policy.safetensors", seed=1)
    (ws / "hp.yaml").write_text("lr: 3e-4\nclip: 1E-2\nmode: off\nlayers: [64, 1e3]\n"
                                "octal: 0777\ntime: 1:30\nname: '3e-4'\n")
    code, _, err = vrl(capsys, "commit", "--hparams", "hp.yaml", "--set", "wd=5e-5",
                       "--set", "flag=yes", "--set", "gamma=0.99", "--set", "on=true")
    assert code == 0, err
    hp = Repo(".").read_commit(Repo(".").head()).hparams
    assert hp == {"lr": 3e-4, "clip": 1e-2, "mode": "off", "layers": [64, 1000.0],
                  "octal": 777, "time": "1:30", "name": "3e-4", "wd": 5e-5, "flag": "yes",
                  "gamma": 0.99, "on": True}
    assert isinstance(hp["lr"], float) and isinstance(hp["wd"], float)


@pytest.mark.parametrize("suffix,depth", [(".json", 100_000), (".json", 150),
                                          (".yaml", 100_000), (".yaml", 150)])
def test_deeply_nested_hparams_are_refused(cli_repo, capsys, ws, suffix, depth):
    _policy("policy.safetensors", seed=1)
    (ws / f"hp{suffix}").write_text('{"a": ' + "[" * depth + "]" * depth + "}")
    before = _state(cli_repo)
    assert_one_line_error(*vrl(capsys, "commit", "--hparams", f"hp{suffix}"), f"hp{suffix}")
    assert _state(cli_repo) == before


def test_deeply_nested_metadata_through_the_api_writes_nothing(tmp_path):
    from vrl.errors import MetadataError

    repo = Repo.init(tmp_path / "r")
    deep: object = 1
    for _ in range(500):
        deep = {"x": deep}
    with pytest.raises(MetadataError, match="nests deeper"):
        repo.commit({"w": torch.ones(3)}, hparams={"net": deep}, env=False)
    with pytest.raises(MetadataError, match="message"):
        repo.commit({"w": torch.ones(3)}, message=5, env=False)
    assert list(repo.objects.ids()) == [] and repo.head() is None


# ------------------------------------------------------------------ hand-made commits


def _hand_made(repo, **fields):
    """A commit object as a hand-made or remote one could be, with HEAD's branch on it."""
    head = repo.read_commit(repo.head())
    data = {**head.to_json(), "parents": [repo.head()], **fields}
    payload = canonical_json(data) if "raw" not in fields else fields["raw"]
    cid = repo.objects.write("commit", payload)
    repo.refs.update("refs/heads/main", cid)
    return cid


@pytest.mark.parametrize("fields,needle", [
    ({"message": 42}, "message"),
    ({"metrics": [1, 2]}, "metrics"),
    ({"hparams": "lr=1"}, "hparams"),
    ({"author": None}, "author"),
    ({"step": "ten"}, "step"),
    ({"parents": 7}, "parents"),
    ({"parents": ["not-an-id"]}, "parents"),
    ({"time": 1.5}, "time"),
    ({"stats": [None]}, "stats"),
])
@pytest.mark.parametrize("command", [["log"], ["log", "--oneline"], ["show"],
                                     ["log", "--metrics", "x"], ["log", "--json"]])
def test_odd_commit_field_types_give_a_clear_error(cli_repo, capsys, fields, needle, command):
    cid = _hand_made(cli_repo, **fields)
    assert_one_line_error(*vrl(capsys, *command), cid[:12], needle)


def test_deeply_nested_commit_object_is_a_clear_error(cli_repo, capsys):
    depth = 100_000
    head = cli_repo.read_commit(cli_repo.head()).to_json()
    text = canonical_json(head).decode()
    payload = (text[:-1] + ',"zz":' + "[" * depth + "]" * depth + "}").encode()
    cid = cli_repo.objects.write("commit", payload)
    cli_repo.refs.update("refs/heads/main", cid)
    for command in (["log"], ["show"]):
        assert_one_line_error(*vrl(capsys, *command), cid[:12], "nests")


def test_commit_with_odd_stats_contents_still_shows(cli_repo, capsys):
    """Well-typed fields with odd contents render; bad layer statistics are recomputed."""
    parent = cli_repo.head()
    _policy("policy.safetensors", seed=1)
    assert vrl(capsys, "commit", "-m", "second")[0] == 0
    cid = _hand_made(Repo("."), parents=[parent],
                     stats={"parent": parent, "layers": {"w": {"status": 3}}},
                     metrics={"odd": [1, {"x": None}], "s": "text"}, hparams={"n": None})
    code, out, err = vrl(capsys, "show")
    assert code == 0, err
    assert cid in out and "changed" in out
    code, out, err = vrl(capsys, "log", "--metrics", "odd,s")
    assert code == 0, err


# ------------------------------------------------------------------ .pt files


class Evil:
    """Any class: a .pt holding one needs pickle to rebuild it."""


def test_text_file_named_pt_is_not_blamed_on_pickle(cli_repo, capsys, ws):
    (ws / "junk.pt").write_text("hello, I am not a checkpoint\n")
    (ws / "empty.pt").write_bytes(b"")
    for name in ("junk.pt", "empty.pt"):
        line = assert_one_line_error(*vrl(capsys, "commit", name), name,
                                     "not a PyTorch checkpoint")
        assert "pickle" not in line.split("(")[0] and "refused" not in line


def test_pickle_refusal_names_the_global_and_gives_no_unsafe_advice(cli_repo, capsys, ws):
    torch.save({"w": torch.ones(2), "obj": Evil()}, ws / "evil.pt")
    before = _state(cli_repo)
    line = assert_one_line_error(*vrl(capsys, "commit", "evil.pt"), "evil.pt", "refused",
                                 "Evil")
    assert "weights_only" not in line and "likely succeed" not in line
    assert "add_safe_globals" not in line
    assert _state(cli_repo) == before


def test_refusal_for_other_pickle_instructions_gives_no_unsafe_advice(cli_repo, capsys, ws):
    (ws / "ext.pt").write_bytes(b"\x80\x02\x82\x01.")  # EXT1: the copyreg extension registry
    line = assert_one_line_error(*vrl(capsys, "commit", "ext.pt"), "ext.pt", "refused")
    assert "weights_only" not in line and "likely succeed" not in line


def test_pickle_refusal_prints_no_torch_warning(ws, tmp_path):
    import pickle
    import subprocess

    # a protocol-4 pickle makes torch warn ("Detected pickle protocol 4 ...") before refusing
    (ws / "evil.pt").write_bytes(pickle.dumps({"obj": Evil()}, protocol=4))
    torch.save({"w": torch.ones(2)}, ws / "legacy.pt", _use_new_zipfile_serialization=False)
    code = ("import sys; from vrl.cli import main; sys.exit(main(sys.argv[1:]))")
    env_root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": env_root, "VRL_AUTHOR": "t", "PATH": "/usr/bin:/bin",
           "PYTHONWARNINGS": "always"}
    run = lambda *a: subprocess.run([sys.executable, "-c", code, *a], cwd=ws, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    assert run("init").returncode == 0
    res = run("commit", "evil.pt")
    assert res.returncode == 1 and "Evil" in res.stderr
    assert res.stderr.strip().startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    assert "Warning" not in res.stderr, res.stderr
    res = run("commit", "legacy.pt")  # the legacy format still loads (it holds tensors only)
    assert res.returncode == 0 and "Warning" not in res.stderr, res.stderr


# ------------------------------------------------------------------ hints


def test_status_hint_for_a_missing_workspace_does_not_detach(cli_repo, capsys, ws):
    (ws / "policy.safetensors").unlink()
    code, out, _ = vrl(capsys, "status")
    assert code == 0
    hint = next(line for line in out.splitlines() if "not present" in line)
    assert "checkout HEAD" not in hint
    command = hint.split("`")[1].split()
    assert command[:2] == ["vrl", "checkout"]
    assert vrl(capsys, *command[1:])[0] == 0  # following the hint ...
    assert Repo(".").current_branch() == "main"  # ... leaves HEAD on the branch
    assert (ws / "policy.safetensors").exists()
    code, out, _ = vrl(capsys, "status")
    assert "no changes" in out


def test_nan_metric_round_trips_through_log_json(cli_repo, capsys):
    _policy("policy.safetensors", seed=2)
    assert vrl(capsys, "commit", "--metric", "loss=nan")[0] == 0
    code, out, _ = vrl(capsys, "log", "--json", "-n", "1")
    assert code == 0
    value = json.loads(out)[0]["metrics"]["loss"]
    assert value == "nan" or math.isnan(value)


def test_deeply_nested_checkpoint_is_refused_and_moderate_nesting_round_trips(tmp_path):
    from vrl.errors import MetadataError

    repo = Repo.init(tmp_path / "r")
    state: object = {"w": torch.arange(3.0)}
    for _ in range(60):
        state = {"k": state}
    cid = repo.commit(state, env=False)
    got = repo.load(cid)
    for _ in range(60):
        got = got["k"]
    assert torch.equal(got["w"], torch.arange(3.0))
    for _ in range(400):
        state = {"k": state}
    with pytest.raises(MetadataError, match="nests too deeply"):
        repo.commit(state, env=False)
    assert repo.head() == cid
