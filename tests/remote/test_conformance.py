"""Every backend runs the shipped conformance suite against a real endpoint on 127.0.0.1."""


import pytest

from vrl.testing.remote_conformance import (
    RemoteCase,
    RemoteConformance,
    azure_case,
    gcs_case,
    memory_case,
    s3_case,
    ssh_case,
)


class TestLocal(RemoteConformance):
    @pytest.fixture
    def remote(self, tmp_path):
        return RemoteCase(str(tmp_path / "remote.vrl"))


class TestFileUrl(RemoteConformance):
    @pytest.fixture
    def remote(self, tmp_path):
        return RemoteCase(f"file://{tmp_path}/remote.vrl")


class TestMemory(RemoteConformance):
    @pytest.fixture
    def remote(self):
        return memory_case()


class TestS3(RemoteConformance):
    @pytest.fixture
    def remote(self, s3):
        return s3_case(s3)


class TestSsh(RemoteConformance):
    @pytest.fixture
    def remote(self, ssh):
        return ssh_case(ssh, kill_server=ssh.server.kill, restart_server=ssh.server.restart)


class TestGcs(RemoteConformance):
    @pytest.fixture
    def remote(self, gcs):
        return gcs_case(gcs)


class TestAzure(RemoteConformance):
    @pytest.fixture
    def remote(self, azurite):
        return azure_case(azurite)
