import pytest

from trainer.config import (
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
