import json

from click.testing import CliRunner

from trainer.cli import train


def test_train_warehouse_writes_jsonl(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(train, [
        "--env", "warehouse", "--algo", "ppo", "--steps", "1024", "--seed", "3",
        "--device", "cpu", "--set", "num_envs=2", "--set", "num_steps=16",
        "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--set", "hidden_sizes=[16]",
        "--set", "num_minibatches=2", "--set", "update_epochs=2",
        "--out", str(out), "--no-progress", "--log-every", "1", "--no-store"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert lines[-1]["charts/global_step"] == 1024
    assert "losses/approx_kl" in lines[0] and "env/deliveries" in lines[0]
    assert "iter 8 | step 1024" in result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["charts/global_step"] == 1024
    assert "num_agents: 4" in (out / "config.yaml").read_text()


def test_bad_override_is_a_short_error():
    result = CliRunner().invoke(train, ["--set", "nope=1", "--device", "cpu"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: unknown ppo config key 'nope'"


def test_bad_env_is_a_short_error():
    result = CliRunner().invoke(train, ["--env", "atari", "--device", "cpu"])
    assert result.exit_code == 1 and "unknown env 'atari'" in result.output


def test_unknown_env_option_is_a_short_error():
    result = CliRunner().invoke(train, ["--set", "env.speed=3", "--device", "cpu"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: unknown warehouse option(s) ['speed']")
