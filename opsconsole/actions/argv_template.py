"""Argv templates from the config ("nvidia-smi --gpu-reset -i {index}"): each word formatted alone.

A value that fills a placeholder may come from a node's frame (a GPU's UUID, its PCI id),
and a node can be compromised or simply wrong: each value must have the shape its name
promises, or the command is not built. Each filled word stays one argv word, so even an
odd value cannot become a second command; over SSH the words are shlex-quoted.
"""

from __future__ import annotations

import re
import string
from typing import Dict, List, Optional, Sequence

VALUE_PATTERNS = {
    "uuid": re.compile(r"(GPU|MIG)-[0-9A-Fa-f-]{8,64}"),
    "pci_bus_id": re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"),
    "node": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}"),
    "index": re.compile(r"[0-9]{1,3}"),
}


def template_fields(template: Sequence[str]) -> List[str]:
    """The placeholder names a template uses, in order."""
    return [name for word in template for _, name, _, _ in string.Formatter().parse(word) if name is not None]


def fill_template(template: Sequence[str], values: Dict[str, Optional[str]]) -> List[str]:
    """Format each word; a value missing or not of its expected shape raises ValueError (one line)."""
    if not template:
        raise ValueError("the command template is empty")
    for name in dict.fromkeys(template_fields(template)):
        value = values.get(name)
        if value is None:
            raise ValueError("{%s}: no value (the node did not report it)" % name)
        pattern = VALUE_PATTERNS.get(name)
        if pattern is not None and not pattern.fullmatch(value):
            raise ValueError("{%s}: refusing the value %r (not a valid %s)" % (name, value[:80], name))
    return [word.format_map(values) for word in template]
