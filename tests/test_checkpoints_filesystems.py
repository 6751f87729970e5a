"""One file system per node, shared by the Checkpoints pane and the cleanup action."""

import asyncio

from opsconsole.checkpoints.access import LOCAL
from opsconsole.checkpoints.filesystems import FileSystems
from opsconsole.config import NodeConfig, SshConfig
from opsconsole.nodes.ssh import SshLink


async def test_a_node_gets_one_sftp_file_system_and_this_machine_local():
    registry = FileSystems(timeout=5.0)
    loop = asyncio.get_running_loop()
    link = SshLink(NodeConfig(name="n1", host="127.0.0.1", port=1), SshConfig(), 1.0)  # never connected here
    first = registry.get("n1", link, loop)
    assert first is registry.get("n1", link, loop)  # the pane's scan and the cleanup share it
    assert first.remote and first is not registry.get("n2", link, loop)
    assert registry.get("local", None, loop) is LOCAL
    await registry.aclose()
    assert registry.get("n1", link, loop) is not first  # closed with the console: a new one after
    await registry.aclose()
