"""Bad URLs, unknown remotes, missing credentials, unreachable endpoints: one clear error,
fast, with no credential in it."""

import time

import pytest

from vrl import Repo
from vrl.remote import add_remote, open_named, open_remote, push, redact
from vrl.remote.errors import (
    RemoteAuthError,
    RemoteConfigError,
    RemoteError,
    RemoteUnreachableError,
    UnknownRemoteError,
)
from vrl.remote.stores import check_url
from vrl.testing.remote_conformance import make_history
from vrl.testing.servers import free_port


@pytest.mark.parametrize("url, why", [
    ("ftp://host/x", "unsupported remote URL scheme"),
    ("s3://", "no bucket"),
    ("gs:///path", "no bucket"),
    ("ssh:///path", "no host"),
    ("ssh://host:99999/x", "invalid port"),
    ("host:some/path", "scp-style"),
    ("s3://AKIA:SECRETKEY@bucket/x", "embeds a credential"),
    ("", "invalid remote URL"),
])
def test_bad_urls_are_refused_without_contacting_anything(url, why):
    with pytest.raises(RemoteConfigError, match=why) as err:
        check_url(url)
    assert "SECRETKEY" not in str(err.value)


def test_redact_hides_passwords():
    assert redact("ssh://bob:hunter2@host/x") == "ssh://bob:***@host/x"
    assert redact("see s3://k:s@b/p and ssh://h/x") == "see s3://k:***@b/p and ssh://h/x"


def test_credential_options_are_refused(repo):
    for key in ("secret_access_key", "password", "aws_session_token", "account_key"):
        with pytest.raises(RemoteConfigError, match="credential"):
            add_remote(repo, "x", "s3://b/p", {key: "v"})
    assert "remote" not in repo.config.path.read_text()


def test_unknown_remote(repo):
    from vrl.remote import default_remote

    with pytest.raises(UnknownRemoteError, match="no remote configured"):
        default_remote(repo)
    add_remote(repo, "origin", "/tmp/x")
    with pytest.raises(UnknownRemoteError, match="unknown remote 'nope'.*known: origin"):
        open_named(repo, "nope")
    with pytest.raises(RemoteConfigError, match="already exists"):
        add_remote(repo, "origin", "/tmp/y")


def test_missing_backend_hint(monkeypatch):
    import sys

    # a None entry makes the import fail as if gcsfs were not installed (it may be)
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    monkeypatch.setitem(sys.modules, "gcsfs.core", None)
    with pytest.raises(RemoteError, match=r"pip install 'vrl\[gcs\]'"):
        open_remote("gs://bucket/x")


def _history(tmp_path, url, options=None):
    repo = Repo.init(tmp_path / "src")
    add_remote(repo, "origin", url, options or {})
    make_history(repo, 1)
    return repo


def test_unreachable_s3_endpoint_fails_fast(tmp_path):
    pytest.importorskip("s3fs")
    port = free_port()  # nothing listens there
    repo = _history(tmp_path, "s3://bucket/x", {"endpoint_url": f"http://127.0.0.1:{port}"})
    start = time.monotonic()
    with pytest.raises(RemoteUnreachableError, match="unreachable") as err:
        push(repo, open_named(repo, "origin"), "origin")
    assert time.monotonic() - start < 30
    assert "\n" not in str(err.value)


def test_unreachable_ssh_endpoint_fails_fast(tmp_path):
    pytest.importorskip("sshfs")
    port = free_port()
    repo = _history(tmp_path, f"ssh://me@127.0.0.1:{port}/x", {"connect_timeout": "5"})
    start = time.monotonic()
    with pytest.raises(RemoteUnreachableError, match="unreachable"):
        push(repo, open_named(repo, "origin"), "origin")
    assert time.monotonic() - start < 30


