"""Algorithm configuration: one dataclass per algorithm, loadable from YAML.

Each field's docstring is the documentation (CleanRL style). ``load_config``
merges, in order: the dataclass defaults, a YAML file, then ``--set key=value``
overrides. Values are parsed as YAML 1.2 values (``3e-4`` is a float, unlike PyYAML's
YAML 1.1) and checked against the field's type.
Keys ``env.<name>`` go to the free-form ``env`` dict passed to the environment factory
(``env.a.b=v`` nests: ``{"a": {"b": v}}``, merged key by key as a YAML mapping would be);
keys ``dirty.<name>`` to the ``dirty`` section (:class:`DirtyLayerConfig`, dirty-layer
training), whose fields and defaults are defined once, here.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vrl import yaml12
from vrl.errors import VrlError


class ConfigError(VrlError, ValueError):
    """A configuration key or value is invalid (one line: the CLI prints it as it is)."""


CRITERIA = ("threshold", "plasticity", "drift")
NETWORKS = ("actor", "critic")  # the policy's networks (trainer.agent.Agent)

# The allowed range of each numeric field of DirtyLayerConfig (as RANGES below).
DIRTY_RANGES: dict[str, str] = {
    "threshold": "[0, inf)",
    "window": "[1, inf)",
    "plasticity": "[0, inf)",
    "drift": "[0, inf)",
    "reference": "[1, inf)",
    "max_depth": "[1, inf)",
    "refresh": "[1, inf)",
    "min_active": "[0, inf)",
    "warmup": "[0, inf)",
}


@dataclass
class DirtyLayerConfig:
    """Settings of dirty-layer training (:mod:`trainer.dirty_layers`): the ``dirty``
    section of the trainer config (``--set dirty.threshold=0.01``, a ``dirty:`` mapping in
    a --config file or preset; ``vrl train --dirty-*`` are aliases of these keys). These
    dataclass defaults are the only defaults."""

    enabled: bool = False
    """``vrl train`` adds the dirty-layer controller (``--dirty-layers``); a
    DirtyLayerController built directly runs whatever this says"""
    criterion: str = "threshold"
    """"threshold" (one global relative-change threshold), "plasticity" (a layer's
    recent movement relative to its own earlier movement) or "drift" (net change over
    path length: still travelling or only jittering)"""
    threshold: float = 0.02
    """threshold criterion: relative change over the window above which a layer trains"""
    window: int = 3
    """snapshots compared (threshold) or a layer's recent training iterations averaged
    (plasticity) or measured (drift)"""
    plasticity: float = 0.5
    """plasticity criterion: freeze when recent movement / earlier movement is below this"""
    drift: float = 0.6
    """drift criterion: freeze when net change / path length over the window is below
    this (pure noise over `window` steps gives ~1/sqrt(window))"""
    reference: int = 4
    """plasticity criterion: the layer's first training iterations (in this run) that form
    the reference movement"""
    lr_normalise: bool = True
    """plasticity criterion: divide each movement by that iteration's learning rate"""
    prefix_only: bool = False
    """freeze only input-side prefixes of each network (the backward pass stops before
    them); other candidates keep training"""
    max_depth: int | None = None
    """with prefix_only: freeze at most this many layers of each network, front to back
    (None: no limit)"""
    networks: tuple[str, ...] | None = None
    """freeze only layers of these networks, e.g. ("critic",) so the policy keeps all of
    its plasticity (None: any network; ``--set dirty.networks=critic,actor`` or
    ``[critic]``)"""
    refresh: int = 10
    """every `refresh` iterations of this run all layers train (so frozen layers can come
    back)"""
    min_active: int = 1
    """layers that always train (the ones that moved most)"""
    warmup: int = 5
    """iterations of this run (counted from where it started or branched, not from the
    snapshot's iteration counter) before any layer may be frozen"""
    prefix: str = "model/"
    """where the model's tensors live in the snapshot tree"""
    sync: bool = False
    """wait for the latest snapshot before deciding (exact decisions; the loop waits for
    the store instead of overlapping with it)"""

    def __post_init__(self) -> None:
        if self.networks is not None:
            self.networks = tuple(self.networks)
        if self.criterion not in CRITERIA:
            raise ConfigError(f"unknown dirty-layer criterion {self.criterion!r} "
                              f"(dirty.criterion); choose from {', '.join(CRITERIA)}")
        for name, interval in DIRTY_RANGES.items():
            value = getattr(self, name)
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value) or not _in_range(value, interval):
                raise ConfigError(f"dirty.{name} must be in {interval}, got {value!r}")
        if self.networks is not None and not self.networks:
            raise ConfigError("dirty-layer networks must name at least one network "
                              "(or be None: any network)")


