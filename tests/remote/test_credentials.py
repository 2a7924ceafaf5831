"""Credentials at any depth of a remote's options or URL are never stored in `.vrl/config`
nor printed (issue 25, item 6): nested option values (JSON, Python literals, `k=v;k=v`
strings), URL query strings and URL passwords."""

import json

import pytest
from helpers import vrl
from hypothesis import given
from hypothesis import strategies as st

from vrl.remote import add_remote, redact
from vrl.remote.credentials import find_secret, is_secret_option, redact_options, redact_value
from vrl.remote.errors import RemoteConfigError
from vrl.remote.stores import check_url

TOKEN = "wJalrXUtnFEMIK7MDENGbPxRfiCY"


def _leaks(text: str) -> bool:
    return TOKEN in text or TOKEN[:8] in text or TOKEN[-8:] in text


# (url, options, where the credential is) - the forms of the issue, and their relatives
FORMS = [
    ("s3://b/p", {"client_kwargs": json.dumps({"aws_secret_access_key": TOKEN})},
     "client_kwargs.aws_secret_access_key"),
    ("s3://b/p", {"client_kwargs": str({"aws_secret_access_key": TOKEN})},  # what -o stores
     "client_kwargs.aws_secret_access_key"),
    ("s3://b/p", {"client_kwargs": {"aws_secret_access_key": TOKEN}},  # a library caller
     "client_kwargs.aws_secret_access_key"),
    ("s3://b/p", {"storage_options": json.dumps({"password": TOKEN})},
     "storage_options.password"),
    ("s3://b/p", {"headers": json.dumps({"Authorization": f"Bearer {TOKEN}"})},
     "headers.Authorization"),
    ("s3://b/p", {"headers": json.dumps({"X-Custom": f"Bearer {TOKEN}"})}, "headers.X-Custom"),
    ("s3://b/p", {"storage_options": json.dumps({"a": [{"b": {"sas_token": TOKEN}}]})},
     "storage_options.a[0].b.sas_token"),
    ("s3://b/p", {"conn": f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={TOKEN}"},
     "conn"),
    ("s3://b/p", {"endpoint_url": f"http://127.0.0.1:9000/?X-Amz-Signature={TOKEN}"},
     "endpoint_url"),
    ("s3://b/p", {"client_kwargs": json.dumps({"config": {"accessKeyId": "x",
                                                          "secretAccessKey": TOKEN}})},
     "client_kwargs.config.accessKeyId"),
]
URLS = [f"s3://b/p?secret={TOKEN}", f"s3://b/p?region=eu&token={TOKEN}",
        f"s3://b/p?sig={TOKEN}", f"https://user:{TOKEN}@host/x",
        f"ssh://host/x?password={TOKEN}"]


@pytest.mark.parametrize("url, options, where", FORMS)
def test_nested_credentials_are_refused_and_never_stored(repo, url, options, where):
    before = repo.config.path.read_text()
    with pytest.raises(RemoteConfigError, match="credential") as err:
        add_remote(repo, "h", url, options)
    message = str(err.value)
    assert f"(at {where})" in message and "\n" not in message and not _leaks(message)
    assert repo.config.path.read_text() == before
    assert find_secret(next(iter(options.values())), next(iter(options))) == where


@pytest.mark.parametrize("url", URLS)
def test_a_credential_in_a_url_is_refused_and_never_shown(repo, url):
    with pytest.raises(RemoteConfigError, match="credential") as err:
        add_remote(repo, "h", url)
    assert not _leaks(str(err.value)) and "***" in str(err.value)
    with pytest.raises(RemoteConfigError, match="credential"):
        check_url(url)
    assert not _leaks(redact(url)) and "***" in redact(url)
    assert "remote" not in repo.config.path.read_text()


@pytest.mark.parametrize("options", [
    {"client_kwargs": json.dumps({"region_name": "eu-west-1"})},
    {"client_kwargs": str({"region_name": "eu-west-1", "verify": False})},
    {"endpoint_url": "http://127.0.0.1:9000/?x=1&region=eu", "profile": "lab"},
    {"known_hosts": "none", "client_keys": "~/.ssh/id_ed25519", "key_file": "/k"},
    {"identity_file": "~/.ssh/id", "account_name": "acct", "connect_timeout": "5"},
    {"headers": json.dumps({"Accept": "application/json", "X-Mode": "basic mode"})},
])
def test_ordinary_options_are_stored_and_shown_as_they_are(repo, options):
    add_remote(repo, "h", "s3://b/p?versionId=3", options)
    assert redact_options(options) == {k: str(v) for k, v in options.items()}
    assert redact("s3://b/p?versionId=3") == "s3://b/p?versionId=3"


@pytest.mark.parametrize("name", ["aws_secret_access_key", "Authorization", "sas_token",
                                  "AccountKey", "connection_string", "api-key", "apiKey",
                                  "X-Amz-Security-Token", "X-Amz-Credential", "sig", "passwd",
                                  "basic_auth", "aws_key", "client_secret", "Cookie"])
def test_credential_names(name):
    assert is_secret_option(name)


@pytest.mark.parametrize("name", ["region", "endpoint_url", "profile", "anon", "known_hosts",
                                  "identity_file", "client_keys", "key_file", "account_name",
                                  "connect_timeout", "read_timeout", "retries", "project",
                                  "Accept", "versionId"])
def test_ordinary_names(name):
    assert not is_secret_option(name)


def test_redaction_keeps_the_structure_and_hides_every_credential():
    options = {
        "url": f"s3://b/p?secret={TOKEN}&region=x",
        "client_kwargs": str({"aws_secret_access_key": TOKEN, "region_name": "eu"}),
        "headers": json.dumps({"Authorization": f"Bearer {TOKEN}", "Accept": "json"}),
        "storage_options": json.dumps({"nested": [{"password": TOKEN}]}),
        "conn": f"AccountName=a;AccountKey={TOKEN}",
        "token": TOKEN,
    }
    shown = redact_options(options)
    assert not _leaks(json.dumps(shown))
    assert shown == {
        "url": "s3://b/p?secret=***&region=x",
        "client_kwargs": "{'aws_secret_access_key': '***', 'region_name': 'eu'}",
        "headers": '{"Authorization": "***", "Accept": "json"}',
        "storage_options": '{"nested": [{"password": "***"}]}',
        "conn": "AccountName=a;AccountKey=***",
        "token": "***",
    }
    assert redact(f"https://user:{TOKEN}@host/x failed") == "https://user:***@host/x failed"


# A nested option value: dicts and lists of ordinary keys and values ...
_safe_keys = st.sampled_from(["region", "opts", "Accept", "endpoint", "items", "retries"])
_safe_values = st.one_of(st.integers(), st.booleans(), st.none(),
                         st.text(alphabet="abcdefgh0123456789 ./", max_size=12))
_nested = st.recursive(_safe_values, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_safe_keys, inner, max_size=3), max_leaves=12)


