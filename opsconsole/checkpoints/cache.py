"""Read results cached by node, path, size and mtime: a rescan reads only what changed."""

from __future__ import annotations

import collections
import threading
from typing import Any, Hashable, Optional, Tuple

DEFAULT_ENTRIES = 4096


class ResultCache:
    """A bounded LRU of (node, path) -> (signature, value); a changed signature is a miss.

    The signature is what says the file is the same one: (size, mtime) for a file, the
    names, sizes and mtimes inside for a checkpoint directory. Thread-safe: scans of
    several directories run in worker threads at once.
    """

    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        self.max_entries = max_entries
        self._items: "collections.OrderedDict[Tuple[str, str], Tuple[Hashable, Any]]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.version = 0  # changes with every put and forget: what was derived from the cache may be stale

    def get(self, node: str, path: str, signature: Hashable) -> Optional[Any]:
        """The value stored for this exact signature, else None."""
        key = (node, path)
        with self._lock:
            found = self._items.get(key)
            if found is None or found[0] != signature:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return found[1]

    def put(self, node: str, path: str, signature: Hashable, value: Any) -> None:
        key = (node, path)
        with self._lock:
            self.version += 1
            self._items[key] = (signature, value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def forget(self, node: str, path: str) -> None:
        with self._lock:
            self.version += 1
            self._items.pop((node, path), None)

    def __len__(self) -> int:
        return len(self._items)


# Quick reads (metadata and quick integrity) and full CRC results are cached apart:
# a CRC result outlives rescans as long as the file does not change.
METADATA_CACHE = ResultCache()
CRC_CACHE = ResultCache()