@dataclass
class PPOConfig:
    """Proximal Policy Optimization (Schulman et al. 2017).

    The defaults are the best configuration measured on the built-in warehouse (8 worlds
    x 20 AGVs x 128 steps = 20,480 samples per update, 10 epochs x 32 minibatches, a
    128-128 MLP, gradient clip 0.3; docs/trainer.md). CleanRL's ``ppo.py`` defaults
    (4 envs, 4 x 4 minibatches, 64-64, clip 0.5), which suit classic control such as
    CartPole, are the ``cleanrl`` preset (``vrl train --preset cleanrl``).
    """

    seed: int = 1
    """seed for environments, network initialisation and sampling"""
    total_steps: int = 500_000
    """total environment steps (agent-steps for multi-agent envs) of the run, rounded up
    to whole iterations"""
    num_envs: int = 8
    """parallel environments (the warehouse multiplies this by its number of AGVs)"""
    num_steps: int = 128
    """steps per environment per rollout (SB3's ``n_steps``)"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation"""
    num_minibatches: int = 32
    """minibatches per epoch"""
    update_epochs: int = 10
    """epochs over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient (PPO's epsilon)"""
    clip_vloss: bool = True
    """clip the value loss around the old value prediction"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.3
    """global gradient-norm clip (the original GSPO recipe's ``grad_clip``)"""
    target_kl: float | None = None
    """stop the epochs of an update early when approx-KL exceeds this (None: never)"""
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 128])
    """hidden layer widths of the actor and the critic MLPs"""
    adam_eps: float = 1e-5
    """Adam epsilon (CleanRL uses 1e-5, not PyTorch's 1e-8)"""
    norm_obs: bool = False
    """normalise observations by their running per-feature mean and std (Gymnasium's
    NormalizeObservation, as CleanRL's ppo_continuous_action.py), clipped to +-clip_obs;
    the statistics are part of the snapshot and frozen at evaluation"""
    clip_obs: float = 10.0
    """clip normalised observations to [-clip_obs, clip_obs] (with norm_obs)"""
    norm_reward: bool = False
    """scale rewards by the running std of each slot's discounted return (Gymnasium's
    NormalizeReward), clipped to +-clip_reward; logged returns stay the env's"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip_reward, clip_reward] (with norm_reward)"""
    eval_interval: int = 0
    """evaluate every this many iterations (0: never)"""
    eval_episodes: int = 10
    """episodes per evaluation (the warehouse evaluates one episode per env)"""
    env: dict[str, Any] = field(default_factory=dict)
    """keyword arguments for the environment factory (``--set env.num_agents=10``)"""
    dirty: DirtyLayerConfig = field(default_factory=DirtyLayerConfig)
    """dirty-layer training (``--set dirty.enabled=true --set dirty.threshold=0.01``;
    the fields of :class:`DirtyLayerConfig`)"""

    def __post_init__(self) -> None:
        validate(self)

    @property
    def algo(self) -> str:
        return "ppo"


