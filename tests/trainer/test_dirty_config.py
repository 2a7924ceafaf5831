"""Dirty-layer settings are the ``dirty`` section of the trainer config (issue 26 item 5):
``--set dirty.KEY=VALUE``, ``dirty:`` in a --config file or preset, stored with each
snapshot and kept by ``--from``; the ``--dirty-*`` flags are thin aliases of those keys and
the defaults live only in ``DirtyLayerConfig``."""

import dataclasses
import json
import re
import typing

import click
import pytest

from trainer.config import (
    DIRTY_RANGES,
    ConfigError,
    DirtyLayerConfig,
    config_from_dict,
    config_to_dict,
    fold_flat_dirty,
    load_config,
)
from trainer.dirty_layers import DirtyLayerConfig as ReExported

SMALL = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
         "--set", "num_minibatches=2", "--set", "update_epochs=1",
         "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--no-progress",
         "--device", "cpu"]
STEPS_PER_ITERATION = 2 * 16 * 4


def test_set_dirty_threshold_reaches_the_dirty_layer_config():
    config = load_config("ppo", overrides=["dirty.threshold=0.05", "dirty.enabled=true",
                                           "dirty.networks=critic", "dirty.max_depth=2"])
    assert isinstance(config.dirty, DirtyLayerConfig) and ReExported is DirtyLayerConfig
    assert config.dirty == DirtyLayerConfig(enabled=True, threshold=0.05,
                                            networks=("critic",), max_depth=2)
    assert load_config("gspo", overrides=["dirty.networks=[actor, critic]"]).dirty.networks \
        == ("actor", "critic")


def test_defaults_are_dirty_layer_configs_and_flags_have_none():
    from trainer.cli import DIRTY_ALIASES, train

    assert load_config("ppo").dirty == DirtyLayerConfig()
    options = {p.name: p for p in train.params if isinstance(p, click.Option)}
    dirty = [name for name in options if name.startswith("dirty_")]
    assert sorted(dirty) == sorted(DIRTY_ALIASES)
    for name in dirty:
        assert options[name].default is None, name  # an alias not given sets nothing
        assert DIRTY_ALIASES[name] in {f.name for f in dataclasses.fields(DirtyLayerConfig)}


def test_every_numeric_dirty_field_has_a_range():
    hints = typing.get_type_hints(DirtyLayerConfig)
    numeric = [f.name for f in dataclasses.fields(DirtyLayerConfig)
               if ({hints[f.name], *typing.get_args(hints[f.name])} & {int, float})]
    assert sorted(numeric) == sorted(DIRTY_RANGES)


def test_preset_and_yaml_config_set_the_dirty_section(tmp_path, monkeypatch):
    import trainer.presets as presets

    path = tmp_path / "c.yaml"
    path.write_text("dirty:\n  enabled: true\n  threshold: 0.01\n  criterion: drift\n")
    config = load_config("ppo", path, overrides=["dirty.window=5"])
    assert config.dirty == DirtyLayerConfig(enabled=True, threshold=0.01, criterion="drift",
                                            window=5)
    real = presets.load_preset
    monkeypatch.setattr(presets, "load_preset", lambda name: {
        "algo": "gspo", "dirty": {"enabled": True, "networks": ["critic"], "warmup": 7}}
        if name == "dirtytest" else real(name))
    # the file's dirty keys lay over the preset's, key by key
    config = load_config("gspo", path, preset="dirtytest")
    assert config.dirty == DirtyLayerConfig(enabled=True, threshold=0.01, criterion="drift",
                                            networks=("critic",), warmup=7)


