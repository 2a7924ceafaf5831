"""`vrl config`: read and change the settings of `.vrl/config`.

It opens only the config file, not the repository: opening a repository reads settings
(gc.grace, core.fsync...), and a bad value written by hand must still be fixable here.
"""

from __future__ import annotations

import click

from vrl.cli._common import echo_json, json_option, safe
from vrl.config import SETTINGS, Config, setting_name
from vrl.errors import ConfigError


def _config() -> Config:
    from vrl.repo import find_vrl_dir

    return Config(find_vrl_dir(".") / "config")


def _split(key: str) -> tuple[str, str]:
    if key.startswith("remote."):
        raise ConfigError(f"{key!r}: remotes are changed with `vrl remote` (add, remove, "
                          "rename)")
    return setting_name(key)


@click.group(help=f"Read and change settings ({', '.join(SETTINGS)}).")
def config() -> None:
    pass


@config.command("get")
@click.argument("key")
def config_get(key: str) -> None:
    """Print KEY's value (e.g. gc.grace)."""
    section, name = _split(key)
    value = _config().get(section, name)
    if value is None:
        raise ConfigError(f"{key} is not set")
    click.echo(safe(value, one_line=True))


@config.command("set", context_settings={"ignore_unknown_options": True})  # VALUE -5
@click.argument("key")
@click.argument("value")
def config_set(key: str, value: str) -> None:
    """Set KEY to VALUE (checked: e.g. gc.grace takes seconds >= 0)."""
    section, name = _split(key)
    cfg = _config()
    cfg.set(section, name, value)
    cfg.save()


@config.command("unset")
@click.argument("key")
def config_unset(key: str) -> None:
    """Remove KEY (a setting with a default goes back to it)."""
    section, name = _split(key)
    cfg = _config()
    cfg.unset(section, name)
    cfg.save()


@config.command("list")
@json_option
def config_list(as_json: bool) -> None:
    """Every value as section.key=value (credential-like remote options hidden)."""
    from vrl.remote.base import redact, redact_options

    cfg = _config()
    values: dict[str, str] = {}
    for section in cfg.parser.sections():
        items = dict(cfg.parser.items(section, raw=True))
        if section.startswith('remote "') and section.endswith('"'):
            prefix = "remote." + section[len('remote "'):-1]
            items = redact_options(items)
        else:
            prefix = section
        values.update({f"{prefix}.{k}": redact(v) for k, v in items.items()})
    if as_json:
        echo_json(values)
        return
    for key, value in values.items():
        click.echo(safe(f"{key}={value}", one_line=True))


COMMANDS = [config]
