"""One file system per node for everything that reads or deletes checkpoints.

The Checkpoints pane's scans and CRC checks and the checkpoint cleanup action ask here, so a remote
node has one SftpFileSystem (one SFTP channel on the node's shared SSH connection), made on first use
and kept until the console closes the registry; this machine's directories are LOCAL.
"""

import asyncio
import threading
from typing import Any, Dict, Optional

from opsconsole.checkpoints.access import LOCAL


class FileSystems:
    """FileSystem by node name; safe to ask from worker threads (scans of one node may ask at once)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout  # of one SFTP call
        self._by_node: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, node: str, link: Optional[Any], loop: asyncio.AbstractEventLoop) -> Any:
        """LOCAL when `link` is None (this machine), else the node's SftpFileSystem on `link`, made once.

        `loop` is the console's event loop (the SFTP calls run on it; a worker thread waits on them).
        """
        if link is None:
            return LOCAL
        with self._lock:
            fs = self._by_node.get(node)
            if fs is None:
                from opsconsole.checkpoints.remote import SftpFileSystem

                fs = SftpFileSystem(link, loop, timeout=self.timeout)
                self._by_node[node] = fs
            return fs

    async def aclose(self) -> None:
        """Close every SFTP channel (the console is closing); a broken one is left as it is."""
        with self._lock:
            opened, self._by_node = list(self._by_node.values()), {}
        for fs in opened:
            try:
                await fs.aclose()
            except Exception:
                pass  # closing a broken SFTP channel: nothing left to do
