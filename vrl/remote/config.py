"""Remotes in `.vrl/config`: `[remote "NAME"]` with `url` and backend options.

Credentials are never stored here: URLs with passwords and credential-like options are
refused; each backend finds its credentials its usual way.
"""

from __future__ import annotations

import configparser
from pathlib import Path
from urllib.parse import urlsplit

from vrl.refs import check_ref_name
from vrl.remote.base import RemoteStore, redact, require_remote
from vrl.remote.errors import RemoteConfigError, UnknownRemoteError
from vrl.remote.stores import check_options, check_url, open_remote
from vrl.repo import Repo


def _section(name: str) -> str:
    return f'remote "{name}"'


def remotes(repo: Repo) -> dict[str, dict[str, str]]:
    """name -> {"url": ..., option: value, ...}"""
    return {section[len('remote "'):-1]: dict(repo.config.parser.items(section, raw=True))
            for section in repo.config.sections('remote "')}


def _own_options(repo: Repo, name: str) -> dict[str, str]:
    section = _section(name)
    if not repo.config.parser.has_section(section):
        raise UnknownRemoteError(_unknown(repo, name))
    return dict(repo.config.parser.items(section, raw=True))


def _unknown(repo: Repo, name: str) -> str:
    known = sorted(remotes(repo))
    hint = f"known: {', '.join(known)}" if known else "none configured"
    return f"unknown remote {name!r} ({hint}); add one with `vrl remote add {name} URL`"


def check_remote_name(name: str) -> str:
    check_ref_name(name, "remote")
    if "/" in name or '"' in name:
        raise RemoteConfigError(f"invalid remote name {name!r}: it may not contain '/' or '\"'")
    return name


def add_remote(repo: Repo, name: str, url: str, options: dict[str, str] | None = None, *,
               create: bool = False) -> None:
    """Add remote `name` (`create`: also make an empty vrl remote there, so that a later
    push to it is not refused as a possibly mistyped location)."""
    check_remote_name(name)
    check_url(url)
    options = check_options(dict(options or {}))
    if repo.config.parser.has_section(_section(name)):
        raise RemoteConfigError(f"remote {name!r} already exists; remove it first or use "
                                "another name")
    repo.config.set(_section(name), "url", url)
    for key, value in options.items():
        if key == "url" or not key.replace("_", "").replace("-", "").isalnum():
            raise RemoteConfigError(f"invalid option name {key!r}")
        repo.config.set(_section(name), key, str(value))
    if create:
        try:
            store = open_named(repo, name)
            try:
                require_remote(store, create=True, branch=repo.current_branch() or "main")
            finally:
                store.close()
        except BaseException:
            repo.config.remove_section(_section(name))
            raise
    repo.config.save()


def remove_remote(repo: Repo, name: str) -> None:
    _own_options(repo, name)
    repo.config.remove_section(_section(name))
    repo.config.save()
    for ref, oid in repo.refs.list(f"refs/remotes/{name}/").items():
        repo.refs.update(ref, None, expected=oid, reason=f"remote remove {name}")


def rename_remote(repo: Repo, old: str, new: str) -> None:
    options = _own_options(repo, old)
    check_remote_name(new)
    if repo.config.parser.has_section(_section(new)):
        raise RemoteConfigError(f"remote {new!r} already exists")
    for key, value in options.items():
        repo.config.set(_section(new), key, value)
    repo.config.remove_section(_section(old))
    if repo.config.get("core", "promisor") == old:
        repo.config.set("core", "promisor", new)
    repo.config.save()
    for ref, oid in repo.refs.list(f"refs/remotes/{old}/").items():
        new_ref = f"refs/remotes/{new}/" + ref[len(f"refs/remotes/{old}/"):]
        repo.refs.update(new_ref, oid, reason=f"remote rename {old} {new}")
        repo.refs.update(ref, None, expected=oid, reason=f"remote rename {old} {new}")


