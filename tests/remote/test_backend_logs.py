"""The backends' own log lines and warnings stay off stderr unless `vrl -v` asks for them.

gcsfs warns on every file system made without a project ("GCS project not set"), logs each
request at DEBUG and dumps a traceback at ERROR for a refused request; azure-core logs every
request and response at INFO. None of it is actionable: vrl reports failures in one line.
"""

import subprocess
import sys
import time

import pytest

from vrl.remote import add_remote
from vrl.repo import Repo
from vrl.testing.remote_conformance import azure_case, gcs_case, make_history


@pytest.fixture(params=["gs", "az"])
def case(request):
    if request.param == "gs":
        return gcs_case(request.getfixturevalue("gcs"))
    return azure_case(request.getfixturevalue("azurite"))


def _vrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vrl", *args], capture_output=True,
                          text=True, timeout=120)


def test_push_prints_no_backend_log_lines_unless_verbose(tmp_path, case):
    repo = Repo.init(tmp_path / "src")
    add_remote(repo, "origin", case.url, case.options, create=True)
    make_history(repo, 1)
    quiet = _vrl("-C", str(repo.workdir), "push", "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", quiet.stderr
    make_history(repo, 1, seed=1)
    loud = _vrl("-C", str(repo.workdir), "-vv", "push", "-q")
    assert loud.returncode == 0, loud.stderr
    # the lines exist and -vv shows them: the quiet run hid them
    assert ("gcsfs" if case.url.startswith("gs:") else "azure") in loud.stderr


def test_unreachable_gcs_endpoint_is_one_line_in_seconds(tmp_path):
    """gcsfs logs a traceback at ERROR when it gives up on a request: hidden, so the
    failure is vrl's one line; and its retries are vrl's 3, not gcsfs's 6 (~35 s)."""
    pytest.importorskip("gcsfs")
    from vrl.testing.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    out = _vrl("clone", "gs://bucket/repo", str(tmp_path / "dst"), "-o",
               f"endpoint_url={dead}", "-o", "anon=true")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [out.stderr.strip()], out.stderr
    assert out.stderr.startswith("error: gs://bucket/repo is unreachable"), out.stderr
    assert time.monotonic() - start < 20
    loud = _vrl("-v", "clone", "gs://bucket/repo", str(tmp_path / "dst"), "-o",
                f"endpoint_url={dead}", "-o", "anon=true")
    assert "Traceback" in loud.stderr and "gcsfs" in loud.stderr  # what the quiet run hid
