"""Issue 9 item 12: repository data from anywhere (here: a remote) never reaches the
terminal raw; every command prints escape sequences and control characters escaped."""

import os

import pytest
import torch
from helpers import vrl

from vrl import Repo
from vrl.cli._common import safe
from vrl.remote import add_remote, open_named, push

EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def test_safe_escapes_controls_and_keeps_text():
    assert safe("plain text, ünïcödé ✓") == "plain text, ünïcödé ✓"
    assert safe("a\tb\nc") == "a\tb\nc"
    assert safe("a\tb\nc", one_line=True) == "a\\tb\\nc"
    assert safe(EVIL) == "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e"
    assert safe(3) == "3"


def assert_clean(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)
    assert not any(ord(c) < 32 and c not in "\n\t" for c in text), repr(text)


@pytest.fixture
def hostile_clone(ws, capsys):
    src = Repo.init(ws / "src")
    add_remote(src, "origin", str(ws / "r.vrl"), create=True)
    for i in range(2):
        src.commit({"w": torch.full((3,), float(i))}, message=f"{EVIL} msg {i}\nline {EVIL}",
                   hparams={f"lr{EVIL}": EVIL}, metrics={f"ret{EVIL}": 1.5}, env=False,
                   step=i)
    src.commit({"w": torch.full((3,), 9.0)}, message=EVIL, env=False,
               author=f"mallory{EVIL}")
    push(src, open_named(src, "origin"), "origin")
    code, out, err = vrl(capsys, "clone", str(ws / "r.vrl"), "dst")
    assert code == 0, err
    os.chdir(ws / "dst")
    return src


@pytest.mark.parametrize("args", [
    ["log"], ["log", "--oneline"], ["log", "--metrics", f"ret{EVIL}"], ["show"],
    ["show", "HEAD~1"], ["branch"], ["tag"], ["reflog"], ["status"], ["diff", "HEAD~1"],
    ["remote", "list", "-v"], ["fetch"], ["pull"], ["prune", "--keep-last", "1", "--dry-run"],
    ["fsck"], ["show", f"nope{EVIL}"], ["checkout", "HEAD~1", "--force"],
])
def test_no_command_prints_control_characters(hostile_clone, capsys, args):
    code, out, err = vrl(capsys, *args)
    assert_clean(out)
    assert_clean(err)
    if args in (["log"], ["show"]):
        assert code == 0 and "\\x1b]0;pwned\\x07" in out  # shown escaped, not dropped
        assert "Author: mallory\\x1b]0;pwned" in out


def test_remote_branch_with_control_characters_is_refused(ws, capsys):
    src = Repo.init(ws / "src")
    add_remote(src, "origin", str(ws / "r.vrl"), create=True)
    src.commit({"w": torch.zeros(2)}, env=False)
    push(src, open_named(src, "origin"), "origin")
    evil = ws / "r.vrl" / "refs" / "heads" / "x\x1b[31mred"
    evil.write_text(src.head() + "\n")
    code, out, err = vrl(capsys, "clone", str(ws / "r.vrl"), "dst")
    assert code == 1 and "invalid name" in err and err.count("\n") == 1
    assert_clean(err)
    assert not (ws / "dst").exists()
