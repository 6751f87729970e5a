"""NVIDIA's Xid catalog: what an Xid means and the action it calls for, and what the console offers for it.

After NVIDIA's "Xid Catalog" for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html), whose "Resolution Bucket (Immediate Action)" column sorts each Xid
into RESTART_APP, RESET_GPU, RESTART_BM (reboot the node), CONTACT_SUPPORT and so on; here the
buckets are the operator's four actions, plus "none" for the Xids that only report (a consequence
of an earlier Xid, a corrected error). Xid 154 carries its own action in its text ("GPU recovery
action changed from 0x0 (None) to 0x1 (Reset Required)"): it is read from the line.

Where the catalog says reset and the GPU runs no process, the console offers its GPU-reset key
(R on the GPUs pane, with its pre-checks and typed confirmation); where it says reboot or service,
it offers the node's drain (D). Nothing here acts: actions/ does, through its registry.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Optional, Tuple

from opsconsole.model import frozen

ACTION_NONE = "none"
ACTION_RESTART_APP = "restart_app"
ACTION_RESET_GPU = "reset_gpu"
ACTION_REBOOT_NODE = "reboot_node"
ACTION_DRAIN = "drain_service"
# From the least to the most disruptive: several Xids call for the most disruptive one's action.
ACTION_ORDER = (ACTION_NONE, ACTION_RESTART_APP, ACTION_RESET_GPU, ACTION_REBOOT_NODE, ACTION_DRAIN)
ACTION_TEXT = {
    ACTION_NONE: "no action: a notice, or a consequence of an earlier error",
    ACTION_RESTART_APP: "restart the application (the GPU is fine)",
    ACTION_RESET_GPU: "reset the GPU once no process uses it (nvidia-smi -r)",
    ACTION_REBOOT_NODE: "reboot the node",
    ACTION_DRAIN: "drain the node and have the GPU serviced (RMA)",
}
ACTION_SHORT = {
    ACTION_NONE: "info",
    ACTION_RESTART_APP: "app",
    ACTION_RESET_GPU: "reset",
    ACTION_REBOOT_NODE: "reboot",
    ACTION_DRAIN: "drain",
}


@frozen
class XidEntry:
    """One row of the catalog."""

    code: int
    name: str  # NVIDIA's mnemonic, shortened
    meaning: str
    action: str
    note: str = ""  # what to check before or after


def _entries() -> Dict[int, XidEntry]:
    rows = [
        XidEntry(8, "FIFO_IDLE_TIMEOUT", "GPU stopped processing (a channel timed out)", ACTION_RESTART_APP),
        XidEntry(
            13,
            "GR_EXCEPTION",
            "graphics engine exception: usually the application (an out-of-range access in a kernel)",
            ACTION_RESTART_APP,
            "recurs on one GPU only: run the GPU checks",
        ),
        XidEntry(
            31,
            "FAULT_PDE/PTE",
            "GPU memory page fault: an illegal address, usually the application",
            ACTION_RESTART_APP,
            "compute-sanitizer finds the faulting kernel",
        ),
        XidEntry(
            32,
            "PBDMA_ERROR",
            "invalid or corrupted push buffer stream (PCIe or host memory can cause it)",
            ACTION_RESTART_APP,
            "recurs: check PCIe (AER in dmesg) and reset the GPU",
        ),
        XidEntry(
            43,
            "RESETCHANNEL_VERIF_ERROR",
            "GPU stopped processing the application's channel (the application faulted)",
            ACTION_RESTART_APP,
        ),
        XidEntry(
            45,
            "PREEMPTIVE_REMOVAL",
            "preemptive cleanup after an earlier error: look at the Xid before it",
            ACTION_NONE,
        ),
        XidEntry(
            48,
            "ECC_DBE",
            "double-bit (uncorrectable) ECC error",
            ACTION_RESET_GPU,
            "row remapping follows (Xid 63/64): check nvidia-smi -q -d ROW_REMAPPER",
        ),
        XidEntry(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint or warning", ACTION_RESET_GPU),
        XidEntry(
            62,
            "PMU_HALT",
            "internal micro-controller halt",
            ACTION_RESET_GPU,
            "recurs after a reset: reboot, then service",
        ),
        XidEntry(
            63,
            "ROW_REMAP_EVENT",
            "ECC page retirement or row remapping recorded; it takes effect at the next GPU reset",
            ACTION_RESET_GPU,
            "no hurry: reset when the GPU is idle",
        ),
        XidEntry(
            64,
            "ROW_REMAP_FAILURE",
            "ECC page retirement or row remapping failed: the memory fault cannot be fenced off",
            ACTION_DRAIN,
        ),
        XidEntry(68, "NVDEC_EXCEPTION", "video decoder exception", ACTION_RESTART_APP),
        XidEntry(69, "GR_CLASS_ERROR", "graphics engine class error", ACTION_RESTART_APP),
        XidEntry(
            74,
            "NVLINK_ERROR",
            "NVLink error",
            ACTION_RESET_GPU,
            "recurs: check the links (nvidia-smi nvlink -e) and service",
        ),
        XidEntry(
            79,
            "GPU_FALLEN_OFF_BUS",
            "GPU has fallen off the bus: the host no longer reaches it",
            ACTION_REBOOT_NODE,
            "recurs: drain and service the GPU, riser or slot",
        ),
        XidEntry(
            92, "HIGH_SBE_RATE", "high single-bit ECC error rate (corrected)", ACTION_NONE, "keeps rising: plan a reset"
        ),
        XidEntry(
            94,
            "CONTAINED_ECC",
            "contained ECC error: only the process that touched the bad memory was stopped",
            ACTION_RESTART_APP,
            "reset the GPU when it is idle to remap the row; recurs: service",
        ),
        XidEntry(
            95, "UNCONTAINED_ECC", "uncontained ECC error: every process on the GPU is affected", ACTION_RESET_GPU
        ),
        XidEntry(109, "CTXSW_TIMEOUT", "context switch timeout", ACTION_RESTART_APP),
        XidEntry(
            119,
            "GSP_RPC_TIMEOUT",
            "GSP RPC timeout: the GPU's system processor stopped answering",
            ACTION_RESET_GPU,
            "the reset fails: reboot the node",
        ),
        XidEntry(120, "GSP_ERROR", "GSP error", ACTION_RESET_GPU, "the reset fails: reboot the node"),
        XidEntry(121, "C2C_LINK_ERROR", "chip-to-chip (C2C) link error", ACTION_RESET_GPU),
        XidEntry(137, "NVLINK_TLC_RX_PRIV", "NVLink receive error", ACTION_RESET_GPU),
        XidEntry(140, "ECC_UNRECOVERED", "unrecovered ECC error", ACTION_RESET_GPU, "recurs: service"),
        XidEntry(143, "GPU_INIT_FAILURE", "GPU initialisation failure", ACTION_REBOOT_NODE, "recurs: service"),
    ]
    for code, what in (
        (144, "SAW"),
        (145, "RLW"),
        (146, "TLW"),
        (147, "TREX"),
        (148, "NVLPW control"),
        (149, "NETIR"),
        (150, "MSE"),
    ):
        rows.append(
            XidEntry(
                code,
                "NVLINK_%s_ERROR" % what.split()[0].upper(),
                "NVLink %s error" % what,
                ACTION_RESET_GPU,
                "the driver's Xid 154 names the recovery it needs",
            )
        )
    rows.append(
        XidEntry(
            154,
            "GPU_RECOVERY_ACTION",
            "the driver says what recovery the GPU needs",
            ACTION_RESET_GPU,
            "the line names the action: Reset Required, Reboot Required, Drain P2P, Drain and Reset",
        )
    )
    return {row.code: row for row in rows}


CATALOG: Dict[int, XidEntry] = _entries()

# "NVRM: Xid (PCI:0000:17:00): 79, pid=..., GPU has fallen off the bus." (also "Xid (0000:17:00)")
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]{0,20})\): (\d{1,4})\b,?\s?(.{0,300})")
_RECOVERY = re.compile(r"recovery action changed from .{0,40}? to 0x[0-9a-fA-F]+ \(([A-Za-z0-9 ]{1,40})\)")
_RECOVERY_ACTIONS = {
    "none": ACTION_NONE,
    "reset required": ACTION_RESET_GPU,
    "reboot required": ACTION_REBOOT_NODE,
    "drain p2p": ACTION_DRAIN,
    "drain and reset": ACTION_DRAIN,
}


@frozen
class XidSeen:
    """One Xid as seen (an NVML event or a kernel line), decoded."""

    code: int
    meaning: str
    action: str
    note: str = ""
    pci: Optional[str] = None
    known: bool = True

    @property
    def action_text(self) -> str:
        return ACTION_TEXT[self.action]

    def describe(self) -> str:
        """ "Xid 79 (GPU has fallen off the bus ...): reboot the node"."""
        return "Xid %d (%s): %s" % (self.code, self.meaning, self.action_text)


def decode(code: int, text: str = "", pci: Optional[str] = None) -> XidSeen:
    """The catalog's meaning and action for `code`; Xid 154's action from its `text` when it names one."""
    entry = CATALOG.get(int(code))
    if entry is None:
        return XidSeen(int(code), "not in this catalog: see NVIDIA's Xid catalog", ACTION_NONE, pci=pci, known=False)
    action = entry.action
    if entry.code == 154:
        found = _RECOVERY.search(text)
        if found is not None:
            action = _RECOVERY_ACTIONS.get(found.group(1).strip().lower(), action)
    return XidSeen(entry.code, entry.meaning, action, entry.note, pci)


def decode_line(line: str) -> Optional[XidSeen]:
    """An `NVRM: Xid (PCI:...): N, ...` kernel line decoded; None for any other line."""
    found = XID_LINE.search(line)
    if found is None:
        return None
    return decode(int(found.group(2)), found.group(3), found.group(1) or None)


def worst_action(seen: Iterable[XidSeen]) -> str:
    """The most disruptive action several Xids call for (none when there are none)."""
    return max((item.action for item in seen), key=ACTION_ORDER.index, default=ACTION_NONE)


def short_status(codes: Iterable[int]) -> str:
    """The GPU row's cell: "X79 reboot", "X13,31 app"."""
    seen = [decode(code) for code in codes]
    listed = ",".join(str(item.code) for item in seen[:3]) + ("+" if len(seen) > 3 else "")
    return "X%s %s" % (listed, ACTION_SHORT[worst_action(seen)])


