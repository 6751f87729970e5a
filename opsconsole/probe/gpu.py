"""The GPU half of the probe: NVML in-process with tiered polling, nvidia-smi as the fallback.

NVML is initialised once and device handles are kept. Fields are read in three tiers:
static ones (name, UUID, PCI id, max clocks, temperature thresholds) once (a failed one again on slow
ticks, its error shown meanwhile), slow ones (PCIe, ECC,
remapped rows, modes, power limit; the energy counter on every sixth) every `slow_every` ticks, fast ones
(utilisation, memory, temperature, power, clocks, clock event reasons, P-state,
processes, XID events) every tick, the processes' SM % every second tick and when they change. Costs measured on an H200 (driver 580):
energy 4.1 ms a call and PCIe throughput 21 ms per direction, hence their tiers below;
the rest are 2-300 us each. One field's or one GPU's failure never breaks the listing: a
NotSupported field is None (and is not asked again), another NVML error becomes
"field: message" in that GPU's errors, and a lost GPU is reported with lost=True.

pynvml is imported lazily, inside the reader, so this module loads on any python3.
"""

import shutil
import subprocess
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from opsconsole.model import GpuSample, MigDevice, ProcessSample, frozen
from opsconsole.probe import nvidia_driver
from opsconsole.probe import nvml_decode as nv
from opsconsole.probe.smi import (
    BASIC_GPU_FIELD_LIST,
    QUERY_GPU_FIELD_LIST,
    is_invalid_field_error,
    parse_query_apps_csv,
    parse_query_gpu_csv_with_driver,
    query_apps_argv,
    query_gpu_argv,
)

SMI_TIMEOUT_S = 10.0
PROCESS_SM_EVERY = 2  # ticks between reads of the per-process SM % (see _read_processes)
ENERGY_EVERY_SLOW = 6  # the energy counter: every 6th slow tick (30 s at 1 s ticks, slow_every 5)
MAX_XID_DRAIN = 64  # events taken per GPU per tick; the rest wait for the next tick


@frozen
class GpuReading:
    """What one read of all GPUs of this node saw."""

    gpus: Tuple[GpuSample, ...]
    processes: Tuple[ProcessSample, ...]  # GPU compute processes; host fields joined by procs.py
    source: str  # "nvml", "nvidia-smi" or "none"
    note: Optional[str]  # why there are no GPUs (or why NVML was not used)
    driver_version: Optional[str]
    errors: Tuple[str, ...]


class SmiError(Exception):
    """nvidia-smi ran but failed (non-zero exit); the message is its own output."""


class _Lost(Exception):
    """Internal: the GPU answered GpuIsLost; stop reading it this tick."""


def run_nvidia_smi(argv: List[str]) -> str:
    """Run one nvidia-smi command line and return its stdout (FileNotFoundError when absent)."""
    proc = subprocess.run(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=SMI_TIMEOUT_S,
        universal_newlines=True,
    )
    if proc.returncode != 0:
        message = proc.stderr.strip() or proc.stdout.strip() or "exit status %d" % proc.returncode
        raise SmiError(message.splitlines()[0] if message else "failed")
    return proc.stdout


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\0")
    return str(value)


