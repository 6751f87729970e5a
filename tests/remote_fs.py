"""A node's checkpoint file system over the real sshd of tests/sshd.py on 127.0.0.1 (SFTP and the
node-side helpers), as the console makes one for a node: for the remote listing and cleanup tests."""

from __future__ import annotations

import asyncio

from opsconsole.checkpoints.remote import SftpFileSystem
from opsconsole.config import NodeConfig, SshConfig
from opsconsole.nodes.ssh import SshLink

FAST = SshConfig(connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2)


def remote_fs(sshd_factory, timeout=None):
    """(link, file system) to a fresh sshd; the caller closes the link. Call within the running loop."""
    server = sshd_factory.start()
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port), FAST, 1.0)
    options = {} if timeout is None else {"timeout": timeout}
    return link, SftpFileSystem(link, asyncio.get_running_loop(), **options)
