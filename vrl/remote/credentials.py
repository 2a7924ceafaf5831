"""What counts as a credential in a remote's URL or options, and how it is hidden.

vrl never stores a credential in `.vrl/config` (a file copied, shared and backed up with
the repository) and never prints one. A value holds a credential if, at any depth (dicts
and lists, JSON or Python-literal text, `k=v;k=v` / query strings, URLs):
- a key is named like one (`aws_secret_access_key`, `password`, `Authorization`,
  `sas_token`, `AccountKey`, ...: `is_secret_option`), or
- a URL has a password (`user:pw@host`) or a credential-named query parameter
  (`?secret=...`, `&X-Amz-Signature=...`), or
- the text has a well-known credential form (`Bearer ...`, a private key block, an AWS key
  id, a GitHub / Hugging Face / Slack token, a JWT).
Refusing (`find_secret`) and redacting (`redact`, `redact_value`) use the same rules.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any
from urllib.parse import urlsplit

CREDENTIAL_HINT = ("vrl never stores credentials: use the backend's own mechanism (S3: "
                   "AWS_PROFILE / -o profile=NAME, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                   "in the environment, or ~/.aws/credentials; SSH: an ssh-agent or a key, "
                   "-o identity_file=PATH; GCS / Azure: gcloud / az login)")
HIDDEN = "***"

# A name holds a credential if it contains one of these (after camelCase -> snake_case) ...
SECRET_WORDS = ("secret", "passw", "passphrase", "pwd", "token", "credential", "access_key",
                "private", "sas", "connection_string", "account_key", "session", "authoriz",
                "signature", "cookie", "api_key", "apikey", "bearer")
# ... or is one of these, or ends in one as a word (`aws_key`, `basic_auth`; not `key_file`)
SECRET_KEYS = ("key", "pass", "pw", "auth", "sig")

# `user:secret@` after a scheme (`s3://AKIA:wJal/rX@bucket`: the secret may hold `/`),
# or at the start of a word (scp-style `me:pw@host:path`). Greedy up to the last `@` of
# the word, so a secret holding `@` is hidden too.
_USERINFO = re.compile(r"(?P<pre>[a-zA-Z][a-zA-Z0-9+.-]*://|(?<![^\s'\"(=<]))"
                       r"(?P<user>[^\s/@:'\"(=<]*):[^\s'\"]*@")
# `user:secret@` right after the scheme; `host:22/` is a port, not a secret.
_URL_SECRET = re.compile(r"[^/@:]*:(?!\d*(?:/|$))[^@]*@")
# `name=value` in a query string or a `k=v;k=v` connection string (value up to the next
# separator, quote or space)
_ASSIGNMENT = re.compile(r"(?P<pre>(?:^|[?&;])\s*)(?P<name>[A-Za-z_][\w.-]*)="
                         r"(?P<value>[^&;#\s'\"]*)")
# A value that is a credential whatever its key is called.
_SECRET_VALUE = re.compile(
    r"^\s*(?:Bearer|Basic|Token|Digest)\s+[\w.~+/=-]{8,}|-----BEGIN|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|"
    r"\bgh[pousr]_\w{20,}|github_pat_\w{20,}|\bglpat-[\w-]{20,}|\bxox[abposr]-[\w-]{10,}|"
    r"\bhf_\w{20,}|\beyJ[\w-]{10,}\.eyJ[\w-]{10,}", re.IGNORECASE)
_MAX_DEPTH = 32  # nesting a walk follows (option values are short; deeper is refused)


def is_secret_option(key: str) -> bool:
    """True if an option's (or a nested key's, or a query parameter's) name says it holds a
    credential."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(key)).lower()
    low = re.sub(r"[^a-z0-9]+", "_", snake).strip("_")
    return (low in SECRET_KEYS or low.rsplit("_", 1)[-1] in SECRET_KEYS
            or any(word in low for word in SECRET_WORDS))


def embeds_secret(url: str) -> bool:
    """True if a URL carries a password in its user part or a credential-named query
    parameter (`?secret=...`, `?X-Amz-Signature=...`)."""
    if "://" not in url:  # scp-style user:pw@host:path
        return bool(re.match(r"[^/@:]*:[^@]*@", url))
    if _URL_SECRET.match(url.split("://", 1)[1]):
        return True
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # e.g. an invalid port: not a password
        return False
    return bool(password) or any(is_secret_option(m["name"]) for m in
                                 _ASSIGNMENT.finditer("?" + parts.query))


def redact(text: str) -> str:
    """Text safe to print: a URL's password (`user:secret@host` -> `user:***@host`) and the
    value of any credential-named `name=value` after `?`, `&` or `;` hidden."""
    text = _USERINFO.sub(lambda m: f"{m['pre']}{m['user']}:{HIDDEN}@", str(text))
    if "=" not in text:
        return text
    return _ASSIGNMENT.sub(lambda m: f"{m['pre']}{m['name']}={HIDDEN}"
                           if is_secret_option(m["name"]) and m["value"] else m[0], text)


def _structured(text: str) -> tuple[Any, str] | None:
    """A `{...}` / `[...]` text parsed as JSON or a Python literal (what `-o k={...}` gives),
    with how it was written; None for any other text. Nothing is ever evaluated."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        return json.loads(stripped), "json"
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(stripped), "python"
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def find_secret(value: Any, path: str, depth: int = 0) -> str | None:
    """Where a credential is in an option value (`path`, `path.key`, `path[0]`...), or
    None."""
    if depth > _MAX_DEPTH:
        return path  # cannot be looked through: treated as hiding one
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if is_secret_option(str(key)):
                return where
            found = find_secret(item, where, depth + 1)
            if found:
                return found
    elif isinstance(value, (list, tuple, set)):
        for i, item in enumerate(value):
            found = find_secret(item, f"{path}[{i}]", depth + 1)
            if found:
                return found
    elif isinstance(value, (str, bytes)):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        parsed = _structured(text)
        if parsed is not None:
            return find_secret(parsed[0], path, depth + 1)
        if _SECRET_VALUE.search(text) or embeds_secret(text.strip()) or redact(text) != text:
            return path
    return None


def _redact_nested(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return HIDDEN
    if isinstance(value, dict):
        return {k: HIDDEN if is_secret_option(str(k)) else _redact_nested(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_nested(v, depth + 1) for v in value)
    if isinstance(value, str):
        return redact_value(value, depth + 1)
    return value


def redact_value(text: str, depth: int = 0) -> str:
    """An option's value safe to print: credentials at any depth replaced by `***`, the
    rest kept (a `{...}` value is shown with its structure)."""
    text = str(text)
    parsed = _structured(text)
    if parsed is not None:
        data, style = parsed
        hidden = _redact_nested(data, depth)
        return json.dumps(hidden) if style == "json" else repr(hidden)
    if _SECRET_VALUE.search(text):
        return HIDDEN
    return redact(text)


def redact_options(options: dict[str, Any]) -> dict[str, str]:
    """Options safe to print: credential-named ones hidden, the others' values redacted."""
    return {k: HIDDEN if is_secret_option(k) else redact_value(str(v))
            for k, v in options.items()}
