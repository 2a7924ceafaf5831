"""Settings in `.vrl/config` are checked when set and when read: a bad value (by `vrl config
set` or by hand) is a one-line error naming the key, the value and what is allowed."""

import configparser
import math
import subprocess
import sys

import pytest
import torch
from helpers import vrl
from hypothesis import given
from hypothesis import strategies as st

from vrl import Repo
from vrl.config import SETTINGS, Config
from vrl.errors import ConfigError

BAD = [("gc.grace", "-5", ">= 0"), ("gc.grace", "soon", ">= 0"), ("gc.grace", "nan", ">= 0"),
       ("gc.grace", "inf", ">= 0"), ("diff.threshold", "-0.1", ">= 0"),
       ("core.fsync", "maybe", "true or false"), ("core.journal", "2", "true or false"),
       ("core.verify", "", "true or false"), ("user.name", " ", "non-empty")]


def _edit(root, section, key, value):
    """Write a value into .vrl/config without vrl's checks, as an editor would."""
    path = root / ".vrl" / "config"
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    if not parser.has_section(section):
        parser.add_section(section)
    parser.set(section, key, value)
    with open(path, "w") as f:
        parser.write(f)


@pytest.mark.parametrize("key, value, allowed", BAD)
def test_set_refuses_a_bad_value_and_changes_nothing(repo, key, value, allowed):
    section, name = key.split(".")
    before = repo.config.path.read_bytes()
    with pytest.raises(ConfigError) as err:
        repo.config.set(section, name, value)
    message = str(err.value)
    assert key in message and repr(value) in message and allowed in message
    assert "\n" not in message
    repo.config.save()
    assert repo.config.path.read_bytes() == before


@pytest.mark.parametrize("key, value, allowed", [b for b in BAD if b[0] != "user.name"])
def test_a_bad_value_written_by_hand_is_refused_when_read(repo, key, value, allowed):
    section, name = key.split(".")
    _edit(repo.workdir, section, name, value)
    with pytest.raises(ConfigError) as err:
        # opening reads core.* and gc.grace; a commit reads diff.threshold
        Repo(repo.workdir).commit({"w": torch.ones(2)}, message="c")
    message = str(err.value)
    assert key in message and repr(value) in message and allowed in message
    assert str(repo.config.path) in message and f"vrl config set {key}" in message
    assert "\n" not in message


def test_good_values_are_read_as_before(repo):
    for section, name, value in [("gc", "grace", "0"), ("gc", "grace", "1.5"),
                                 ("core", "fsync", "off"), ("diff", "threshold", "0")]:
        repo.config.set(section, name, value)
    repo.config.save()
    again = Repo(repo.workdir)
    assert again.config.getfloat("gc", "grace") == 1.5
    assert again.config.getbool("core", "fsync") is False
    assert again.config.getfloat("diff", "threshold") == 0.0


def test_unset_goes_back_to_the_default(repo):
    repo.config.set("gc", "grace", "10")
    repo.config.unset("gc", "grace")
    repo.config.save()
    assert Repo(repo.workdir).config.getfloat("gc", "grace") == 3600.0


