"""The hostile-remote suite (vrl.testing.hostile) against every backend."""

import uuid

import pytest

from vrl.testing.hostile import HostileRemote
from vrl.testing.remote_conformance import RemoteCase


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
        return RemoteCase(f"memory://vrl-{uuid.uuid4().hex}/repo", multiprocess=False)


class TestHostileS3(HostileRemote):
    examples = HostileRemote.examples * 2 // 3  # each trial costs seconds against moto

    @pytest.fixture
    def remote(self, s3):
        import boto3

        bucket = f"vrl-{uuid.uuid4().hex[:12]}"
        endpoint = f"http://127.0.0.1:{s3.port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        return RemoteCase(f"s3://{bucket}/team/repo", {"endpoint_url": endpoint})


class TestHostileSsh(HostileRemote):
    examples = HostileRemote.examples * 2 // 3

    @pytest.fixture
    def remote(self, ssh):
        return RemoteCase(f"ssh://tester@127.0.0.1:{ssh.server.port}/{uuid.uuid4().hex}/repo",
                          ssh.options())
