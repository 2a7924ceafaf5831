"""Presets (trainer/presets/*.yaml): each loads, each runs, and the warehouse defaults are
the configuration that produced the published figures."""

import dataclasses

import pytest
import yaml
from click.testing import CliRunner

from trainer.cli import train
from trainer.config import ConfigError, GSPOConfig, PPOConfig, load_config
from trainer.presets import list_presets, load_preset, preset_algo

SHIPPED = ["cleanrl", "continuous", "gspo", "gspo-radius", "gspo-replay", "gspo-shaper",
           "warehouse"]


def test_shipped_presets_load_as_valid_configs():
    assert list_presets() == SHIPPED
    for name in SHIPPED:
        algo = preset_algo(name)
        assert algo in ("ppo", "gspo")
        cfg = load_config(algo, preset=name)
        for key, value in load_preset(name).items():
            if key != "algo":
                assert getattr(cfg, key) == value, (name, key)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError,
                       match="unknown preset 'nope'; choose from cleanrl, continuous, gspo"):
        load_config("ppo", preset="nope")


def test_defaults_are_the_measured_warehouse_configuration():
    """The configuration of bench/trainer_warehouse.py's "ppo" variant (GSPO with its three
    switches off, which is PPO), which reached 5.85 return at 2M agent-steps."""
    bench = GSPOConfig(num_envs=8, num_steps=128, hidden_sizes=[128, 128], shaper=False,
                       radius=False, replay=False)
    ppo = PPOConfig()
    for f in dataclasses.fields(PPOConfig):
        if f.name != "clip_coef":
            assert getattr(ppo, f.name) == getattr(bench, f.name), f.name
    assert ppo.clip_coef == bench.epsilon_base
    assert GSPOConfig().num_steps == 128  # not the seed's 2048 x 160 slots per update
    assert load_config("ppo", preset="warehouse").total_steps == 2_000_000


def test_precedence_preset_then_file_then_set(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("update_epochs: 3\nreplay: true\nenv: {max_steps: 64}\n")
    cfg = load_config("gspo", path, ["update_epochs=2"], preset="gspo-shaper",
                      base={"num_minibatches": 5, "env": {"num_agents": 4}})
    assert (cfg.shaper, cfg.radius, cfg.replay) == (True, False, True)
    assert cfg.update_epochs == 2 and cfg.num_minibatches == 5
    assert cfg.total_steps == 2_000_000
    assert cfg.env == {"max_steps": 64}  # a config file's env replaces, as before


SMALL = ["--steps", "128", "--set", "num_envs=1", "--set", "num_steps=32",
         "--set", "env.num_agents=4", "--set", "env.max_steps=16", "--set", "hidden_sizes=[8]",
         "--set", "num_minibatches=2", "--set", "update_epochs=1", "--set", "eval_interval=0",
         "--device", "cpu", "--no-progress", "--no-store"]


@pytest.mark.parametrize("name", ["warehouse", "gspo-shaper"])
def test_presets_run_from_the_command_line(tmp_path, name):
    out = tmp_path / "run"
    result = CliRunner().invoke(train, ["--preset", name, *SMALL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["algo"] == preset_algo(name)
    assert written["num_minibatches"] == 2 and written["total_steps"] == 128
    if name == "gspo-shaper":
        assert (written["shaper"], written["radius"], written["replay"]) == (True, False, False)


def test_algo_flag_overrides_the_preset(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(train, ["--preset", "gspo", "--algo", "ppo", *SMALL,
                                        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "config.yaml").read_text())["algo"] == "ppo"


def test_unknown_preset_is_a_one_line_error():
    result = CliRunner().invoke(train, ["--preset", "fast", "--device", "cpu", "--no-store"])
    assert result.exit_code == 1
    assert result.output.strip().startswith("Error: unknown preset 'fast'; choose from")
