"""nvidia-smi CSV parsers against real H200 captures, with and without header and units."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from opsconsole.model import GpuSample
from opsconsole.probe.nvml_decode import decode_clock_event_reasons
from opsconsole.probe.smi import (
    BASIC_GPU_FIELD_LIST,
    QUERY_APPS_FIELDS,
    QUERY_GPU_FIELD_LIST,
    QUERY_GPU_FIELDS,
    parse_query_apps_csv,
    parse_query_gpu_csv_with_driver,
    query_apps_argv,
    query_gpu_argv,
)

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200"
PROBE = FIXTURES / "h200_probe"
MIB = 1024 * 1024

# The lead's headerless captures (tests/fixtures/h200/*nvidia-smi-query.csv) carry no field
# list; these are the 18 fields their values line up with, checked against nvidia-smi -q of
# the same capture (ECC, persistence and MIG states; fan [N/A]).
LEAD_CAPTURE_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.used",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "pstate",
    "ecc.errors.uncorrected.volatile.total",
    "fan.speed",
    "ecc.mode.current",
    "mig.mode.current",
)


def cells(path: Path):
    return [c.strip() for c in path.read_text().strip().splitlines()[0].split(",")]


def xml_value(path: Path, tag: str) -> str:
    match = re.search(r"<%s>([^<]*)</%s>" % (tag, tag), path.read_text())
    assert match, tag
    return match.group(1).strip()


def test_argv_asks_csv_without_header_or_units():
    assert query_gpu_argv() == ["nvidia-smi", "--query-gpu=" + QUERY_GPU_FIELDS, "--format=csv,noheader,nounits"]
    assert query_apps_argv() == [
        "nvidia-smi",
        "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid",
        "--format=csv,noheader,nounits",
    ]
    assert QUERY_APPS_FIELDS == "pid,process_name,used_gpu_memory,gpu_uuid"


def test_every_field_we_ask_is_known_to_the_h200_nvidia_smi():
    help_text = (PROBE / "nvidia-smi-help-query-gpu.txt").read_text()
    known = set(re.findall(r'"([a-z0-9_.]+)"', help_text))
    assert [f for f in QUERY_GPU_FIELD_LIST + BASIC_GPU_FIELD_LIST if f not in known] == []


def test_our_own_query_on_the_h200_parses_every_field():
    text = (PROBE / "smi-query-load.csv").read_text()
    values = dict(zip(QUERY_GPU_FIELD_LIST, cells(PROBE / "smi-query-load.csv")))
    gpus, driver = parse_query_gpu_csv_with_driver(text)
    (gpu,) = gpus
    assert driver == values["driver_version"]
    assert gpu.errors == () and not gpu.lost
    assert gpu.uuid == values["uuid"] and gpu.pci_bus_id == values["pci.bus_id"] and gpu.name == values["name"]
    assert gpu.memory_total == int(values["memory.total"]) * MIB
    assert gpu.memory_reserved == int(values["memory.reserved"]) * MIB
    assert gpu.power_draw_w == float(values["power.draw"])
    assert gpu.power_limit_w == float(values["enforced.power.limit"])
    assert gpu.clock_event_reasons == decode_clock_event_reasons(int(values["clocks_event_reasons.active"], 16))
    assert gpu.clock_event_reasons == ("SwPowerCap",)  # captured under a torch matmul load
    assert gpu.pstate == int(values["pstate"][1:])
    assert gpu.fan_percent is None and gpu.retired_pages_pending is None  # [N/A] on the H200
    assert gpu.remapped_rows_pending is False and gpu.remapped_rows_failure is False
    assert gpu.ecc_enabled is True and gpu.persistence_mode is True and gpu.mig_mode is False
    assert gpu.compute_mode == values["compute_mode"]
    assert (gpu.pcie_gen, gpu.pcie_gen_max, gpu.pcie_width, gpu.pcie_width_max) == tuple(
        int(values[f])
        for f in ("pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
    )


def test_our_query_agrees_with_nvml_on_the_same_gpu():
    # Both taken seconds apart on the same H200, in the same device run.
    (smi,) = parse_query_gpu_csv_with_driver((PROBE / "smi-query-load.csv").read_text())[0]
    nvml = GpuSample(
        **{
            k: v
            for k, v in json.loads((PROBE / "h200_nvml_frame_with_smi.json").read_text())["gpus"][0].items()
            if k not in ("clock_event_reasons", "xid_events", "errors")
        }
    )
    for field in (
        "uuid",
        "pci_bus_id",
        "name",
        "ecc_enabled",
        "persistence_mode",
        "compute_mode",
        "mig_mode",
        "pcie_gen",
        "pcie_width",
        "clock_sm_max_mhz",
        "clock_mem_max_mhz",
        "power_limit_w",
    ):
        assert getattr(smi, field) == getattr(nvml, field), field
    assert abs(smi.memory_total - nvml.memory_total) < MIB  # nvidia-smi rounds to MiB


@pytest.mark.parametrize("capture", ["nvidia-smi-query.csv", "under-load/nvidia-smi-query.csv"])
def test_lead_captures_without_header_parse_with_their_field_list(capture):
    path = H200 / capture
    values = dict(zip(LEAD_CAPTURE_FIELDS, cells(path)))
    (gpu,) = parse_query_gpu_csv_with_driver(path.read_text(), LEAD_CAPTURE_FIELDS)[0]
    assert gpu.index == int(values["index"]) and gpu.uuid == values["uuid"]
    assert gpu.utilization_gpu == float(values["utilization.gpu"])
    assert gpu.memory_total == int(values["memory.total"]) * MIB
    assert gpu.memory_used == int(values["memory.used"]) * MIB
    assert gpu.power_draw_w == float(values["power.draw"]) and gpu.power_limit_w == float(values["power.limit"])
    assert gpu.pstate == 0 and gpu.fan_percent is None and gpu.errors == ()
    assert gpu.ecc_enabled is True and gpu.mig_mode is False
    xml = path.parent / "nvidia-smi-q.xml"
    assert gpu.uuid == xml_value(xml, "uuid")
    assert gpu.pci_bus_id == xml_value(xml, "pci_bus_id")


def test_header_with_units_is_read_from_the_header():
    path = H200 / "under-load" / "load-query.csv"
    header, row = path.read_text().strip().splitlines()
    values = [c.strip() for c in row.split(",")]
    (gpu,) = parse_query_gpu_csv_with_driver(path.read_text())[0]
    assert "[MiB]" in header and "MiB" in values[2]  # the capture really has units
    assert gpu.index == int(values[0])
    assert gpu.utilization_gpu == float(values[1].split()[0])
    assert gpu.memory_used == int(values[2].split()[0]) * MIB
    assert gpu.temperature == float(values[3])
    assert gpu.power_draw_w == float(values[4].split()[0])
    assert gpu.clock_sm_mhz == int(values[5].split()[0])  # header says clocks.current.sm
    assert gpu.clock_event_reasons == ("SwPowerCap",)


def test_apps_with_header_and_units_map_to_the_gpu_by_uuid():
    (gpu,) = parse_query_gpu_csv_with_driver(
        (H200 / "under-load" / "nvidia-smi-query.csv").read_text(), LEAD_CAPTURE_FIELDS
    )[0]
    path = H200 / "under-load" / "load-apps.csv"
    pid, name, used, uuid = [c.strip() for c in path.read_text().strip().splitlines()[1].split(",")]
    (proc,) = parse_query_apps_csv(path.read_text(), (gpu,))
    assert proc.pid == int(pid) and proc.name == name
    assert proc.gpu_memory_bytes == int(used.split()[0]) * MIB
    assert proc.gpu_uuid == uuid == gpu.uuid and proc.gpu_index == gpu.index


def test_apps_without_header_from_our_own_query():
    (gpu,) = parse_query_gpu_csv_with_driver((PROBE / "smi-query-load.csv").read_text())[0]
    pid, name, used, uuid = cells(PROBE / "smi-apps-load.csv")
    (proc,) = parse_query_apps_csv((PROBE / "smi-apps-load.csv").read_text(), (gpu,))
    assert (proc.pid, proc.name, proc.gpu_memory_bytes, proc.gpu_index) == (int(pid), name, int(used) * MIB, 0)


def test_apps_header_only_or_no_processes_is_empty():
    (gpu,) = parse_query_gpu_csv_with_driver((H200 / "nvidia-smi-query.csv").read_text(), LEAD_CAPTURE_FIELDS)[0]
    header_only = (H200 / "nvidia-smi-apps.csv").read_text().split("--stderr--")[0]
    assert parse_query_apps_csv(header_only, (gpu,)) == ()
    assert parse_query_apps_csv("", (gpu,)) == ()
    assert parse_query_apps_csv("No running processes found\n", (gpu,)) == ()


def test_an_unknown_uuid_keeps_the_process_without_an_index():
    (gpu,) = parse_query_gpu_csv_with_driver((PROBE / "smi-query-load.csv").read_text())[0]
    pid, name, used, uuid = cells(PROBE / "smi-apps-load.csv")
    (proc,) = parse_query_apps_csv("%s, /usr/bin/%s, [N/A], GPU-other\n" % (pid, name), (gpu,))
    assert proc.gpu_index is None and proc.gpu_memory_bytes is None
    assert proc.name == name and proc.command == "/usr/bin/" + name


def _row_with(field: str, cell: str) -> str:
    values = cells(PROBE / "smi-query-load.csv")
    values[QUERY_GPU_FIELD_LIST.index(field)] = cell
    return ", ".join(values) + "\n"


@pytest.mark.parametrize("cell", ["[N/A]", "[Not Supported]", "N/A"])
def test_absent_cells_are_none_without_errors(cell):
    (gpu,) = parse_query_gpu_csv_with_driver(_row_with("temperature.gpu", cell))[0]
    assert gpu.temperature is None and gpu.errors == ()


def test_error_cells_are_none_with_an_error_and_lost_marks_the_gpu():
    (gpu,) = parse_query_gpu_csv_with_driver(_row_with("utilization.gpu", "[Unknown Error]"))[0]
    assert gpu.utilization_gpu is None and gpu.errors == ("utilization.gpu: Unknown Error",) and not gpu.lost
    (gpu,) = parse_query_gpu_csv_with_driver(_row_with("power.draw", "[GPU is lost]"))[0]
    assert gpu.lost and gpu.power_draw_w is None


def test_several_gpus_and_stray_lines():
    row = (PROBE / "smi-query-load.csv").read_text().strip()
    second = row.replace("0, GPU-", "1, GPU-", 1)
    gpus = parse_query_gpu_csv_with_driver(row + "\n" + second + "\n\nNo devices were found\n")[0]
    assert [g.index for g in gpus] == [0, 1]
