"""The hostile-remote suite (vrl.testing.hostile) against every backend."""


import pytest

from vrl.testing.hostile import HostileRemote
from vrl.testing.remote_conformance import (
    RemoteCase,
    azure_case,
    gcs_case,
    memory_case,
    s3_case,
    ssh_case,
)


class TestHostileLocal(HostileRemote):
    @pytest.fixture
    def remote(self, tmp_path):
        return RemoteCase(str(tmp_path / "remote.vrl"))


class TestHostileFileUrl(HostileRemote):
    @pytest.fixture
    def remote(self, tmp_path):
        return RemoteCase(f"file://{tmp_path}/remote.vrl")


class TestHostileMemory(HostileRemote):
    @pytest.fixture
    def remote(self):
        return memory_case()


class TestHostileS3(HostileRemote):
    examples = HostileRemote.examples * 2 // 3  # each trial costs seconds against moto

    @pytest.fixture
    def remote(self, s3):
        return s3_case(s3)


class TestHostileSsh(HostileRemote):
    examples = HostileRemote.examples * 2 // 3

    @pytest.fixture
    def remote(self, ssh):
        return ssh_case(ssh)


class TestHostileGcs(HostileRemote):  # emulators answer in ms: the full count
    @pytest.fixture
    def remote(self, gcs):
        return gcs_case(gcs)


class TestHostileAzure(HostileRemote):
    @pytest.fixture
    def remote(self, azurite):
        return azure_case(azurite)
