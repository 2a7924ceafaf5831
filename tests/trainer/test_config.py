import dataclasses

import pytest

from trainer.config import (
    RANGES,
    ConfigError,
    GSPOConfig,
    PPOConfig,
    config_to_dict,
    load_config,
    parse_override,
)


def test_gspo_defaults_are_the_seeds():
    c = GSPOConfig()
    assert (c.gamma, c.gae_lambda, c.epsilon_base, c.epsilon_decay) == (0.99, 0.95, 0.2, 0.995)
    assert (c.max_grad_norm, c.hessian_interval, c.update_epochs) == (0.3, 5, 10)
    # num_steps is per slot: the seed's 2048 would be 2048 x 160 samples per warehouse update
    assert (c.num_minibatches, c.num_steps) == (32, 128)
    assert 0 < c.epsilon_min < c.epsilon_base


def test_every_field_has_a_docstring():
    import ast
    import inspect

    import trainer.config as mod

    tree = ast.parse(inspect.getsource(mod))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (
                        f"{node.name}.{stmt.target.id} has no docstring")


@pytest.mark.parametrize("text,expected", [
    ("learning_rate=1e-3", ("learning_rate", 1e-3)),
    ("anneal_lr=false", ("anneal_lr", False)),
    ("hidden_sizes=[32, 16]", ("hidden_sizes", [32, 16])),
    ("target_kl=null", ("target_kl", None)),
    ("env.num_agents=5", ("env.num_agents", 5)),
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo: gspo\nnum_steps: 64\nlearning_rate: 1\nenv:\n  num_agents: 4\n")
    cfg = load_config("gspo", path, ["num_steps=32", "env.max_steps=10", "replay=false"])
    assert isinstance(cfg, GSPOConfig)
    assert cfg.num_steps == 32 and cfg.learning_rate == 1.0
    assert isinstance(cfg.learning_rate, float)
    assert cfg.env == {"num_agents": 4, "max_steps": 10}
    assert cfg.replay is False
    assert config_to_dict(cfg)["algo"] == "gspo"


@pytest.mark.parametrize("override", ["nope=1", "num_steps=1.5", "anneal_lr=3",
                                      "hidden_sizes=4", "gamma=abc", "novalue"])
def test_bad_overrides_are_rejected(override):
    with pytest.raises(ConfigError):
        load_config("ppo", None, [override])


def test_unknown_algo():
    with pytest.raises(ConfigError):
        load_config("a2c")


def test_ppo_has_no_gspo_fields():
    with pytest.raises(ConfigError):
        load_config("ppo", None, ["shaper=true"])
    assert PPOConfig().clip_coef == 0.2


def test_config_file_and_overrides_read_numbers_as_yaml_1_2(tmp_path):
    """PyYAML (YAML 1.1) reads 3e-4 as a string; the trainer's YAML is 1.2."""
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 3e-4\nent_coef: 1E-2\nenv:\n  mode: off\n  level: 010\n")
    cfg = load_config("ppo", path, ["vf_coef=5e-1", "env.tag=yes", "max_grad_norm=1e0"])
    assert cfg.learning_rate == 3e-4 and cfg.ent_coef == 1e-2
    assert cfg.vf_coef == 0.5 and cfg.max_grad_norm == 1.0
    # YAML 1.1 booleans and octals are plain strings and decimals in 1.2
    assert cfg.env == {"mode": "off", "level": 10, "tag": "yes"}
    assert parse_override("x=relu") == ("x", "relu")  # words with an "e" stay words
    assert parse_override("x='1e-3'") == ("x", "1e-3")  # quoted: a string


# 1500 levels exceed Python's default recursion limit (1000) as 5000 did, in a quarter of
# the time
@pytest.mark.parametrize("text", ["learning_rate: [unclosed\n", "a: " + "[" * 1500 + "\n"])
def test_broken_config_file_is_a_config_error(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="c.yaml"):
        load_config("ppo", path)


def _numeric_fields(cls):
    import typing

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = set(typing.get_args(tp)) | {tp}
        if args & {int, float, list[int]}:
            out.append(f.name)
    return out


def test_every_numeric_field_has_a_range():
    for cls in (PPOConfig, GSPOConfig):
        missing = [n for n in _numeric_fields(cls) if n not in RANGES]
        assert not missing, f"{cls.__name__}: no range for {missing}"
    assert set(RANGES) <= {f.name for f in dataclasses.fields(GSPOConfig)}


@pytest.mark.parametrize("override,message", [
    ("num_envs=0", "num_envs must be in [1, inf), got 0"),
    ("num_steps=-1", "num_steps must be in [1, inf)"),
    ("total_steps=0", "total_steps must be in [1, inf)"),
    ("learning_rate=0", "learning_rate must be in (0, inf), got 0.0"),
    ("learning_rate=.nan", "learning_rate must be in (0, inf), got nan"),
    ("gamma=0", "gamma must be in (0, 1]"),
    ("gamma=1.01", "gamma must be in (0, 1]"),
    ("gae_lambda=-0.1", "gae_lambda must be in [0, 1]"),
    ("num_minibatches=0", "num_minibatches must be in [1, inf)"),
    ("update_epochs=0", "update_epochs must be in [1, inf)"),
    ("clip_coef=0", "clip_coef must be in (0, inf)"),
    ("ent_coef=-1", "ent_coef must be in [0, inf)"),
    ("max_grad_norm=0", "max_grad_norm must be in (0, inf)"),
    ("target_kl=0", "target_kl must be in (0, inf)"),
    ("hidden_sizes=[64, 0]", "each width of hidden_sizes must be in [1, inf), got 0"),
    ("adam_eps=0", "adam_eps must be in (0, inf)"),
    ("clip_obs=0", "clip_obs must be in (0, inf)"),
    ("clip_reward=-1", "clip_reward must be in (0, inf)"),
    ("norm_obs=1", "norm_obs: expected true/false, got 1"),
    ("eval_interval=-1", "eval_interval must be in [0, inf)"),
    ("eval_episodes=0", "eval_episodes must be in [1, inf)"),
    ("seed=-1", "seed must be in [0, 4294967295]"),
    ("epsilon_decay=1.5", "epsilon_decay must be in (0, 1]"),
    ("shaper_beta=1", "shaper_beta must be in [0, 1)"),
    ("hessian_interval=0", "hessian_interval must be in [1, inf)"),
    ("replay_beta0=2", "replay_beta0 must be in [0, 1]"),
    ("radius_min_scale=3", "radius_min_scale (3.0) must not exceed radius_max_scale (2.0)"),
])
def test_out_of_range_values_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("gspo", None, [override])
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_range_bounds_are_inclusive_where_they_say_so():
    cfg = load_config("gspo", None, ["gamma=1", "gae_lambda=0", "ent_coef=0", "seed=0",
                                     "eval_interval=0", "epsilon_min=0", "target_kl=null",
                                     "hidden_sizes=[]"])
    assert cfg.gamma == 1.0 and cfg.hidden_sizes == []


def test_configs_built_directly_are_checked_too():
    with pytest.raises(ConfigError, match="num_envs"):
        PPOConfig(num_envs=0)


def test_config_error_is_a_vrl_error_and_a_value_error():
    from vrl.errors import VrlError

    assert issubclass(ConfigError, VrlError) and issubclass(ConfigError, ValueError)


NESTED_YAML = "env:\n  grid_config:\n    num_agents: 8\n"


def test_nested_env_override_equals_the_same_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(NESTED_YAML)
    by_set = load_config("ppo", None, ["env.grid_config.num_agents=8"]).env
    by_yaml = load_config("ppo", path).env
    assert by_set == by_yaml == {"grid_config": {"num_agents": 8}}


def test_nested_env_override_keeps_the_siblings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  max_steps: 9\n  grid_config:\n    num_agents: 8\n"
                    "    layout: {rows: 3, cols: 4}\n")
    cfg = load_config("ppo", path, ["env.grid_config.num_agents=2",
                                    "env.grid_config.layout.rows=5"])
    assert cfg.env == {"max_steps": 9, "grid_config": {"num_agents": 2,
                                                       "layout": {"rows": 5, "cols": 4}}}
    # a stored config (--from) without a file: the overrides merge into its env
    cfg = load_config("ppo", None, ["env.grid_config.layout={rows: 1}"],
                      base={"env": {"grid_config": {"seed": 4}, "speed": 2}})
    assert cfg.env == {"speed": 2, "grid_config": {"seed": 4, "layout": {"rows": 1}}}
    # a value that is not a mapping replaces the mapping, as in YAML
    assert load_config("ppo", path, ["env.grid_config=3"]).env == {"max_steps": 9,
                                                                   "grid_config": 3}


@pytest.mark.parametrize("override, message", [
    ("evn.grid_config.num_agents=8",
     "unknown ppo config key 'evn' in --set evn.grid_config.num_agents=8; did you mean "
     "'env'?"),
    ("learnin_rate=1e-3", "unknown ppo config key 'learnin_rate'; did you mean "
                          "'learning_rate'?"),
    ("learning_rate.x=1", "--set learning_rate.x=1: learning_rate is a single value, not a "
                          "section (only env.* and dirty.* keys nest); use "
                          "--set learning_rate=VALUE"),
    ("env..a=1", "override 'env..a=1': empty part in the key 'env..a'"),
    ("env=5", "--set env=5: env must be a mapping of env settings, got 5"),
    ("dirty.threshold.x=1", "dirty.threshold: expected float"),
])
def test_bad_nested_overrides_are_one_line_errors(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("ppo", None, [override])
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_an_env_that_is_not_a_mapping_in_a_file_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env: 5\n")
    with pytest.raises(ConfigError, match="c.yaml: env must be a mapping"):
        load_config("ppo", path)
