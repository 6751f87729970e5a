"""One node per host, whatever the scrape targets are called: the Prometheus source's naming.

A host's exporters are separate scrape targets. With targets given by IP address (static or
file_sd configs), dcgm-exporter's series say the host's name in `Hostname` (`hostname`
since dcgm-exporter 4.x) while node-exporter's say only `instance="10.0.0.5:9100"`. A
series is first named by its raw node label (the first of `node_labels` it carries; the
instance without its port): that is its *raw name*. Raw names are then joined into one node
by what the targets say about their host, in this order:

1. node-exporter's `node_uname_info{nodename=...}` for the instance's host part;
2. dcgm-exporter's `Hostname`/`hostname` label for the instance's host part;
3. the instance's host part itself;

and the result is renamed by the source's `node_names` mapping ("10.0.0.5=gpu-a"), whose
keys may be the address or any name above. An address that serves several different
nodenames or hostnames (exporters behind one proxy, or several test exporters on
127.0.0.1) names nothing: each of its hosts keeps its own name.
No I/O here.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple


def strip_port(value: str) -> str:
    """`host:9100` -> `host`, `[::1]:9100` -> `::1`; anything else as it is."""
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and host and ":" not in host:
        return host
    return value


def parse_node_names(entries: Iterable[str]) -> Dict[str, str]:
    """The `node_names` config entries ("ADDRESS_OR_NAME=NODE") as a dict; entries without "=" are skipped."""
    out: Dict[str, str] = {}
    for entry in entries:
        key, sep, name = entry.partition("=")
        if sep and key.strip() and name.strip():
            out[key.strip()] = name.strip()
    return out


class _HostFacts:
    __slots__ = ("nodenames", "hostnames")

    def __init__(self) -> None:
        self.nodenames: Set[str] = set()
        self.hostnames: Set[str] = set()


class NodeIdentity:
    """What the targets say about their hosts, and the node each raw name belongs to."""

    def __init__(self, mapping: Optional[Mapping[str, str]] = None) -> None:
        self.mapping: Dict[str, str] = dict(mapping or {})
        self._hosts: Dict[str, _HostFacts] = {}  # instance host part -> names said for it
        self._addresses: Dict[str, Set[str]] = {}  # raw name -> instance host parts of its series
        self._resolved: Dict[str, str] = {}

    # --- facts, from the answers ---------------------------------------------------------

    def _facts(self, address: str) -> _HostFacts:
        facts = self._hosts.get(address)
        if facts is None:
            facts = self._hosts[address] = _HostFacts()
        return facts

    def saw(
        self, raw: str, instance: Optional[str], nodename: Optional[str] = None, hostname: Optional[str] = None
    ) -> None:
        """A series named `raw` came from target `instance`; its node-exporter nodename or dcgm hostname, if it said one."""
        if not instance:
            return
        address = strip_port(instance)
        addresses = self._addresses.get(raw)
        if addresses is None:
            addresses = self._addresses[raw] = set()
        if address not in addresses:
            addresses.add(address)
            self._resolved.clear()
        facts = self._facts(address)
        if nodename and nodename not in facts.nodenames:
            facts.nodenames.add(nodename)
            self._resolved.clear()
        if hostname and hostname not in facts.hostnames:
            facts.hostnames.add(hostname)
            self._resolved.clear()

    def addresses(self, raw: str) -> Set[str]:
        """The instance host parts that `raw`'s series came from."""
        return self._addresses.get(raw, set())

    # --- naming --------------------------------------------------------------------------

    def node(self, raw: str) -> str:
        """The node that raw name `raw` belongs to."""
        name = self._resolved.get(raw)
        if name is None:
            name = self._resolved[raw] = self._resolve(raw)
        return name

    def _resolve(self, raw: str) -> str:
        addresses = self._addresses.get(raw, set())
        if raw in self._hosts:
            addresses = addresses | {raw}
        name = raw
        if len(addresses) == 1:
            address = next(iter(addresses))
            facts = self._hosts.get(address)
            if facts is not None and len(facts.hostnames) <= 1 and len(facts.nodenames) <= 1:
                if facts.nodenames:
                    name = next(iter(facts.nodenames))
                elif facts.hostnames and raw == address:
                    name = next(iter(facts.hostnames))
        mapped = self.mapping.get(name) or self.mapping.get(raw)
        if mapped is None:
            for address in sorted(addresses):
                mapped = self.mapping.get(address)
                if mapped is not None:
                    break
        return mapped or name

    def groups(self, raws: Iterable[str]) -> Dict[str, List[str]]:
        """node -> the raw names joined into it (sorted), for `raws`."""
        out: Dict[str, List[str]] = {}
        for raw in raws:
            out.setdefault(self.node(raw), []).append(raw)
        for members in out.values():
            members.sort()
        return out

    def node_addresses(self, raws: Iterable[str]) -> Tuple[str, ...]:
        """The instance host parts of all of `raws` (a node's): what its node-exporter series match."""
        found: Set[str] = set()
        for raw in raws:
            found |= self._addresses.get(raw, set())
            if raw in self._hosts:
                found.add(raw)
        return tuple(sorted(found))