def test_missing_s3_credentials(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    port = free_port()
    repo = _history(tmp_path, "s3://bucket/x", {"endpoint_url": f"http://127.0.0.1:{port}"})
    start = time.monotonic()
    with pytest.raises(RemoteAuthError, match="credentials"):
        push(repo, open_named(repo, "origin"), "origin")
    assert time.monotonic() - start < 30


def test_missing_s3_bucket(tmp_path):
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from vrl.testing.servers import s3_server

    server = s3_server()
    try:
        repo = _history(tmp_path, "s3://no-such-bucket/x",
                        {"endpoint_url": f"http://127.0.0.1:{server.port}"})
        with pytest.raises(RemoteError, match="no-such-bucket"):
            push(repo, open_named(repo, "origin"), "origin")
    finally:
        server.kill()


def test_ssh_key_not_authorized_and_unknown_host(tmp_path):
    asyncssh = pytest.importorskip("asyncssh")
    pytest.importorskip("sshfs")
    from vrl.testing.servers import sftp_server

    setup = sftp_server(tmp_path / "sshd")
    try:
        stranger = tmp_path / "stranger_key"
        stranger.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
        url = f"ssh://me@127.0.0.1:{setup.server.port}/x"
        repo = _history(tmp_path, url, {"identity_file": str(stranger),
                                        "known_hosts": str(setup.known_hosts)})
        with pytest.raises(RemoteAuthError):
            push(repo, open_named(repo, "origin"), "origin")
        empty = tmp_path / "known_hosts_empty"
        empty.write_text("")
        repo2 = Repo.init(tmp_path / "src2")
        add_remote(repo2, "origin", url, {"identity_file": str(setup.client_key),
                                          "known_hosts": str(empty)})
        with pytest.raises(RemoteError, match="host key|Host key"):
            push(repo2, open_named(repo2, "origin"), "origin")
    finally:
        setup.server.kill()


# ------------------------------------------------------------------ credentials (issue 9.11)

SECRET = "wJal/rXUtnFEMI"


@pytest.mark.parametrize("url", [
    f"s3://AKIAIOSFODNN7:{SECRET}@bucket/p",  # a `/` inside the secret, as AWS secrets have
    f"ssh://me:{SECRET}@host/x",
    f"me:{SECRET}@host:path",  # scp-style
    f"sftp://me:{SECRET}@host:22/x@y",
])
def test_secret_in_url_is_refused_and_never_shown(url):
    with pytest.raises(RemoteConfigError, match="credential") as err:
        check_url(url)
    assert "wJal" not in str(err.value) and "rXUt" not in str(err.value)
    assert redact(url).count("***") == 1 and "wJal" not in redact(url)


@pytest.mark.parametrize("url", ["ssh://host:22/x@v1", "ssh://me@host:2222/p", "s3://b/p@x",
                                 "/data/a:b@c", "file:///tmp/x"])
def test_urls_without_secrets_pass(url):
    assert check_url(url) == url


@pytest.mark.parametrize("key, value", [
    ("key", "AKIA"), ("secret", "x"), ("token", "x"), ("passphrase", "x"),
    ("password", "x"), ("pwd", "x"), ("aws_session_token", "x"), ("Secret-Key", "x"),
    ("endpoint_url", f"http://me:{SECRET}@127.0.0.1:9000"),
])
def test_secret_options_are_refused(repo, key, value):
    with pytest.raises(RemoteConfigError, match="credential") as err:
        add_remote(repo, "x", "s3://b/p", {key: value})
    assert "wJal" not in str(err.value)
    assert "remote" not in repo.config.path.read_text()


def test_cli_never_stores_or_prints_secrets(ws, capsys):
    from helpers import vrl

    vrl(capsys, "init")
    for args in (["remote", "add", "o", f"s3://AKIA:{SECRET}@bucket/p"],
                 ["remote", "add", "o", "s3://bucket/p", "-o", f"key={SECRET}"],
                 ["remote", "add", "o", "s3://bucket/p", "-o", f"pwd={SECRET}"],
                 ["remote", "add", "o", f"me:{SECRET}@host:path"],
                 ["clone", f"s3://AKIA:{SECRET}@bucket/p", "d"]):
        code, out, err = vrl(capsys, *args)
        assert code == 1 and "wJal" not in out + err and "credential" in err, (args, err)
    assert "wJal" not in (ws / ".vrl" / "config").read_text()
    assert not (ws / "d").exists()
    # a config written by hand (or by an old version) is never echoed
    with open(ws / ".vrl" / "config", "a") as f:
        f.write(f'[remote "old"]\nurl = s3://AKIA:{SECRET}@bucket/p\npassphrase = {SECRET}\n'
                'profile = lab\n')
    code, out, _ = vrl(capsys, "remote", "list", "-v")
    assert code == 0 and "wJal" not in out
    assert out == "old\ts3://AKIA:***@bucket/p\tpassphrase=*** profile=lab\n"
    code, out, _ = vrl(capsys, "remote", "list", "--json")
    assert "wJal" not in out and "***" in out
    code, out, err = vrl(capsys, "push", "old")
    assert code == 1 and "wJal" not in out + err and "s3://AKIA:***@bucket/p" in err