@dataclass
class GSPOConfig(PPOConfig):
    """Gradient-Shaped Policy Optimization: PPO plus three switchable mechanisms.

    Defaults are the original GSPO recipe's (docs/trainer.md): gamma 0.99, lambda 0.95,
    epsilon 0.2 decaying by 0.995, grad_clip 0.3, hessian_interval 5, 10 epochs, 32
    minibatches, except ``num_steps``:
    the recipe's 2048 steps per slot would make 2048 x 160 samples per warehouse update, so
    it is 128 as for PPO.
    With ``shaper``, ``radius`` and ``replay`` all False it is exactly PPO with
    ``clip_coef = epsilon_base``.
    """

    num_steps: int = 128
    """steps per environment per rollout (original recipe: n_steps 2048 per env)"""
    num_minibatches: int = 32
    """minibatches per epoch (original recipe: 32)"""
    update_epochs: int = 10
    """epochs over each rollout (original recipe: noptepochs 10)"""
    max_grad_norm: float = 0.3
    """global gradient-norm clip (original recipe: grad_clip 0.3)"""

    shaper: bool = True
    """mechanism 1: damp gradients of high-curvature, oscillating parameters"""
    hessian_interval: int = 5
    """estimate the Hessian diagonal every this many optimizer steps (original recipe: 5)"""
    hessian_probes: int = 1
    """Rademacher probes per Hutchinson estimate"""
    shaper_beta: float = 0.9
    """EMA factor of the curvature and sign-flip statistics"""
    shaper_strength: float = 1.0
    """kappa in g / (1 + kappa * flip_rate * relative_curvature)"""

    radius: bool = True
    """mechanism 2: per-layer trust radius around a decaying global epsilon"""
    epsilon_base: float = 0.2
    """initial global epsilon; also the surrogate clip coefficient in GSPO (original recipe: 0.2)"""
    epsilon_decay: float = 0.995
    """epsilon multiplier applied once per update iteration, rollout + update (original: 0.995)"""
    epsilon_min: float = 0.05
    """floor of the global epsilon so it cannot collapse over a long run"""
    radius_scale: float = 0.05
    """a layer may move at most radius_scale * epsilon * scale_l * ||w_l|| per optimizer step"""
    radius_min_scale: float = 0.5
    """lower bound of the per-layer sensitivity scale"""
    radius_max_scale: float = 2.0
    """upper bound of the per-layer sensitivity scale"""
    sensitivity_beta: float = 0.9
    """EMA factor of each layer's gradient-to-weight norm ratio"""

    replay: bool = True
    """mechanism 3: prioritized sampling of minibatches within the rollout"""
    replay_alpha: float = 0.6
    """priority exponent: P(i) = p_i^alpha / sum_j p_j^alpha (Schaul et al. 2016)"""
    replay_beta0: float = 0.4
    """initial importance-weight exponent, annealed linearly to 1 over the run"""
    replay_eps: float = 1e-6
    """added to priorities so no sample has probability 0"""

    @property
    def algo(self) -> str:
        return "gspo"


CONFIGS: dict[str, type[PPOConfig]] = {"ppo": PPOConfig, "gspo": GSPOConfig}

# The allowed range of every numeric field, in interval notation ("[" includes the bound,
# "(" excludes it). Every int/float field must have an entry (a test checks it), so a new
# field cannot slip through unchecked.
RANGES: dict[str, str] = {
    "seed": "[0, 4294967295]",  # numpy's seed range
    "total_steps": "[1, inf)",
    "num_envs": "[1, inf)",
    "num_steps": "[1, inf)",
    "learning_rate": "(0, inf)",
    "gamma": "(0, 1]",
    "gae_lambda": "[0, 1]",
    "num_minibatches": "[1, inf)",
    "update_epochs": "[1, inf)",
    "clip_coef": "(0, inf)",
    "ent_coef": "[0, inf)",
    "vf_coef": "[0, inf)",
    "max_grad_norm": "(0, inf)",
    "target_kl": "(0, inf)",
    "hidden_sizes": "[1, inf)",  # each width
    "adam_eps": "(0, inf)",
    "clip_obs": "(0, inf)",
    "clip_reward": "(0, inf)",
    "eval_interval": "[0, inf)",
    "eval_episodes": "[1, inf)",
    "hessian_interval": "[1, inf)",
    "hessian_probes": "[1, inf)",
    "shaper_beta": "[0, 1)",
    "shaper_strength": "[0, inf)",
    "epsilon_base": "(0, inf)",
    "epsilon_decay": "(0, 1]",
    "epsilon_min": "[0, inf)",
    "radius_scale": "(0, inf)",
    "radius_min_scale": "(0, inf)",
    "radius_max_scale": "(0, inf)",
    "sensitivity_beta": "[0, 1)",
    "replay_alpha": "[0, inf)",
    "replay_beta0": "[0, 1]",
    "replay_eps": "(0, inf)",
}