@given(st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
def test_grace_is_accepted_exactly_when_it_is_a_finite_non_negative_number(tmp_path_factory,
                                                                         value):
    config = Config(tmp_path_factory.mktemp("c") / "config")
    text = str(value)
    try:
        number = float(text)
        ok = math.isfinite(number) and number >= 0
    except ValueError:
        ok = False
    if ok:
        config.set("gc", "grace", text)
        assert config.getfloat("gc", "grace") == number
    else:
        with pytest.raises(ConfigError, match="gc.grace"):
            config.set("gc", "grace", text)
        config.parser.set("gc", "grace", text)  # as if written by hand
        with pytest.raises(ConfigError, match="gc.grace"):
            config.getfloat("gc", "grace")


def test_every_default_passes_its_own_check():
    from vrl.config import DEFAULTS

    for key, (parse, _) in SETTINGS.items():
        section, name = key.split(".")
        if name in DEFAULTS.get(section, {}):
            parse(DEFAULTS[section][name])


# ---------------------------------------------------------------------------- CLI

def test_cli_config_set_get_unset_list(ws, capsys):
    vrl(capsys, "init")
    assert vrl(capsys, "config", "set", "gc.grace", "60") == (0, "", "")
    assert vrl(capsys, "config", "get", "gc.grace") == (0, "60\n", "")
    code, out, _ = vrl(capsys, "config", "list")
    assert code == 0 and "gc.grace=60\n" in out and "core.fsync=true\n" in out
    assert vrl(capsys, "config", "unset", "gc.grace")[0] == 0
    assert vrl(capsys, "config", "get", "gc.grace") == (0, "3600\n", "")


@pytest.mark.parametrize("key, value, allowed", BAD)
def test_cli_config_set_refuses_in_one_line(ws, capsys, key, value, allowed):
    vrl(capsys, "init")
    before = (ws / ".vrl" / "config").read_bytes()
    code, out, err = vrl(capsys, "config", "set", key, value)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert key in err and repr(value) in err and allowed in err
    assert (ws / ".vrl" / "config").read_bytes() == before


@pytest.mark.parametrize("key, hint", [("gc.grase", "unknown config key 'gc.grase'; known: "),
                                       ("remote.origin.url", "`vrl remote`")])
def test_cli_config_refuses_unknown_and_remote_keys(ws, capsys, key, hint):
    vrl(capsys, "init")
    code, out, err = vrl(capsys, "config", "set", key, "1")
    assert code == 1 and hint in err and err.count("\n") == 1


def test_cli_gc_grace_option_is_not_negative(ws, capsys):
    vrl(capsys, "init")
    code, out, err = vrl(capsys, "gc", "--grace", "-5")
    assert code == 2 and "--grace" in err and "-5" in err


def test_cli_hand_edited_grace_is_an_error_until_fixed(ws):
    """The whole path in a real `vrl` process: every command that reads gc.grace (opening
    the repository does) fails in one line and says how to fix it; `vrl config` fixes it."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "vrl", *args], capture_output=True,
                              text=True, cwd=ws)

    assert run("init").returncode == 0
    _edit(ws, "gc", "grace", "-5")
    for args in (["gc"], ["log"], ["status"]):
        failed = run(*args)
        assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
        assert failed.stderr.count("\n") == 1
        assert "gc.grace" in failed.stderr and "'-5'" in failed.stderr
        assert "seconds >= 0" in failed.stderr and "vrl config set gc.grace" in failed.stderr
    assert run("config", "set", "gc.grace", "120").returncode == 0
    fixed = run("log")
    assert fixed.returncode == 0, fixed.stderr
    assert "grace = 120" in (ws / ".vrl" / "config").read_text()


@pytest.mark.parametrize("value,lazy", [("false", False), ("no", False), ("true", True)])
def test_core_partial_false_is_not_partial(tmp_path, value, lazy):
    """`partial = false` under [core] is a full clone again: a fetch downloads tensors (it
    was read as a non-empty string, true whatever it said)."""
    from vrl.remote.local import LocalRemote
    from vrl.remote.transfer import clone, fetch, push

    upstream = Repo.init(tmp_path / "a")
    upstream.commit({"w": torch.zeros(3)}, message="first", env=False)
    store = LocalRemote(tmp_path / "remote")
    push(upstream, store, "origin", create=True)
    clone(str(tmp_path / "remote"), tmp_path / "b", metadata_only=True, checkout=False)
    second = upstream.commit({"w": torch.ones(3)}, message="second", env=False)
    push(upstream, store, "origin")
    _edit(tmp_path / "b", "core", "partial", value)
    other = Repo(tmp_path / "b")
    assert other.config.flag("core", "partial") is lazy
    fetch(other, store, "origin")
    tensor = other.read_manifest(other.read_commit(second).manifest).data_entries()["w"].id
    assert other.objects.has(tensor) is not lazy
