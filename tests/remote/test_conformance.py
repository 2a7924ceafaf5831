"""Every backend runs the shipped conformance suite against a real endpoint on 127.0.0.1."""

import uuid

import pytest

from vrl.testing.remote_conformance import RemoteCase, RemoteConformance


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
        return RemoteCase(f"memory://vrl-{uuid.uuid4().hex}/repo", multiprocess=False)


class TestS3(RemoteConformance):
    @pytest.fixture
    def remote(self, s3):
        import boto3

        bucket = f"vrl-{uuid.uuid4().hex[:12]}"
        endpoint = f"http://127.0.0.1:{s3.port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        return RemoteCase(f"s3://{bucket}/team/repo", {"endpoint_url": endpoint})


class TestSsh(RemoteConformance):
    @pytest.fixture
    def remote(self, ssh):
        return RemoteCase(f"ssh://tester@127.0.0.1:{ssh.server.port}/{uuid.uuid4().hex}/repo",
                          ssh.options(), kill_server=ssh.server.kill,
                          restart_server=ssh.server.restart)