def _in_range(value: float, interval: str) -> bool:
    lo_text, hi_text = interval[1:-1].split(",")
    lo, hi = float(lo_text), float(hi_text)
    above = value >= lo if interval[0] == "[" else value > lo
    below = value <= hi if interval[-1] == "]" else value < hi
    return above and below


def validate(config: PPOConfig) -> None:
    """Raise ConfigError (one line, naming the field and its range) for a value the
    trainer cannot run with. Checks that need the environment (batch size vs.
    minibatches, steps vs. one iteration) are the Trainer's."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        interval = RANGES.get(f.name)
        if interval is None or value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # a type error; config_from_dict reports those
            if not math.isfinite(v) or not _in_range(v, interval):
                what = "each width of hidden_sizes" if f.name == "hidden_sizes" else f.name
                raise ConfigError(f"{what} must be in {interval}, got {v!r}")
    networks = getattr(getattr(config, "dirty", None), "networks", None) or ()
    unknown = [n for n in networks if n not in NETWORKS]
    if unknown:
        raise ConfigError(f"dirty.networks: {', '.join(unknown)} is not a network of the "
                          f"policy; choose from {', '.join(NETWORKS)}")
    lo, hi = getattr(config, "radius_min_scale", 1), getattr(config, "radius_max_scale", 1)
    if lo > hi:
        raise ConfigError(f"radius_min_scale ({lo}) must not exceed radius_max_scale ({hi})")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(name: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotated type ``tp``; int is accepted for float."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, value, inner[0])
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(name, v, args[0]) for v in value]
    if origin is tuple:  # tuple[str, ...]: a list, or a comma-separated string
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return tuple(_coerce(name, v, args[0]) for v in value)
    if dataclasses.is_dataclass(tp):
        return _section(name, value, tp)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if tp in (int, float, str) and not isinstance(value, tp):
        raise ConfigError(f"{name}: expected {tp.__name__}, got {value!r}")
    return value


def _section(name: str, value: Any, cls: type) -> Any:
    """A nested section (``dirty``) from a mapping, rejecting unknown keys in one line."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a mapping of {name}.* keys, got {value!r}")
    types = _field_types(cls)
    kwargs = {}
    for key, item in value.items():
        if key not in types:
            raise ConfigError(f"unknown config key {name}.{key}; valid {name}.* keys: "
                              f"{', '.join(types)}")
        kwargs[key] = _coerce(f"{name}.{key}", item, types[key])
    return cls(**kwargs)


def fold_flat_dirty(values: dict[str, Any]) -> dict[str, Any]:
    """A stored config with the dirty-layer settings in the ``dirty`` section: older runs
    have none (the defaults apply) or flat keys (``dirty_layers`` for ``enabled``,
    ``dirty_<field>``), which are moved into it; the section's own values win."""
    names = {f.name for f in dataclasses.fields(DirtyLayerConfig)}
    out: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    for key, value in values.items():
        sub = "enabled" if key == "dirty_layers" else key[6:] if key.startswith("dirty_") \
            else None
        if sub in names:
            flat[sub] = value
        else:
            out[key] = value
    if flat:
        section = out.get("dirty")
        out["dirty"] = {**flat, **(section if isinstance(section, dict) else {})}
    return out


def config_from_dict(algo: str, values: dict[str, Any]) -> PPOConfig:
    """Build the config of ``algo`` from a mapping, rejecting unknown keys."""
    try:
        cls = CONFIGS[algo]
    except KeyError:
        raise ConfigError(f"unknown algorithm {algo!r}; choose from {sorted(CONFIGS)}") from None
    types = _field_types(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"unknown {algo} config key {key!r}{_did_you_mean(key, types)}")
        kwargs[key] = _coerce(key, value, types[key])
    return cls(**kwargs)