def _plant(data, path, key):
    """Put {key: TOKEN} into `data` where `path` (a list of choices) leads."""
    if isinstance(data, dict) and data and path:
        k = sorted(data)[path[0] % len(data)]
        data[k] = _plant(data[k], path[1:], key)
        return data
    if isinstance(data, list) and data and path:
        i = path[0] % len(data)
        data[i] = _plant(data[i], path[1:], key)
        return data
    return {"wrap": data, key: TOKEN}


@given(_nested, st.lists(st.integers(0, 10), max_size=6),
       st.sampled_from(["aws_secret_access_key", "password", "Authorization", "sas_token",
                        "AccountKey", "api_key", "token"]), st.booleans())
def test_a_credential_planted_at_any_depth_is_found_and_hidden(data, path, key, as_json):
    planted = _plant(data, path, key)
    text = json.dumps(planted) if as_json else str(planted)
    assert find_secret(text, "opt") is not None
    shown = redact_value(text)
    assert TOKEN not in shown and "***" in shown


@given(_nested, st.booleans())
def test_ordinary_nested_values_pass_and_are_shown_unchanged(data, as_json):
    text = json.dumps(data) if as_json else str(data)
    assert find_secret(text, "opt") is None
    assert redact_value(text) == text


# ---------------------------------------------------------------------------- CLI

def _option_args(options):
    out = []
    for k, v in options.items():
        out += ["-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return out


@pytest.mark.parametrize("url, options, where", FORMS)
def test_cli_remote_add_refuses_nested_credentials(ws, capsys, url, options, where):
    vrl(capsys, "init")
    code, out, err = vrl(capsys, "remote", "add", "h", url, *_option_args(options))
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert f"(at {where})" in err and "vrl never stores credentials" in err
    assert not _leaks(out + err)
    assert not _leaks((ws / ".vrl" / "config").read_text())
    code, out, _ = vrl(capsys, "remote", "list", "-v")
    assert (code, out) == (0, "")


@pytest.mark.parametrize("url", URLS)
def test_cli_remote_add_and_clone_refuse_a_credential_in_a_url(ws, capsys, url):
    vrl(capsys, "init")
    for args in (["remote", "add", "h", url], ["clone", url, "d"]):
        code, out, err = vrl(capsys, *args)
        assert code == 1 and "credential" in err and "***" in err, (args, err)
        assert not _leaks(out + err)
    assert not _leaks((ws / ".vrl" / "config").read_text())
    assert not (ws / "d").exists()


def test_cli_never_prints_a_credential_written_into_the_config_by_hand(ws, capsys):
    vrl(capsys, "init")
    with open(ws / ".vrl" / "config", "a") as f:
        f.write('\n[remote "old"]\n'
                f"url = s3://b/p?secret={TOKEN}&region=x\n"
                f"client_kwargs = {{'aws_secret_access_key': '{TOKEN}', 'region': 'eu'}}\n"
                f'headers = {{"Authorization": "Bearer {TOKEN}"}}\n'
                f'storage_options = {{"password": "{TOKEN}"}}\n'
                '\n[remote "web"]\n'
                f"url = https://user:{TOKEN}@host/x\n")
    code, out, err = vrl(capsys, "remote", "list", "-v")
    assert code == 0 and not _leaks(out + err)
    assert out == ("old\ts3://b/p?secret=***&region=x\t"
                   "client_kwargs={'aws_secret_access_key': '***', 'region': 'eu'} "
                   'headers={"Authorization": "***"} storage_options={"password": "***"}\n'
                   "web\thttps://user:***@host/x\n")
    code, out, err = vrl(capsys, "remote", "list", "--json")
    assert code == 0 and not _leaks(out + err)
    assert json.loads(out)["old"]["storage_options"] == '{"password": "***"}'
    code, out, err = vrl(capsys, "config", "list")
    assert code == 0 and not _leaks(out + err)
    assert "remote.old.headers={\"Authorization\": \"***\"}\n" in out
    for args in (["push", "old"], ["fetch", "old"], ["fetch", "web"], ["pull", "web"]):
        code, out, err = vrl(capsys, *args)
        assert code == 1 and err.count("\n") == 1 and "***" in err, (args, err)
        assert not _leaks(out + err)
