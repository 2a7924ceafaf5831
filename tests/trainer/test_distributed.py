import os
import re
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from trainer.devices import dist_backend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PORT_CLASH = re.compile(r"Address already in use|EADDRINUSE|errno:? ?98\b", re.IGNORECASE)


def port_clash(output: str) -> bool:
    """Whether a worker failed because its rendezvous port was taken."""
    return bool(_PORT_CLASH.search(output))


def test_only_a_port_clash_counts_as_one():
    assert port_clash("RuntimeError: The server socket has failed to listen on any local "
                      "network address. port: 29500, useIpv6: false, code: -98, name: "
                      "EADDRINUSE, message: address already in use")
    assert port_clash("OSError: [Errno 98] Address already in use")
    assert not port_clash("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert not port_clash("AssertionError: ranks diverged at iteration 2")


WORKER = """
import os, sys
import torch
from trainer.config import GSPOConfig
from trainer.devices import resolve_device
from trainer.distributed import init_distributed, shutdown
from trainer.envs.warehouse import WarehouseEnv
from trainer.train import Trainer

torch.set_num_threads(1)
ctx = init_distributed(resolve_device("cpu"))
cfg = GSPOConfig(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * 2 * 3, hidden_sizes=[16],
                 num_minibatches=4, update_epochs=2, hessian_interval=2)
env = WarehouseEnv(2, num_agents=4, max_steps=24, seed=cfg.seed + 7919 * ctx.rank,
                   layout_kwargs=dict(blocks_x=2, blocks_y=2))
trainer = Trainer(env, cfg, dist=ctx)
first_obs = trainer.next_obs.clone()
trainer.train()
torch.save({"params": [p.detach() for p in trainer.agent.parameters()], "obs": first_obs,
            "iteration": trainer.iteration, "global_step": trainer.global_step},
           os.path.join(sys.argv[1], f"rank{ctx.rank}.pt"))
shutdown(ctx)
"""


def _launch_pair(script, tmp_path) -> list[tuple[int, str]]:
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [root,
                                                           os.environ.get("PYTHONPATH")]))}
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return [(p.returncode, out) for p in procs for out, _ in [p.communicate(timeout=240)]]


def test_two_gloo_processes_stay_in_sync(tmp_path):
    # plain subprocesses (what torchrun would start), so the worker never has to
    # import this test module
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    results = _launch_pair(script, tmp_path)
    if any(code != 0 for code, _ in results) and any(port_clash(out) for _, out in results):
        # the free port can be taken by another test's server between choosing and
        # binding it: only that is retried (once, on a new port), any other failure fails
        results = _launch_pair(script, tmp_path)
    for code, out in results:
        assert code == 0, out[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["iteration"] == r1["iteration"] == 3  # steps count both ranks' experience
    assert r0["global_step"] == 2 * 4 * 16 * 2 * 3
    assert not torch.equal(r0["obs"], r1["obs"])  # each rank sees its own environments
    assert all(torch.equal(a, b) for a, b in zip(r0["params"], r1["params"], strict=True))


def test_backend_per_device():
    assert dist_backend(torch.device("cpu")) == "gloo"
    assert dist_backend(torch.device("cuda", 0)) == "nccl"
    # torch.device("npu") only exists once torch_npu is imported
    assert dist_backend(SimpleNamespace(type="npu")) == "hccl"


@pytest.mark.slow
def test_torchrun_cli(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), "-m", "trainer", "--device", "cpu",
           "--steps", "2048", "--set", "num_envs=2", "--set", "num_steps=16",
           "--set", "env.num_agents=4", "--set", "num_minibatches=4", "--set", "update_epochs=2",
           "--no-progress", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 8  # rank 0 only
