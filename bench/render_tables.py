"""Splice the benchmark tables into docs/benchmarks.md.

The page marks each table with `<!-- table:<name> -->` ... `<!-- /table:<name> -->`. A table
comes from bench/out/<name>.md, or is built here from the JSON a benchmark wrote (remote,
trainer); one whose inputs are missing is left as it is. Run by `dvc repro`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def _load(name: str) -> dict | None:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def remote_table() -> str | None:
    data = _load("remote_bench")
    if not data:
        return None
    cols = [data.get("small"), data.get("big")]
    if not all(cols):
        return None
    mb = 1e6

    def row(label: str, cell) -> str:
        return f"| {label} | " + " | ".join(cell(c) for c in cols) + " |"

    return "\n".join([
        "| | small policy (1 MB, 1 tensor changes per commit) | "
        "400 MB model (2 of 40 tensors change per commit) |", "|---|---|---|",
        row("bytes sent by the first push", lambda c: (
            f"{c['push']['bytes_sent'] / mb:.2f} MB, "
            f"{'exactly' if c['push']['bytes_sent_equals_distinct'] else 'not'} the distinct "
            f"objects (a whole checkpoint per commit, as `dvc push` of a file sends: "
            f"{c['whole_checkpoint_per_commit_bytes'] / mb:,.0f} MB)")),
        row("push / plain parallel s3fs upload of the same files (goal <= 1.2x)", lambda c: (
            f"{c['push']['seconds']:.2f} s / {c['plain_s3fs_put']['seconds']:.2f} s = "
            f"**{c['push_vs_plain_s3fs']:.2f}x**")),
        row("second push, nothing new (goal < 0.5 s): API / CLI", lambda c: (
            f"{c['noop_push_s']:.2f} s / {c['noop_push_cli_s']:.2f} s")),
        row("incremental push of one commit", lambda c: (
            f"{c['incremental_push']['objects']['tensor']} tensor(s) + manifest + commit, "
            f"{c['incremental_push']['bytes'] / mb:.2f} MB, "
            f"{c['incremental_push']['seconds']:.2f} s")),
        row("pull of that commit", lambda c: f"{c['pull']['seconds']:.2f} s"),
        row("full clone / metadata-only clone", lambda c: (
            f"{c['clone_s']:.2f} s / {c['clone_metadata_only_s']:.2f} s")),
    ])


def remote_backends_table() -> str | None:
    data = _load("remote_backends")
    if not data or not data.get("backends"):
        return None
    names = {"local": "local path", "s3": "`s3://` (moto)", "sftp": "`ssh://` (asyncssh)",
             "gs": "`gs://` (fake-gcs-server)", "az": "`az://` (Azurite)"}
    lines = ["| backend (server on 127.0.0.1) | push | push, nothing new | clone |",
             "|---|---|---|---|"]
    for key, row in data["backends"].items():
        lines.append(f"| {names.get(key, key)} | {row['push_s'] * 1e3:.0f} ms | "
                     f"{row['noop_push_s'] * 1e3:.1f} ms | {row['clone_s'] * 1e3:.0f} ms |")
    return "\n".join(lines)


def trainer_table() -> str | None:
    env, train, cart = _load("trainer_env_bench"), _load("trainer_train_bench"), \
        _load("trainer_cartpole")
    ware = _load("trainer_warehouse_2m") or _load("trainer_warehouse")
    if not (env and train and cart and ware):
        return None
    steps = {r["threads"]: r["agent_steps_per_s"] for r in env["results"]}
    res = train["results"]
    variants = ware["variants"]

    def mean_std(v: list | None) -> str:
        return f"{v[0]:.2f} +/- {v[1]:.2f}" if v else "-"

    wh = "; ".join(f"{name} {mean_std(v['train_final_return'])} "
                   f"({v['train_final_deliveries'][0]:.0f})" for name, v in variants.items()
                   if v.get("train_final_return"))
    reach = "; ".join(f"{name} {v['iterations_to_90pct_mean'][0]:.0f}"
                      for name, v in variants.items() if v.get("iterations_to_90pct_mean"))
    std = "; ".join(f"{name} {v['return_std_last4_evals'][0]:.2f}"
                    for name, v in variants.items() if v.get("return_std_last4_evals"))
    return "\n".join([
        "| measurement | result | goal |", "|---|---|---|",
        f"| warehouse stepping, {env['results'][0]['num_envs']} worlds x "
        f"{env['results'][0]['num_agents']} AGVs, observations included | "
        + ", ".join(f"{v / 1e6:.2f} M agent-steps/s ({t} thread{'s' * (t > 1)})"
                    for t, v in sorted(steps.items())) + " | >= 1 M |",
        f"| end-to-end training, {train['batch']:,} samples per iteration, "
        f"{train['update_epochs']} epochs x {train['num_minibatches']} minibatches | "
        + "; ".join(f"{k} {v['sps'] / 1e3:.1f} k agent-steps/s ({v['update_s']:.1f} s per "
                    "update)" for k, v in res.items()) + " | - |",
        f"| PPO on CartPole-v1, mean return of the last 100 episodes at {cart['steps']:,} "
        "steps | " + " / ".join(f"{r['return_last100']:.0f}" for r in cart["runs"])
        + f" ({cart['seeds_reaching_475']} of {len(cart['runs'])} seeds >= 475) "
        "| >= 475, 3 of 3 |",
        f"| warehouse: training return (deliveries per episode), 3 seeds | {wh} | - |",
        f"| iterations to reach 90% of PPO's improvement | {reach} | GSPO 1.76x faster "
        "(the original recipe's claim) |",
        f"| return std over the last 4 evaluations (\"stability\") | {std} | GSPO 38% lower "
        "(the original recipe's claim) |",
    ])


BUILT = {"remote": remote_table, "remote-backends": remote_backends_table,
         "trainer": trainer_table}


def render(readme: str) -> tuple[str, list[str]]:
    updated = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        table = OUT / f"{name}.md"
        text = table.read_text() if table.exists() else (
            BUILT[name]() if name in BUILT else None)
        if not text:
            return match.group(0)
        updated.append(name)
        return f"<!-- table:{name} -->\n{text.strip()}\n<!-- /table:{name} -->"

    text = re.sub(r"<!-- table:([\w-]+) -->\n.*?<!-- /table:\1 -->", replace, readme,
                  flags=re.S)
    return text, updated


def main() -> int:
    path = ROOT / "docs" / "benchmarks.md"
    text, updated = render(path.read_text())
    path.write_text(text)
    print(f"updated tables: {', '.join(updated) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