def default_remote(repo: Repo, name: str | None = None) -> str:
    """`name`, else `origin`, else the only remote; a clear error otherwise."""
    known = remotes(repo)
    if name:
        if name not in known:
            raise UnknownRemoteError(_unknown(repo, name))
        return name
    if "origin" in known:
        return "origin"
    if len(known) == 1:
        return next(iter(known))
    if not known:
        raise UnknownRemoteError("no remote configured; add one with `vrl remote add origin "
                                 "URL`")
    raise RemoteConfigError(f"several remotes ({', '.join(sorted(known))}); name one")


def open_named(repo: Repo, name: str) -> RemoteStore:
    options = _own_options(repo, name)
    url = options.pop("url", None)
    if not url:
        raise RemoteConfigError(f"remote {name!r} has no url in {repo.config.path}")
    if "://" not in url and not Path(url).is_absolute():
        url = str((repo.workdir / url).resolve())  # relative paths are relative to the repo
    return open_remote(url, options)


def default_dir(url: str) -> str:
    path = urlsplit(url).path if "://" in url else url
    name = Path(path.rstrip("/")).name or "repo"
    return name[:-4] if name.endswith(".vrl") else name


# ------------------------------------------------------------------------------ DVC

_DVC_OPTIONS = {"endpointurl": "endpoint_url", "region": "region", "profile": "profile",
                "port": None, "user": None, "keyfile": "identity_file",
                "project": "project", "account_name": "account_name"}


def dvc_remote(project: str | Path, name: str | None = None) -> tuple[str, str, dict[str, str]]:
    """(name, url, options) of a DVC project's remote (its default one if `name` is None).

    Only `.dvc/config` is read, never `config.local`, which is where DVC keeps secrets.
    vrl's objects go to a `vrl/` folder under the DVC remote, beside DVC's own files.
    """
    path = Path(project) / ".dvc" / "config"
    if not path.is_file():
        raise RemoteConfigError(f"no DVC config at {path}; is {project} a DVC project?")
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error as exc:
        raise RemoteConfigError(f"{path} is not a valid DVC config: "
                                f"{str(exc).splitlines()[0]}") from exc
    found: dict[str, dict[str, str]] = {}
    for section in parser.sections():
        text = section.strip().strip("'")
        if text.startswith('remote "') and text.endswith('"'):
            found[text[8:-1]] = dict(parser.items(section, raw=True))
    if not found:
        raise RemoteConfigError(f"{path} defines no remotes")
    if name is None:
        name = parser.get("core", "remote", fallback=None) if parser.has_section("core") \
            else None
        if name is None:
            if len(found) != 1:
                raise RemoteConfigError(f"{path} has several remotes ({', '.join(found)}) and "
                                        "no default; name one with --from-dvc NAME")
            name = next(iter(found))
    if name not in found:
        raise UnknownRemoteError(f"DVC remote {name!r} not found in {path} (has: "
                                 f"{', '.join(found)})")
    settings = found[name]
    url = settings.get("url", "")
    if not url:
        raise RemoteConfigError(f"DVC remote {name!r} has no url")
    if "://" not in url and not Path(url).is_absolute():
        url = str((Path(project) / ".dvc" / url).resolve())  # DVC resolves from .dvc/
    parts = urlsplit(url) if "://" in url else None
    if parts and parts.scheme in ("ssh", "sftp") and settings.get("user") and \
            not parts.username:
        host = parts.hostname or ""
        port = f":{settings.get('port') or parts.port}" if (settings.get("port") or
                                                          parts.port) else ""
        url = f"{parts.scheme}://{settings['user']}@{host}{port}{parts.path}"
    options = {_DVC_OPTIONS[k]: v for k, v in settings.items()
               if _DVC_OPTIONS.get(k) and k != "url"}
    url = url.rstrip("/") + "/vrl"
    check_url(url)
    return name, redact(url), check_options(options)
