"""Xid decoded: NVIDIA's catalog meaning and action for real kernel lines and NVML events, where the console shows them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opsconsole.config import HealthConfig
from opsconsole.health import rules, xid
from opsconsole.model import STATE_UP, NodeFrame, NodeState, ProcessSample, from_wire

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# Real kernel lines, as published: ml-engineering's debug guide (63), Modal's GPU health guide (79),
# a Plexus Xid guide (94), an HF dataset of journalctl excerpts (41, not in the catalog here).
REAL_LINES = [
    (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
        63,
        xid.ACTION_RESET_GPU,
        "0000:10:1c",
    ),
    (
        "[gpu-health] [CRITICAL] GPU-1234: XID: NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.",
        79,
        xid.ACTION_REBOOT_NODE,
        "0000:c6:00",
    ),
    ("NVRM: Xid (PCI:0000:65:00): 94, pid=12345, Contained: ECC error", 94, xid.ACTION_RESTART_APP, "0000:65:00"),
    (
        "Oct 01 13:00:00 hostname kernel: NVRM: Xid (PCI:0000:06:00): 41, ROBUST_CHANNEL_CE2_ERROR: Copy Engine Exception",
        41,
        xid.ACTION_NONE,
        "0000:06:00",
    ),
]


@pytest.mark.parametrize("line, code, action, pci", REAL_LINES)
def test_real_kernel_lines_decode(line, code, action, pci):
    seen = xid.decode_line(line)
    assert (seen.code, seen.action, seen.pci) == (code, action, pci)
    assert seen.describe().startswith("Xid %d (" % code)
    assert seen.known == (code in xid.CATALOG)


def test_xid_154_takes_its_action_from_its_line():
    # The driver's wording (open-gpu-kernel-modules#1045 quotes its start): the action it names decides.
    reset = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (Reset Required)"
    reboot = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Reboot Required)"
    drain = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
    assert [xid.decode_line(line).action for line in (reset, reboot, drain)] == [
        xid.ACTION_RESET_GPU,
        xid.ACTION_REBOOT_NODE,
        xid.ACTION_DRAIN,
    ]


def test_every_catalog_row_names_an_action_the_console_knows():
    expected = {13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121, 140, 143, 154}
    expected |= set(range(144, 151))
    assert expected <= set(xid.CATALOG)
    assert all(entry.action in xid.ACTION_ORDER and entry.meaning for entry in xid.CATALOG.values())


@pytest.mark.parametrize(
    "codes, processes, offered",
    [
        ((95,), 0, "gpu_reset"),
        ((95,), 2, None),  # a reset would take the job's GPU away: offered once it is idle
        ((79,), 3, "drain_node"),
        ((64,), 0, "drain_node"),
        ((13, 31), 0, None),  # the application's: restart it
        ((45,), 0, None),
        ((94, 48), 0, "gpu_reset"),  # the most disruptive action of several decides
    ],
)
def test_what_the_console_offers(codes, processes, offered):
    offer = xid.offer_for(codes, processes)
    assert (offer.action_id if offer else None) == offered


def captured_frame(name: str = "h200_frame.json") -> NodeFrame:
    path = FIXTURES / name if (FIXTURES / name).exists() else FIXTURES / "h200_probe" / name
    return from_wire(NodeFrame, json.loads(path.read_text()))


def test_health_rule_and_gpu_row_say_meaning_and_action():
    from opsconsole.tui.gpus import gpu_status, gpus_hint

    frame = captured_frame("h200_frame_idle.json")  # the real H200 frame, idle, no GPU process
    gpu = replace(frame.gpus[0], xid_events=(95,))
    frame = replace(frame, gpus=(gpu,), processes=())
    result = next(r for r in rules.evaluate_frame(frame, HealthConfig(), now=1.0) if r.check == "gpu_xid")
    assert (
        result.message
        == "GPU 0: Xid 95 (uncontained ECC error: every process on the GPU is affected): reset the GPU once no process uses it (nvidia-smi -r)"
    )
    assert result.remedy.startswith("Reset the GPU once no process uses it") and "offers R" in result.remedy
    state = NodeState("gpu-a01", STATE_UP, frame=frame, received_at=frame.time)
    assert gpu_status(gpu, state, frame.time) == ("X95 reset", "crit")
    assert "gpu-a01/0: Xid 95 calls for a GPU reset and the GPU runs no process: R: reset the GPU" in gpus_hint(
        {"gpu-a01": state}, None, ""
    )
    busy = replace(frame, processes=(ProcessSample(pid=4242, name="python", gpu_index=0),))
    assert "R: reset" not in gpus_hint({"gpu-a01": replace(state, frame=busy)}, None, "")
    fallen = replace(frame, gpus=(replace(gpu, xid_events=(79,)),))
    assert "Xid 79 calls to reboot the node: D: drain the node" in gpus_hint(
        {"gpu-a01": replace(state, frame=fallen)}, None, ""
    )


def test_diagnose_names_meaning_and_action_of_a_kernel_xid(tmp_path):
    log = tmp_path / "dmesg.log"
    log.write_text("[Wed Dec  3 10:00:00 2026] " + REAL_LINES[1][0].split("XID: ", 1)[1] + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    finding = json.loads(done.stdout)["findings"][0]
    assert finding["category"] == "gpu_hardware"
    assert finding["cause"].startswith(
        "Xid 79 (GPU has fallen off the bus: the host no longer reaches it): reboot the node."
    )
    assert finding["remedy"].startswith("Reboot the node")


async def test_the_gpus_pane_shows_the_action_and_offers_the_key():
    from h200_fleet import idle_gpu, loaded_gpu
    from textual.app import App, ComposeResult
    from textual.widgets import DataTable, Static
    from tui_fakes import FROZEN_NOW, up_state

    from opsconsole.tui.gpus import GpusPane

    class OnePane(App):
        def __init__(self, pane) -> None:
            super().__init__()
            self.pane = pane

        def compose(self) -> ComposeResult:
            yield self.pane

    # gpu07's idle H200 saw Xid 95 (reset class): R is offered; gpu08's busy one saw 48: no reset while it runs.
    states = {
        "gpu07": up_state("gpu07", [replace(idle_gpu(0), xid_events=(95,))]),
        "gpu08": up_state("gpu08", [replace(loaded_gpu(0), xid_events=(48,))]),
    }
    pane = GpusPane()
    async with OnePane(pane).run_test(size=(200, 30)) as pilot:
        pane.show(states, None, FROZEN_NOW)
        await pilot.pause()
        table = pane.query_one(DataTable)
        assert str(table.get_cell("gpu07/0", "status")) == "X95 reset"
        assert str(table.get_cell("gpu08/0", "status")) == "X48 reset"
        hint = str(pane.query_one("#gpus-hint", Static).render())
        assert "gpu07/0: Xid 95 calls for a GPU reset and the GPU runs no process: R: reset the GPU" in hint
        assert "gpu08/0" not in hint
