"""A local SSH/SFTP server (asyncssh) for tests: 127.0.0.1 only, key authentication only.

`python -m vrl.testing.sftpserver PORT ROOT HOST_KEY AUTHORIZED_KEYS` serves ROOT (as `/`)
until killed.
"""

from __future__ import annotations

import argparse
import asyncio

from vrl.testing.servers import exit_with_parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("root")
    parser.add_argument("host_key")
    parser.add_argument("authorized_keys")
    args = parser.parse_args()
    exit_with_parent()
    import asyncssh

    def sftp_factory(chan: asyncssh.SSHServerChannel) -> asyncssh.SFTPServer:
        return asyncssh.SFTPServer(chan, chroot=args.root)

    async def serve() -> None:
        await asyncssh.listen("127.0.0.1", args.port, server_host_keys=[args.host_key],
                              authorized_client_keys=args.authorized_keys,
                              sftp_factory=sftp_factory, allow_scp=False)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