class _Device(object):
    """One GPU's handle and what we keep between ticks."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.handle_error: Optional[str] = None
        self.lost = False
        self.static: Dict[str, Any] = {}
        self.static_done = False
        self.static_errors: Tuple[str, ...] = ()  # the last static read's failures, shown until a retry
        self.slow: Dict[str, Any] = {}
        self.slow_errors: Tuple[str, ...] = ()
        self.slow_reads = 0  # slow-tier reads so far (the energy counter is read on some of them)
        self.unsupported: Set[str] = set()  # fields answered NotSupported: never asked again
        self.event_set: Any = None
        self.proc_util_ts = 0  # last per-process utilisation sample seen (microseconds)
        self.proc_sm: Dict[int, float] = {}  # SM % per pid from the last read of it
        self.proc_sm_pids: FrozenSet[int] = frozenset()  # the GPU's processes at that read
        self.proc_sm_age = 0  # ticks since that read
        self.pcie_counters: Optional[Tuple[float, int, int]] = None  # (time, tx bytes, rx bytes)
        self.pcie_rates_asked = False  # whether a reading has asked for the PCIe rates yet
        self.pcie_rates_due = False  # the first reading left them to the next read
        self.mem_v2 = True
        # In MIG mode: (handle, GPU instance id, compute instance id, UUID, profile) per MIG device,
        # found again on every slow tick (instances change only when an admin reconfigures).
        self.mig_handles: Optional[List[Tuple[Any, int, Optional[int], Optional[str], Optional[str]]]] = None


class GpuReader(object):
    """Reads every GPU of this node; `read()` never raises.

    nvml: a module with pynvml's API (default: `import pynvml`, lazily, and not at all where
    nothing_for_nvml() finds no driver). smi_run: runs an nvidia-smi argv and returns its stdout
    (default: a subprocess; FileNotFoundError when nvidia-smi is absent). Nothing is loaded until
    the first read().
    """

    def __init__(
        self,
        slow_every: int = 5,
        nvml: Any = None,
        smi_run: Optional[Callable[[List[str]], str]] = None,
        without_pynvml: Callable[[str], str] = nvidia_driver.without_pynvml,
        nothing_for_nvml: Callable[[], bool] = nvidia_driver.nothing_for_nvml,
    ) -> None:
        self.slow_every = max(1, int(slow_every))
        self._nvml = nvml
        self._smi_run = smi_run
        self._without_pynvml = without_pynvml
        self._nothing_for_nvml = nothing_for_nvml
        self._started = False
        self._closed = False
        self.source = "none"
        self._note: Optional[str] = None
        self._reason = "NVML unavailable"  # why NVML is not used, when it is not
        self._driver: Optional[str] = None
        self._devices: List[_Device] = []
        self._tick = 0
        self._pending_errors: List[str] = []  # reported once, with the next reading
        self._count_error: Optional[str] = None
        self._procs_fn: Any = None
        self._smi_fields: Sequence[str] = QUERY_GPU_FIELD_LIST
        self.clock = time.monotonic  # for PCIe byte-counter rates; tests replace it

    # -- start -----------------------------------------------------------------------

    def _start(self) -> None:
        self._started = True
        nvml = self._nvml
        reason: Optional[str] = None
        if nvml is None and self._nothing_for_nvml():
            reason = nvidia_driver.NO_DRIVER_DETAIL  # pynvml is not even imported: its init could only fail
        elif nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]
            except Exception as exc:  # ImportError, or a broken install
                # No pynvml says nothing of the GPUs: tell a node without a driver from one without the binding.
                reason = self._without_pynvml(_describe(exc))
                nvml = None
        if nvml is not None:
            try:
                nvml.nvmlInit()
            except Exception as exc:
                code = nv.error_code(exc)
                if code in nv.NO_DRIVER_CODES or isinstance(exc, OSError):
                    reason = "no NVIDIA driver: %s" % _describe(exc)
                else:
                    reason = "NVML init failed: %s" % _describe(exc)
                nvml = None
        if nvml is None:
            self._reason = reason or self._reason
            self._start_smi()
            return
        self._nvml = nvml
        self.source = "nvml"
        try:
            self._driver = _as_text(nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            self._pending_errors.append("driver_version: %s" % _describe(exc))
        self._open_devices()

    def _open_devices(self) -> None:
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self._count_error = "device count: %s" % _describe(exc)
            return
        self._count_error = None
        xid_unsupported = []
        for index in range(count):
            dev = _Device(index)
            self._devices.append(dev)
            self._open_handle(dev)
            if dev.handle is not None and not self._register_xid(dev):
                xid_unsupported.append(str(index))
        if xid_unsupported:
            self._pending_errors.append("xid events: not supported on GPU %s" % ", ".join(xid_unsupported))
        if not self._devices:
            self._note = "NVML found no GPUs"

    def _open_handle(self, dev: _Device) -> None:
        try:
            dev.handle = self._nvml.nvmlDeviceGetHandleByIndex(dev.index)
            dev.handle_error = None
            dev.lost = False
        except Exception as exc:
            dev.handle = None
            dev.handle_error = "handle: %s" % _describe(exc)
            dev.lost = nv.error_code(exc) in nv.LOST_CODES

    def _register_xid(self, dev: _Device) -> bool:
        """One event set per GPU, so an event names its GPU and a lost GPU's set stays apart."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception:
            return False
        try:
            nvml.nvmlDeviceRegisterEvents(dev.handle, nv.NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
        except Exception:
            try:
                nvml.nvmlEventSetFree(event_set)
            except Exception:
                pass
            return False
        dev.event_set = event_set
        return True

    def _start_smi(self) -> None:
        if self._smi_run is None:
            if shutil.which("nvidia-smi") is None:
                self._no_smi()
                return
            self._smi_run = run_nvidia_smi
        self.source = "nvidia-smi"
        self._note = "%s; read by nvidia-smi" % self._reason

    def _no_smi(self) -> None:
        self.source = "none"
        self._note = "%s; nvidia-smi not found" % self._reason

    # -- read ------------------------------------------------------------------------

    def read(self) -> GpuReading:
        """One reading of every GPU; errors are values in the reading, never exceptions."""
        if self._closed:
            return GpuReading((), (), "none", "reader closed", self._driver, ())
        if not self._started:
            try:
                self._start()
            except Exception as exc:  # a bug or a broken module: still a reading
                self.source = "none"
                self._note = "gpu reader failed to start: %s" % _describe(exc)
        self._tick += 1
        errors = self._pending_errors
        self._pending_errors = []
        if self.source == "nvml":
            gpus, procs, more = self._read_nvml()
        elif self.source == "nvidia-smi":
            gpus, procs, more = self._read_smi()
        else:
            gpus, procs, more = [], [], []
        errors.extend(more)
        note = self._note
        if self.source == "nvml" and gpus:
            note = None
        return GpuReading(tuple(gpus), tuple(procs), self.source, note, self._driver, tuple(errors))

    def _is_slow_tick(self) -> bool:
        return (self._tick - 1) % self.slow_every == 0

    def _read_nvml(self) -> Tuple[List[GpuSample], List[ProcessSample], List[str]]:
        errors: List[str] = []
        slow = self._is_slow_tick()
        if self._count_error is not None:
            if slow:
                self._open_devices()  # the driver may have come back
            if self._count_error is not None:
                return [], [], [self._count_error]
        gpus = []
        procs: List[ProcessSample] = []
        for dev in self._devices:
            try:
                sample, dev_procs = self._read_device(dev, slow)
            except Exception as exc:  # a bug in one GPU's path must not hide the others
                sample, dev_procs = GpuSample(index=dev.index, errors=("read: %s" % _describe(exc),)), []
            gpus.append(sample)
            procs.extend(dev_procs)
        return gpus, procs, errors

    # -- one NVML field ---------------------------------------------------------------

    def _call(self, dev: _Device, field: str, errors: List[str], fn_name: str, *args: Any) -> Any:
        """Call nvml.<fn_name>(handle, *args): None when unsupported or failed (failure recorded)."""
        if field in dev.unsupported:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:  # an older pynvml without this function
            dev.unsupported.add(field)
            return None
        try:
            return fn(dev.handle, *args)
        except Exception as exc:
            code = nv.error_code(exc)
            if code in nv.UNSUPPORTED_CODES:
                dev.unsupported.add(field)
                return None
            errors.append("%s: %s" % (field, _describe(exc)))
            if code in nv.LOST_CODES:
                dev.lost = True
                raise _Lost()
            return None

    # -- one GPU ----------------------------------------------------------------------

    def _read_device(self, dev: _Device, slow: bool) -> Tuple[GpuSample, List[ProcessSample]]:
        if dev.handle is None and slow:
            self._open_handle(dev)
            if dev.handle is not None and dev.event_set is None:
                self._register_xid(dev)
        if dev.handle is None:
            return (
                GpuSample(index=dev.index, lost=dev.lost, errors=(dev.handle_error or "handle: unavailable",)),
                [],
            )
        errors: List[str] = []
        values: Dict[str, Any] = {}
        procs: List[ProcessSample] = []
        xids: Tuple[int, ...] = ()
        dev.lost = False
        try:
            # A static field that failed (not NotSupported) is asked again on slow ticks only: a field
            # that keeps failing would otherwise cost every tick the whole static tier's calls.
            if not dev.static_done and (slow or not dev.static):
                dev.static_errors = ()
                self._read_static(dev, errors)  # `errors` is empty until here: what it adds is the tier's
                dev.static_errors = tuple(errors)
            else:
                errors.extend(dev.static_errors)
            values.update(dev.static)
            if slow:
                slow_errors: List[str] = []
                try:
                    dev.slow = self._read_slow(dev, slow_errors)
                finally:
                    dev.slow_errors = tuple(slow_errors)
            elif dev.pcie_rates_due:
                # The first reading's PCIe rates, one read later (the slow tier's other values kept;
                # a failure here is this reading's).
                rates = self._read_pcie_rates(dev, errors)
                dev.slow = dict(dev.slow, pcie_tx_kbs=rates[0], pcie_rx_kbs=rates[1])
            values.update(dev.slow)
            errors.extend(dev.slow_errors)
            values.update(self._read_fast(dev, errors))
            if values.get("mig_mode"):
                if slow:
                    dev.mig_handles = None
                values["mig_devices"] = self._read_mig_devices(dev, errors)
            procs = self._read_processes(dev, errors)
            xids = self._drain_xids(dev, errors)
        except _Lost:
            values = dict(dev.static)  # keep who it was; its readings are gone
            procs = []
        values["index"] = dev.index
        return (
            GpuSample(lost=dev.lost, errors=tuple(errors), xid_events=xids, **values),
            procs,
        )

    def _read_static(self, dev: _Device, errors: List[str]) -> None:
        first_errors = len(errors)
        static: Dict[str, Any] = {}
        name = self._call(dev, "name", errors, "nvmlDeviceGetName")
        static["name"] = _as_text(name) if name is not None else None
        uuid = self._call(dev, "uuid", errors, "nvmlDeviceGetUUID")
        static["uuid"] = _as_text(uuid) if uuid is not None else None
        pci = self._call(dev, "pci_bus_id", errors, "nvmlDeviceGetPciInfo")
        bus_id = None
        if pci is not None:
            bus_id = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
        static["pci_bus_id"] = _as_text(bus_id) if bus_id else None
        static["clock_sm_max_mhz"] = self._call(
            dev, "clock_sm_max", errors, "nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_SM
        )
        static["clock_mem_max_mhz"] = self._call(
            dev, "clock_mem_max", errors, "nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_MEM
        )
        static["temperature_slowdown"] = _float(
            self._call(
                dev,
                "temperature_slowdown",
                errors,
                "nvmlDeviceGetTemperatureThreshold",
                nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            )
        )
        static["temperature_shutdown"] = _float(
            self._call(
                dev,
                "temperature_shutdown",
                errors,
                "nvmlDeviceGetTemperatureThreshold",
                nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
            )
        )
        # A value read before stays when its retry fails (static: it cannot have changed).
        dev.static = {key: value if value is not None else dev.static.get(key) for key, value in static.items()}
        # Retried later only if something failed for a reason other than NotSupported.
        dev.static_done = len(errors) == first_errors

    def _read_slow(self, dev: _Device, errors: List[str]) -> Dict[str, Any]:
        call = self._call
        out: Dict[str, Any] = {}
        limit = call(dev, "power_limit", errors, "nvmlDeviceGetEnforcedPowerLimit")
        out["power_limit_w"] = limit / 1000.0 if limit is not None else None
        out["fan_percent"] = _float(call(dev, "fan", errors, "nvmlDeviceGetFanSpeed"))
        # A cumulative counter, yet 4.1 ms a call on an H200 (idle; 4.9 ms under load), and no pane
        # shows it (the exporter publishes it as a counter): read on every ENERGY_EVERY_SLOW-th slow
        # tick, the last value kept between (a counter's rate over a longer span loses nothing).
        if dev.slow_reads % ENERGY_EVERY_SLOW == 0 or "energy_j" not in dev.slow:
            energy = call(dev, "energy", errors, "nvmlDeviceGetTotalEnergyConsumption")
            out["energy_j"] = energy / 1000.0 if energy is not None else None
        else:
            out["energy_j"] = dev.slow["energy_j"]
        dev.slow_reads += 1

        ecc = call(dev, "ecc_mode", errors, "nvmlDeviceGetEccMode")
        out["ecc_enabled"] = bool(ecc[0]) if ecc is not None else None
        if out["ecc_enabled"] is not False:
            for attr, kind, counter in (
                ("ecc_volatile_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
                ("ecc_volatile_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
                ("ecc_aggregate_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
                ("ecc_aggregate_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
            ):
                out[attr] = _int(call(dev, attr, errors, "nvmlDeviceGetTotalEccErrors", kind, counter))

        rows = call(dev, "remapped_rows", errors, "nvmlDeviceGetRemappedRows")
        if rows is not None:
            out["remapped_rows_corrected"] = int(rows[0])
            out["remapped_rows_uncorrected"] = int(rows[1])
            out["remapped_rows_pending"] = bool(rows[2])
            out["remapped_rows_failure"] = bool(rows[3])
        pending = call(dev, "retired_pages_pending", errors, "nvmlDeviceGetRetiredPagesPendingStatus")
        out["retired_pages_pending"] = bool(pending) if pending is not None else None

        out["pcie_gen"] = _int(call(dev, "pcie_gen", errors, "nvmlDeviceGetCurrPcieLinkGeneration"))
        out["pcie_gen_max"] = _int(call(dev, "pcie_gen_max", errors, "nvmlDeviceGetMaxPcieLinkGeneration"))
        out["pcie_width"] = _int(call(dev, "pcie_width", errors, "nvmlDeviceGetCurrPcieLinkWidth"))
        out["pcie_width_max"] = _int(call(dev, "pcie_width_max", errors, "nvmlDeviceGetMaxPcieLinkWidth"))
        out["pcie_tx_kbs"], out["pcie_rx_kbs"] = self._read_pcie_rates(dev, errors)

        persistence = call(dev, "persistence_mode", errors, "nvmlDeviceGetPersistenceMode")
        out["persistence_mode"] = bool(persistence) if persistence is not None else None
        mode = call(dev, "compute_mode", errors, "nvmlDeviceGetComputeMode")
        out["compute_mode"] = nv.compute_mode_name(mode) if mode is not None else None
        mig = call(dev, "mig_mode", errors, "nvmlDeviceGetMigMode")
        out["mig_mode"] = bool(mig[0]) if mig is not None else None
        return out

    def _read_pcie_rates(self, dev: _Device, errors: List[str]) -> Tuple[Optional[int], Optional[int]]:
        """PCIe TX/RX KB/s: from the cumulative byte counters when the GPU has them.

        nvmlDeviceGetPcieThroughput samples a 20 ms window per direction (21 ms measured on
        an H200), so where the counters exist we average over the slow interval instead. The
        very first reading waits for neither: its rates are unknown (None), and the next read,
        slow tick or not, gives them (from the counters since the first, or by the sampling call
        on a GPU without counters). That wait was 42 ms of every GPU's first reading, on the
        console's first frame's path (no pane shows these rates; the exporter publishes them).
        """
        counters = self._read_pcie_counters(dev)
        now = self.clock()
        if counters is not None:
            previous, dev.pcie_counters = dev.pcie_counters, (now, counters[0], counters[1])
            if previous is not None and now > previous[0]:
                dev.pcie_rates_due = False
                elapsed = now - previous[0]
                tx_rate = max(0, counters[0] - previous[1]) / 1024.0 / elapsed
                rx_rate = max(0, counters[1] - previous[2]) / 1024.0 / elapsed
                return int(round(tx_rate)), int(round(rx_rate))
        if not dev.pcie_rates_asked:  # the very first reading
            dev.pcie_rates_asked = dev.pcie_rates_due = True
            return None, None
        dev.pcie_rates_due = False
        tx = _int(self._call(dev, "pcie_tx", errors, "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_TX_BYTES))
        rx = _int(self._call(dev, "pcie_rx", errors, "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_RX_BYTES))
        return tx, rx

    def _read_pcie_counters(self, dev: _Device) -> Optional[Tuple[int, int]]:
        if "pcie_counters" in dev.unsupported:
            return None
        fn = getattr(self._nvml, "nvmlDeviceGetFieldValues", None)
        if fn is None:
            dev.unsupported.add("pcie_counters")
            return None
        try:
            values = fn(dev.handle, [nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])
            if any(int(v.nvmlReturn) != nv.NVML_SUCCESS for v in values):
                raise ValueError("field not supported")
            return int(values[0].value.ullVal), int(values[1].value.ullVal)
        except Exception as exc:
            if nv.error_code(exc) in nv.LOST_CODES:
                dev.lost = True
                raise _Lost()
            dev.unsupported.add("pcie_counters")  # fall back to the sampling call for good
            return None

    def _read_fast(self, dev: _Device, errors: List[str]) -> Dict[str, Any]:
        call = self._call
        out: Dict[str, Any] = {}
        util = call(dev, "utilization", errors, "nvmlDeviceGetUtilizationRates")
        if util is not None:
            out["utilization_gpu"] = float(util.gpu)
            out["utilization_memory"] = float(util.memory)
        out.update(self._read_memory(dev, errors))
        out["temperature"] = _float(
            call(dev, "temperature", errors, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
        )
        power = call(dev, "power_draw", errors, "nvmlDeviceGetPowerUsage")
        out["power_draw_w"] = power / 1000.0 if power is not None else None
        out["clock_sm_mhz"] = _int(call(dev, "clock_sm", errors, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
        out["clock_mem_mhz"] = _int(call(dev, "clock_mem", errors, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM))
        reasons = self._read_clock_event_reasons(dev, errors)
        out["clock_event_reasons"] = nv.decode_clock_event_reasons(reasons) if reasons is not None else None
        pstate = call(dev, "pstate", errors, "nvmlDeviceGetPerformanceState")
        out["pstate"] = nv.pstate_number(pstate) if pstate is not None else None
        return out

    def _read_memory(self, dev: _Device, errors: List[str]) -> Dict[str, Any]:
        mem = None
        if dev.mem_v2:
            v2_errors: List[str] = []
            try:
                mem = self._call(dev, "memory", v2_errors, "nvmlDeviceGetMemoryInfo", nv.NVML_MEMORY_INFO_V2)
            except _Lost:
                errors.extend(v2_errors)
                raise
            except TypeError:  # a pynvml whose nvmlDeviceGetMemoryInfo takes no version
                mem = None
            if mem is None:
                dev.mem_v2 = False
                dev.unsupported.discard("memory")
        if mem is None:
            mem = self._call(dev, "memory", errors, "nvmlDeviceGetMemoryInfo")
        if mem is None:
            return {}
        return {
            "memory_total": int(mem.total),
            "memory_used": int(mem.used),
            "memory_free": int(mem.free),
            "memory_reserved": _int(getattr(mem, "reserved", None)),
        }

    def _find_mig_devices(
        self, dev: _Device, errors: List[str]
    ) -> List[Tuple[Any, int, Optional[int], Optional[str], Optional[str]]]:
        """The MIG devices under a GPU in MIG mode: their handles, instance ids, UUIDs and profiles."""
        nvml = self._nvml
        count = self._call(dev, "mig_devices", errors, "nvmlDeviceGetMaxMigDeviceCount")
        found = []
        for slot in range(min(int(count or 0), 7)):  # at most 7 instances on any GPU NVIDIA makes
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, slot)
            except Exception as exc:
                if nv.error_code(exc) == nv.NVML_ERROR_NOT_FOUND:
                    continue  # an empty slot
                errors.append("mig_devices: %s" % _describe(exc))
                break
            try:
                gpu_instance = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
            except Exception as exc:
                errors.append("mig_devices: slot %d: %s" % (slot, _describe(exc)))
                continue
            compute_instance = uuid = profile = None
            try:
                compute_instance = int(nvml.nvmlDeviceGetComputeInstanceId(handle))
                uuid = _as_text(nvml.nvmlDeviceGetUUID(handle))
                name = _as_text(nvml.nvmlDeviceGetName(handle))  # "NVIDIA H200 MIG 3g.71gb"
                profile = name.rpartition("MIG ")[2] if "MIG " in name else None
            except Exception as exc:
                errors.append("mig_devices: instance %d: %s" % (gpu_instance, _describe(exc)))
            found.append((handle, gpu_instance, compute_instance, uuid, profile))
        return found

    def _read_mig_devices(self, dev: _Device, errors: List[str]) -> Tuple[MigDevice, ...]:
        """Each MIG instance of a GPU in MIG mode with its own memory (NVML keeps no utilisation per instance)."""
        if dev.mig_handles is None:
            dev.mig_handles = self._find_mig_devices(dev, errors)
        out = []
        for handle, gpu_instance, compute_instance, uuid, profile in dev.mig_handles:
            memory = None
            try:
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                errors.append("mig_devices: instance %d memory: %s" % (gpu_instance, _describe(exc)))
                dev.mig_handles = None  # find them again next tick: the instance may be gone
            out.append(
                MigDevice(
                    gpu_instance_id=gpu_instance,
                    compute_instance_id=compute_instance,
                    profile=profile,
                    uuid=uuid,
                    memory_total=_int(getattr(memory, "total", None)),
                    memory_used=_int(getattr(memory, "used", None)),
                    memory_free=_int(getattr(memory, "free", None)),
                )
            )
        return tuple(sorted(out, key=lambda m: m.gpu_instance_id))

    def _read_clock_event_reasons(self, dev: _Device, errors: List[str]) -> Optional[int]:
        if hasattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
            return self._call(dev, "clock_event_reasons", errors, "nvmlDeviceGetCurrentClocksEventReasons")
        return self._call(dev, "clock_event_reasons", errors, "nvmlDeviceGetCurrentClocksThrottleReasons")

    def _running_processes(self, dev: _Device, errors: List[str]) -> Optional[List[Any]]:
        """nvmlDeviceGetComputeRunningProcesses, newest struct version the library has (v3, v2, v1)."""
        names = (
            [self._procs_fn]
            if self._procs_fn
            else [
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses_v2",
                "nvmlDeviceGetComputeRunningProcesses",
            ]
        )
        for name in names:
            fn = getattr(self._nvml, name, None)
            if fn is None:
                continue
            try:
                result = fn(dev.handle)
            except Exception as exc:
                code = nv.error_code(exc)
                if code == nv.NVML_ERROR_FUNCTION_NOT_FOUND or type(exc).__name__ == "NVMLLibraryMismatchError":
                    continue  # the driver's library lacks this version: try the older one
                if code in nv.UNSUPPORTED_CODES:
                    return None
                errors.append("processes: %s" % _describe(exc))
                if code in nv.LOST_CODES:
                    dev.lost = True
                    raise _Lost()
                return None
            self._procs_fn = name
            return list(result)
        return None

    def _read_processes(self, dev: _Device, errors: List[str]) -> List[ProcessSample]:
        found = self._running_processes(dev, errors)
        if not found:
            return []
        memory: Dict[int, Optional[int]] = {}
        instance: Dict[int, int] = {}
        for proc in found:  # one pid may appear once per MIG instance: add them up
            pid = int(proc.pid)
            gpu_instance = getattr(proc, "gpuInstanceId", None)
            if gpu_instance is not None and 0 <= int(gpu_instance) < 0xFFFFFFFF:  # 0xFFFFFFFF: not in MIG mode
                instance.setdefault(pid, int(gpu_instance))
            used = getattr(proc, "usedGpuMemory", None)
            if used is not None:
                memory[pid] = (memory.get(pid) or 0) + int(used)
            else:
                memory.setdefault(pid, None)
        # SM % per process: 3.2 ms a call on an H200 under load, the probe's costliest call. Read
        # every PROCESS_SM_EVERY ticks, and at once when the GPU's processes change (a new one has
        # its share on the tick it appears); between reads the last shares are shown.
        pids = frozenset(memory)
        if pids != dev.proc_sm_pids or dev.proc_sm_age + 1 >= PROCESS_SM_EVERY:
            sm = self._read_process_utilization(dev, errors)
            dev.proc_sm, dev.proc_sm_pids, dev.proc_sm_age = sm, pids, 0
        else:
            sm = dev.proc_sm
            dev.proc_sm_age += 1
        uuid = dev.static.get("uuid")
        return [
            ProcessSample(
                pid=pid,
                gpu_index=dev.index,
                gpu_uuid=uuid,
                gpu_memory_bytes=used,
                gpu_sm_percent=sm.get(pid),
                mig_instance=instance.get(pid),
            )
            for pid, used in sorted(memory.items())
        ]

    def _read_process_utilization(self, dev: _Device, errors: List[str]) -> Dict[int, float]:
        """SM % per pid from samples newer than the last ones seen (the latest sample wins)."""
        if "process_utilization" in dev.unsupported:
            return {}
        fn = getattr(self._nvml, "nvmlDeviceGetProcessUtilization", None)
        if fn is None:
            dev.unsupported.add("process_utilization")
            return {}
        try:
            samples = fn(dev.handle, dev.proc_util_ts)
        except Exception as exc:
            code = nv.error_code(exc)
            if code in nv.UNSUPPORTED_CODES:
                dev.unsupported.add("process_utilization")
            elif code in nv.LOST_CODES:
                errors.append("process_utilization: %s" % _describe(exc))
                dev.lost = True
                raise _Lost()
            elif code not in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS):  # NotFound: no new samples
                errors.append("process_utilization: %s" % _describe(exc))
            return {}
        latest: Dict[int, Tuple[int, float]] = {}
        for sample in samples:
            stamp = int(sample.timeStamp)
            pid = int(sample.pid)
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, float(sample.smUtil))
            if stamp > dev.proc_util_ts:
                dev.proc_util_ts = stamp
        return {pid: value for pid, (_, value) in latest.items()}

    def _drain_xids(self, dev: _Device, errors: List[str]) -> Tuple[int, ...]:
        """Critical XIDs waiting in this GPU's event set, without blocking (timeout 0)."""
        if dev.event_set is None:
            return ()
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or getattr(nvml, "nvmlEventSetWait")
        xids: List[int] = []
        for _ in range(MAX_XID_DRAIN):
            try:
                data = wait(dev.event_set, 0)
            except Exception as exc:
                code = nv.error_code(exc)
                if code == nv.NVML_ERROR_TIMEOUT:
                    break  # drained
                errors.append("xid events: %s" % _describe(exc))
                if code in nv.LOST_CODES:
                    dev.lost = True
                    raise _Lost()
                break
            if int(data.eventType) & nv.NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                xids.append(int(data.eventData))
        return tuple(xids)

    # -- nvidia-smi ---------------------------------------------------------------------

    def _read_smi(self) -> Tuple[List[GpuSample], List[ProcessSample], List[str]]:
        assert self._smi_run is not None  # set when the source was chosen
        errors: List[str] = []
        try:
            text = self._smi_run(query_gpu_argv(",".join(self._smi_fields)))
        except FileNotFoundError:
            self._no_smi()
            return [], [], []
        except Exception as exc:
            if is_invalid_field_error(str(exc)) and self._smi_fields is not BASIC_GPU_FIELD_LIST:
                self._smi_fields = BASIC_GPU_FIELD_LIST  # an older nvidia-smi: ask what it knows
                return self._read_smi()
            return [], [], ["nvidia-smi: %s" % _describe(exc)]
        gpus, driver = parse_query_gpu_csv_with_driver(text, self._smi_fields)
        if driver:
            self._driver = driver
        procs: Tuple[ProcessSample, ...] = ()
        try:
            procs = parse_query_apps_csv(self._smi_run(query_apps_argv()), gpus)
        except Exception as exc:
            errors.append("nvidia-smi apps: %s" % _describe(exc))
        if not gpus and not errors:
            errors.append("nvidia-smi: no GPU rows")
        return list(gpus), list(procs), errors

    # -- close ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free event sets and shut NVML down; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.source != "nvml" or self._nvml is None:
            return
        for dev in self._devices:
            if dev.event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(dev.event_set)
                except Exception:
                    pass
                dev.event_set = None
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _int(value: Any) -> Optional[int]:
    return int(value) if value is not None else None


def _float(value: Any) -> Optional[float]:
    return float(value) if value is not None else None


def read_gpus_once(slow_every: int = 1) -> GpuReading:
    """Open a reader, take one reading with every tier, close it (for scripts and tests)."""
    reader = GpuReader(slow_every=slow_every)
    try:
        return reader.read()
    finally:
        reader.close()


__all__ = ["GpuReader", "GpuReading", "SmiError", "read_gpus_once", "run_nvidia_smi"]
