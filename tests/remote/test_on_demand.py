"""A partial clone downloads what it lacks when read, from any program that opens it: the
store finds the remote layer through its entry point, not because something imported it."""

import subprocess
import sys

import numpy as np
import pytest

from vrl.errors import PrunedError
from vrl.remote import add_remote, clone, open_named, push
from vrl.repo import Repo

SCRIPT = """
import sys
import numpy as np
import vrl
repo = vrl.Repo(sys.argv[1], fetch=sys.argv[2] == "1")
assert "vrl.remote" not in sys.modules, "opening a repository imported the remote layer"
try:
    state = repo.load("HEAD")
except vrl.VrlError as exc:
    print("error:", exc)
    raise SystemExit(3)
print(float(np.asarray(state["w"]).sum()), "vrl.remote" in sys.modules)
"""


@pytest.fixture
def partial(tmp_path):
    src = Repo.init(tmp_path / "src")
    src.commit({"w": np.full((32, 32), 2, np.float32)}, env=False, message="one")
    add_remote(src, "origin", str(tmp_path / "remote"))
    push(src, open_named(src, "origin"), "origin", create=True)
    return clone(str(tmp_path / "remote"), tmp_path / "lazy", metadata_only=True)


def _run(path, fetch: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(path), "1" if fetch else "0"],
                          capture_output=True, text=True, timeout=120)


def test_a_script_that_never_imports_vrl_remote_reads_a_partial_clone(partial):
    out = _run(partial.workdir, fetch=True)
    assert out.returncode == 0, out.stdout + out.stderr
    total, loaded = out.stdout.split()
    assert float(total) == 2 * 32 * 32 and loaded == "True"  # fetched on the miss only


def test_fetch_false_never_contacts_a_remote(partial):
    out = _run(partial.workdir, fetch=False)
    assert out.returncode == 3 and "fetch=False" in out.stdout, out.stdout + out.stderr
    with pytest.raises(PrunedError):
        Repo(partial.workdir, fetch=False).load("HEAD")
    assert Repo(partial.workdir).load("HEAD")["w"].sum() == 2 * 32 * 32