@frozen
class XidOffer:
    """The action key the console offers for a GPU's Xids, and why."""

    action_id: str  # "gpu_reset" or "drain_node" (actions.registry ids)
    key_hint: str
    reason: str


def offer_for(codes: Iterable[int], gpu_processes: int, texts: Iterable[str] = ()) -> Optional[XidOffer]:
    """gpu_reset where the catalog says reset and the GPU runs no process; drain_node where it says reboot or service.

    `texts` are the Xids' kernel lines when known (Xid 154 names its action there).
    """
    codes = list(codes)
    texts = list(texts)
    seen = [decode(code, texts[i] if i < len(texts) else "") for i, code in enumerate(codes)]
    action = worst_action(seen)
    culprits = ",".join(str(item.code) for item in seen if item.action == action)
    if action in (ACTION_REBOOT_NODE, ACTION_DRAIN):
        return XidOffer("drain_node", "D: drain the node", "Xid %s calls to %s" % (culprits, ACTION_TEXT[action]))
    if action == ACTION_RESET_GPU:
        if gpu_processes:
            return None  # a reset would kill them: stop the job first; the key is offered once the GPU is idle
        return XidOffer(
            "gpu_reset", "R: reset the GPU", "Xid %s calls for a GPU reset and the GPU runs no process" % culprits
        )
    return None


def describe_codes(codes: Iterable[int]) -> Tuple[str, ...]:
    """One line per Xid: its meaning and its action."""
    return tuple(decode(code).describe() for code in codes)


def offers_in(states: Iterable[object]) -> Tuple[Tuple[str, int, XidOffer], ...]:
    """(node, GPU index, offer) for every GPU whose Xids in its node's latest frame call for an action key."""
    found = []
    for state in states:
        frame = getattr(state, "frame", None)
        if frame is None:
            continue
        for gpu in frame.gpus:
            if not gpu.xid_events:
                continue
            busy = sum(1 for proc in frame.processes if proc.gpu_index == gpu.index)
            offer = offer_for(gpu.xid_events, busy)
            if offer is not None:
                found.append((getattr(state, "name", frame.node), gpu.index, offer))
    return tuple(found)