def test_an_unknown_dirty_key_is_a_one_line_error_naming_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config("ppo", overrides=["dirty.treshold=0.1"])
    message = str(info.value)
    assert "\n" not in message and "dirty.treshold" in message
    assert all(f.name in message for f in dataclasses.fields(DirtyLayerConfig))
    path = tmp_path / "c.yaml"
    path.write_text("dirty:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match="unknown config key dirty.bogus; valid"):
        load_config("ppo", path)
    for override, message in [("dirty.window=0", "dirty.window must be in [1, inf), got 0"),
                              ("dirty.networks=critc", "critc is not a network of the policy"),
                              ("dirty.threshold=x", "dirty.threshold: expected float"),
                              ("dirty=3", "dirty: expected a mapping")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config("ppo", overrides=[override])


def test_the_flags_and_the_set_form_give_the_same_config(ws, capsys):
    from vrl.cli import main

    flags = ["--dirty-layers", "--dirty-threshold", "0.03", "--dirty-window", "2",
             "--dirty-refresh", "7", "--dirty-criterion", "drift", "--dirty-drift", "0.4",
             "--dirty-warmup", "1", "--dirty-prefix-only", "--dirty-max-depth", "1",
             "--dirty-networks", "critic,actor"]
    sets = ["dirty.enabled=true", "dirty.threshold=0.03", "dirty.window=2", "dirty.refresh=7",
            "dirty.criterion=drift", "dirty.drift=0.4", "dirty.warmup=1",
            "dirty.prefix_only=true", "dirty.max_depth=1", "dirty.networks=[critic, actor]"]
    outs = []
    for i, args in enumerate([flags, [w for s in sets for w in ("--set", s)]]):
        out = ws / f"out{i}"
        code = main(["train", *SMALL, "--steps", str(STEPS_PER_ITERATION), "--no-store",
                     "--out", str(out), *args])
        assert code == 0, capsys.readouterr().err
        outs.append((out / "config.yaml").read_text())
    assert outs[0] == outs[1]
    expected = DirtyLayerConfig(enabled=True, threshold=0.03, window=2, refresh=7,
                                criterion="drift", drift=0.4, warmup=1, prefix_only=True,
                                max_depth=1, networks=("critic", "actor"))
    assert load_config("ppo", ws / "out0" / "config.yaml").dirty == expected
    # a flag comes after --set, as --steps and --seed do
    from trainer.cli import dirty_overrides

    o = {"dirty_threshold": 0.5, "dirty_layers": False, "dirty_networks": "critic"}
    assert dirty_overrides(o) == ('dirty.enabled=false', 'dirty.threshold=0.5',
                                  'dirty.networks=["critic"]')


def _hparams(repo, rev):
    return repo.read_commit(repo.resolve(rev)).hparams


def test_from_keeps_the_stored_dirty_settings_and_a_flag_overrides_them(ws, capsys):
    from vrl import Repo
    from vrl.cli import main

    assert main(["init"]) == 0
    code = main(["train", *SMALL, "--steps", str(2 * STEPS_PER_ITERATION), "--iterations", "1",
                 "--branch", "a", "--set", "dirty.enabled=true", "--set",
                 "dirty.threshold=0.07", "--dirty-window", "1", "--dirty-warmup", "0"])
    assert code == 0, capsys.readouterr().err
    repo = Repo(ws)
    stored = _hparams(repo, "a")["dirty"]
    assert (stored["enabled"], stored["threshold"], stored["window"]) == (True, 0.07, 1)
    # --from keeps them (the resume command need not repeat them) ...
    code = main(["train", *SMALL, "--steps", str(3 * STEPS_PER_ITERATION), "--iterations",
                 "1", "--from", "a", "--branch", "b"])
    assert code == 0, capsys.readouterr().err
    assert _hparams(repo, "b")["dirty"] == stored
    assert "frozen_layers" in repo.read_commit(repo.resolve("b")).meta
    # ... and an explicit flag (or --set) overrides the stored value
    code = main(["train", *SMALL, "--steps", str(3 * STEPS_PER_ITERATION), "--iterations",
                 "1", "--from", "a", "--branch", "c", "--dirty-threshold", "0.5",
                 "--no-dirty-layers", "--set", "dirty.refresh=4"])
    assert code == 0, capsys.readouterr().err
    assert _hparams(repo, "c")["dirty"] == {**stored, "threshold": 0.5, "enabled": False,
                                            "refresh": 4}


@pytest.mark.parametrize("old", ["no_section", "flat_keys"])
def test_a_snapshot_from_before_the_dirty_section_still_resumes(ws, capsys, old):
    from vrl import Repo
    from vrl.cli import main

    assert main(["init"]) == 0
    code = main(["train", *SMALL, "--steps", str(STEPS_PER_ITERATION), "--branch", "new"])
    assert code == 0, capsys.readouterr().err
    repo = Repo(ws)
    commit = repo.read_commit(repo.resolve("new"))
    hparams = {k: v for k, v in commit.hparams.items() if k != "dirty"}
    if old == "flat_keys":
        hparams.update(dirty_layers=True, dirty_threshold=0.09, dirty_networks="critic")
    repo.branch("old", repo.resolve("new"))
    repo.commit(repo.load("new"), hparams=hparams, meta=dict(commit.meta), step=commit.step,
                ref="refs/heads/old", allow_empty=True, message="an older trainer's run")
    assert "dirty" not in _hparams(repo, "old")
    code = main(["train", *SMALL, "--steps", str(2 * STEPS_PER_ITERATION), "--from", "old",
                 "--branch", "resumed"])
    assert code == 0, capsys.readouterr().err
    dirty = _hparams(repo, "resumed")["dirty"]
    if old == "no_section":
        assert dirty == config_to_dict(load_config("ppo"))["dirty"]  # the defaults
    else:
        assert (dirty["enabled"], dirty["threshold"], dirty["networks"]) == \
            (True, 0.09, ["critic"])
    capsys.readouterr()
    assert main(["eval", "old", "--episodes", "1", "--no-baseline", "--json"]) == 0, \
        capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["algo"] == "ppo"


def test_flat_keys_fold_into_the_section_whose_own_values_win():
    folded = fold_flat_dirty({"seed": 3, "dirty_layers": True, "dirty_window": 4,
                              "dirty": {"window": 2}})
    assert folded == {"seed": 3, "dirty": {"enabled": True, "window": 2}}
    assert config_from_dict("ppo", folded).dirty == DirtyLayerConfig(enabled=True, window=2)
    assert fold_flat_dirty({"seed": 3}) == {"seed": 3}