def _did_you_mean(key: str, names: typing.Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(names), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# the config fields that are mappings, so that `--set SECTION.a.b=v` may nest into them
SECTIONS = ("env", "dirty")


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value``; the value is parsed as YAML (``1e-3``, ``true``, ``[64,64]``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value")
    try:  # YAML 1.2: 1e-3 is a float (PyYAML's YAML 1.1 reads it as a string)
        value = yaml12.load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"override {text!r}: {str(exc).splitlines()[0]}") from None
    return key.strip(), value


def load_yaml(path: str | Path) -> Any:
    try:
        return yaml12.load(Path(path).read_text())
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def load_config(
    algo: str, path: str | Path | None = None, overrides: typing.Sequence[str] = (),
    base: dict[str, Any] | None = None, preset: str | None = None,
) -> PPOConfig:
    """Defaults of ``algo``, then ``base`` (e.g. the config stored with a snapshot), then
    the named ``preset`` (trainer/presets/NAME.yaml), then the YAML file at ``path``, then
    ``key=value`` overrides."""
    values: dict[str, Any] = {k: v for k, v in (base or {}).items() if k != "algo"}
    if isinstance(values.get("dirty"), DirtyLayerConfig):
        values["dirty"] = dataclasses.asdict(values["dirty"])
    if preset is not None:
        from trainer.presets import load_preset

        for key, value in load_preset(preset).items():
            if key == "env":
                values["env"] = _merge_env(values.get("env"), value, f"preset {preset}")
            elif key == "dirty":
                _merge_dirty(values, value)
            elif key != "algo":
                values[key] = value
    if path is not None:
        loaded = load_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        loaded.pop("algo", None)
        loaded.pop("env_spec", None)  # the env to build (the CLI reads it), not a field
        if "dirty" in loaded:
            _merge_dirty(values, loaded.pop("dirty"))
        if "env" in loaded:  # a file's env replaces the stored one or the preset's
            values["env"] = _merge_env(None, loaded.pop("env"), str(path))
        values.update(loaded)
    env = _merge_env(None, values.pop("env", None), "the stored config")
    for text in overrides:
        key, value = parse_override(text)
        head, _, rest = key.partition(".")
        if rest:
            # `a.b.c=v` is the mapping {a: {b: {c: v}}}, exactly as YAML would nest it
            parts = rest.split(".")
            if not all(parts):
                raise ConfigError(f"override {text!r}: empty part in the key {key!r}")
            for part in reversed(parts):
                value = {part: value}
            _check_section(algo, head, text)
        if head == "env":
            env = _merge_env(env, value, f"--set {text}")
        elif head == "dirty":
            _merge_dirty(values, value)
        else:
            values[key] = value
    values["env"] = env
    return config_from_dict(algo, values)


def _check_section(algo: str, head: str, text: str) -> None:
    """A dotted override must start with a section (env, dirty): anything else is a typo
    or a plain field, said in one line."""
    if head in SECTIONS:
        return
    names = {f.name for f in dataclasses.fields(CONFIGS[algo])} if algo in CONFIGS else set()
    if head in names:
        raise ConfigError(f"--set {text}: {head} is a single value, not a section (only "
                          f"{' and '.join(f'{s}.*' for s in SECTIONS)} keys nest); use "
                          f"--set {head}=VALUE")
    raise ConfigError(f"unknown {algo} config key {head!r} in --set {text}"
                      f"{_did_you_mean(head, names) or '; nested keys go under env.*'}")


def _merge_env(base: Any, over: Any, where: str) -> dict[str, Any]:
    """``over`` laid over the env mapping ``base`` key by key, nested mappings merged at
    every depth (a YAML file or ``--set env.a.b=v`` changes one nested key and keeps its
    siblings); a value that is not a mapping replaces what was there."""
    for value in (base, over):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{where}: env must be a mapping of env settings, got "
                              f"{value!r}")
    return _deep_merge(base or {}, over or {})


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)  # new dicts along the merged paths: `base` is never changed
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _merge_dirty(values: dict[str, Any], section: Any) -> None:
    """Lay the ``dirty`` mapping ``section`` over ``values["dirty"]`` (key by key)."""
    before = values.get("dirty")
    if isinstance(section, dict) and isinstance(before, dict):
        values["dirty"] = {**before, **section}
    else:
        values["dirty"] = section  # not a mapping: config_from_dict reports it


def config_to_dict(config: PPOConfig) -> dict[str, Any]:
    """Plain mapping of every field plus ``algo`` (for logs and snapshots)."""
    out = _plain(dataclasses.asdict(config))
    out["algo"] = config.algo
    return out


def _plain(value: Any) -> Any:
    """Tuples (``dirty.networks``) as lists, so YAML and JSON writers take the mapping."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
