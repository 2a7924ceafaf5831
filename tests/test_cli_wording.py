"""What the command line says reads as sentences: whole command summaries in `--help`,
counts with their plurals right."""

import torch
from helpers import vrl

from vrl.workspace import write_checkpoint


def test_top_level_help_shows_every_command_summary_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = vrl(capsys, "--help")
    assert code == 0
    commands = out.split("Commands:\n")[1]
    assert not any(line.endswith("...") for line in commands.splitlines())  # click's cut
    flat = " ".join(commands.split())
    assert "compare Compare runs: one row per branch head (or REV), the hyperparameters that " \
           "differ, the last and best value of metrics, step, snapshots and where each run " \
           "branched." in flat
    assert "checkout Switch to a branch or snapshot and write it to the workspace " \
           "checkpoint." in flat
    assert max(len(line) for line in out.splitlines()) <= 80


def test_counts_have_their_plurals(ws, capsys):
    vrl(capsys, "init")
    write_checkpoint({"w": torch.zeros(2)}, "policy.safetensors")
    vrl(capsys, "commit", "-m", "one", "--no-env")
    code, out, _ = vrl(capsys, "export", "HEAD", "one.pt")
    assert code == 0 and "(1 tensor, " in out
    code, out, _ = vrl(capsys, "fsck")
    assert code == 0 and out.startswith("checked ") and " objects: ok" in out
    code, out, _ = vrl(capsys, "repack")
    assert "(1 file replaced)" in out or "1 objects" not in out


def test_every_option_of_every_command_is_explained_in_a_sentence():
    import click

    from vrl.cli import cli

    ctx = click.Context(cli)
    fragments = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        commands = [(name, command)]
        if isinstance(command, click.Group):
            commands += [(f"{name} {sub}", command.get_command(ctx, sub))
                         for sub in command.list_commands(ctx)]
        for label, cmd in commands:
            for param in cmd.params:
                text = (getattr(param, "help", None) or "").strip()
                if isinstance(param, click.Option) and not (
                        text[:1].isupper() and text.endswith(".")):
                    fragments.append(f"{label} {param.opts[-1]}: {text!r}")
    assert fragments == []
