"""A fake pynvml that replays values recorded on a real H200 (tests/fixtures/h200/nvml.json).

It mirrors nvidia-ml-py 13.x: the same function names and argument order, an NVMLError
class whose constructor maps a code to a subclass (NVMLError_NotSupported, _GpuIsLost, ...,
made from the NVML_ERROR_* constants exactly as pynvml makes them), and results shaped like
pynvml's (objects with .gpu/.memory, .total/.reserved/.free/.used, .busId as bytes, process
objects with .pid/.usedGpuMemory, process utilisation samples with .smUtil/.timeStamp).

A recorded value is returned as recorded; a recorded error ("ERR NVMLError_NotSupported: ...")
is raised as that class. A call the capture did not record behaves as NotSupported.

Knobs for tests: `gpus` (the one recorded GPU replicated, with distinct UUIDs and bus ids),
`load=True` (overlay under-load/load-procs.json: util 100 %, throttle SwPowerCap, one process
and its SM %), `faults` ({index: {function name or "*": error class name}}), `no_handle`
({index: error class name}), `push_xid(index, code)`, `calls` (a Counter of (function, index)).
"""

from __future__ import annotations

import json
import string
import types
from collections import Counter, deque
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

FIXTURES = Path(__file__).parent / "fixtures" / "h200"

# The NVML_ERROR_* codes pynvml defines (nvml.h); class names derive from these as in pynvml.
NVML_ERRORS = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_MEMORY": 20,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25,
    "NVML_ERROR_GPU_NOT_FOUND": 28,
    "NVML_ERROR_UNKNOWN": 999,
}
# pynvml's own strings for the codes tests meet.
ERROR_STRINGS = {
    3: "Not Supported",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}

# Constants our reader may look up on the module (values as in pynvml).
CONSTANTS = {
    "NVML_SUCCESS": 0,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0,
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "nvmlMemory_v2": 0x02000028,
    "nvmlEventTypeXidCriticalError": 0x0000000000000008,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
}


def _class_name(constant: str) -> str:
    # pynvml: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost
    return "NVMLError_" + string.capwords(constant.replace("NVML_ERROR_", ""), "_").replace("_", "")


def _make_errors(module: types.ModuleType) -> None:
    class NVMLError(Exception):
        _valClassMapping = {}  # type: Dict[int, type]

        def __new__(typ, value):  # type: ignore[no-untyped-def]
            if typ is NVMLError:
                typ = NVMLError._valClassMapping.get(value, typ)
            obj = Exception.__new__(typ)
            obj.value = value
            return obj

        def __str__(self) -> str:
            return ERROR_STRINGS.get(self.value, "NVML Error with code %d" % self.value)

    NVMLError.__module__ = module.__name__
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    for constant, code in NVML_ERRORS.items():
        setattr(module, constant, code)

        def gen_new(val: int) -> Any:
            def new(typ, *args):  # type: ignore[no-untyped-def]
                return NVMLError.__new__(typ, val)

            return new

        cls = type(_class_name(constant), (NVMLError,), {"__new__": gen_new(code)})
        cls.__module__ = module.__name__
        setattr(module, cls.__name__, cls)
        NVMLError._valClassMapping[code] = cls


class _Obj(object):
    """A plain result object (pynvml returns ctypes structures with these attributes)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return "_Obj(%r)" % self.__dict__


class _Handle(object):
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return "<handle %d>" % self.index


class _MigHandle(_Handle):
    """A MIG device's handle (nvmlDeviceGetMigDeviceHandleByIndex): its parent's index and its instance."""

    def __init__(self, index: int, instance: Dict[str, Any]) -> None:
        super().__init__(index)
        self.instance = instance

    def __repr__(self) -> str:
        return "<mig handle %d/%d>" % (self.index, self.instance["gi"])


# MIG instances as NVML describes them (nvml.h: nvmlDeviceGetMigDeviceHandleByIndex,
# nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId; a MIG device's name is its
# parent's name + " MIG " + profile). The recorded H200 runs with MIG off, and these tests never
# change a GPU's mode: the instances are given here, with the H200's profile names and sizes.
H200_MIG_3G = (
    {
        "gi": 1,
        "ci": 0,
        "profile": "3g.71gb",
        "total": 71_940_702_208,
        "used": 3000 * 2**20,
        "pids": ((4101, 2900 * 2**20),),
    },
    {
        "gi": 2,
        "ci": 0,
        "profile": "3g.71gb",
        "total": 71_940_702_208,
        "used": 12000 * 2**20,
        "pids": ((4102, 11800 * 2**20),),
    },
)


def load_capture() -> Dict[str, Any]:
    """The idle capture as recorded."""
    return json.loads((FIXTURES / "nvml.json").read_text())


def load_procs_capture() -> Dict[str, Any]:
    """The under-load process capture as recorded."""
    return json.loads((FIXTURES / "under-load" / "load-procs.json").read_text())


def replicated_uuid(uuid: str, index: int) -> str:
    """GPU i>0 of a replicated capture: the recorded UUID with its last hex digits changed."""
    return uuid if index == 0 else uuid[:-4] + "%04x" % index


def replicated_bus_id(bus_id: str, index: int) -> str:
    return bus_id if index == 0 else bus_id[:-4] + "%02x.0" % (6 + index)


class ReplayNvml(object):
    """Builds the fake module; `module` is what GpuReader(nvml=...) takes."""

    def __init__(
        self,
        gpus: int = 1,
        load: bool = False,
        faults: Optional[Dict[int, Dict[str, str]]] = None,
        no_handle: Optional[Dict[int, str]] = None,
        init_error: Optional[str] = None,
        events_supported: bool = True,
        pcie_counters: Optional[Dict[int, Tuple[int, int]]] = None,
        mig: Optional[Dict[int, Sequence[Dict[str, Any]]]] = None,
    ) -> None:
        self.capture = load_capture()
        self.device = dict(self.capture["devices"][0])
        self.procs_capture = load_procs_capture() if load else None
        if self.procs_capture is not None:
            self.device["util"] = dict(self.device["util"], gpu=self.procs_capture["util"][0])
            self.device["throttle"] = self.procs_capture["throttle"]
        self.gpus = gpus
        self.faults = faults or {}
        self.no_handle = no_handle or {}
        self.init_error = init_error
        self.events_supported = events_supported
        self.pcie_counters = pcie_counters  # {index: (tx bytes, rx bytes)}, cumulative
        self.mig = {index: list(instances) for index, instances in (mig or {}).items()}  # GPUs in MIG mode
        self.calls = Counter()  # type: Counter[Tuple[str, Optional[int]]]
        self.events = {}  # type: Dict[int, Deque[Tuple[int, int]]]
        self.initialised = 0
        self.shutdowns = 0
        self.freed_sets = 0
        self.module = types.ModuleType("pynvml_replay")
        _make_errors(self.module)
        for name, value in CONSTANTS.items():
            setattr(self.module, name, value)
        self._install()

    # -- helpers -----------------------------------------------------------------

    def error(self, class_name: str) -> Exception:
        return getattr(self.module, class_name)()

    def push_xid(self, index: int, code: int) -> None:
        """Queue one critical XID event on GPU `index`, as the driver would."""
        self.events.setdefault(index, deque()).append((0x8, code))

    def count(self, function: str, index: Optional[int] = None) -> int:
        """How many times `function` was called (on GPU `index`, or on all)."""
        if index is not None:
            return self.calls[(function, index)]
        return sum(n for (name, _), n in self.calls.items() if name == function)

    def _recorded(self, key: str) -> Any:
        if key not in self.device:
            raise self.error("NVMLError_NotSupported")
        value = self.device[key]
        if isinstance(value, str) and value.startswith("ERR "):
            raise self.error(value[4:].split(":", 1)[0])
        return value

    def _enter(self, name: str, handle: Any) -> int:
        index = handle.index
        self.calls[(name, index)] += 1
        faults = self.faults.get(index, {})
        fault = faults.get(name) or faults.get("*")
        if fault:
            raise self.error(fault)
        return index

    # -- the module's functions -----------------------------------------------------

    def _install(self) -> None:
        m = self.module
        replay = self

        def system(name: str, fn: Any) -> None:
            def wrapper(*args: Any) -> Any:
                replay.calls[(name, None)] += 1
                return fn(*args)

            wrapper.__name__ = name
            setattr(m, name, wrapper)

        def device(name: str, fn: Any) -> None:
            def wrapper(handle: Any, *args: Any, **kwargs: Any) -> Any:
                index = replay._enter(name, handle)
                return fn(index, *args, **kwargs)

            wrapper.__name__ = name
            setattr(m, name, wrapper)

        def init() -> None:
            if replay.init_error:
                raise replay.error(replay.init_error)
            replay.initialised += 1

        def shutdown() -> None:
            replay.shutdowns += 1

        def handle_by_index(index: int) -> Any:
            replay.calls[("nvmlDeviceGetHandleByIndex", index)] += 1
            if index in replay.no_handle:
                raise replay.error(replay.no_handle[index])
            if not 0 <= index < replay.gpus:
                raise replay.error("NVMLError_InvalidArgument")
            return _Handle(index)

        system("nvmlInit", init)
        system("nvmlShutdown", shutdown)
        system("nvmlSystemGetDriverVersion", lambda: replay.capture["driver"])
        system("nvmlSystemGetNVMLVersion", lambda: replay.capture["nvml_version"])
        system("nvmlSystemGetCudaDriverVersion", lambda: replay.capture["cuda_driver"])
        system("nvmlDeviceGetCount", lambda: replay.gpus)
        m.nvmlDeviceGetHandleByIndex = handle_by_index  # type: ignore[attr-defined]

        rec = self._recorded
        device("nvmlDeviceGetName", lambda i: rec("name"))
        device("nvmlDeviceGetUUID", lambda i: replicated_uuid(rec("uuid"), i))
        device(
            "nvmlDeviceGetPciInfo",
            lambda i: _Obj(busId=replicated_bus_id(rec("pci"), i).encode(), busIdLegacy=b""),
        )
        device("nvmlDeviceGetUtilizationRates", lambda i: _Obj(**rec("util")))
        device("nvmlDeviceGetMemoryInfo", self._memory_info)
        device("nvmlDeviceGetTemperature", lambda i, sensor: self._by_arg("temperature", sensor, {0: "temp"}))
        device(
            "nvmlDeviceGetTemperatureThreshold",
            lambda i, kind: self._by_arg("threshold", kind, {1: "temp_thresh_slowdown", 0: "temp_thresh_shutdown"}),
        )
        device("nvmlDeviceGetPowerUsage", lambda i: rec("power_mw"))
        device("nvmlDeviceGetEnforcedPowerLimit", lambda i: rec("power_limit_mw"))
        device("nvmlDeviceGetTotalEnergyConsumption", lambda i: rec("energy_mj"))
        device("nvmlDeviceGetClockInfo", lambda i, kind: self._by_arg("clock", kind, {1: "clock_sm", 2: "clock_mem"}))
        device("nvmlDeviceGetMaxClockInfo", lambda i, kind: self._by_arg("max clock", kind, {1: "clock_sm_max"}))
        device("nvmlDeviceGetCurrentClocksEventReasons", lambda i: rec("throttle"))
        device("nvmlDeviceGetCurrentClocksThrottleReasons", lambda i: rec("throttle"))
        device("nvmlDeviceGetPerformanceState", lambda i: rec("pstate"))
        device("nvmlDeviceGetFanSpeed", lambda i: rec("fan"))
        device("nvmlDeviceGetEccMode", lambda i: list(rec("ecc_mode")))
        device("nvmlDeviceGetTotalEccErrors", self._ecc_errors)
        device("nvmlDeviceGetRemappedRows", lambda i: tuple(rec("remapped_rows")))
        device("nvmlDeviceGetRetiredPagesPendingStatus", lambda i: rec("retired_pages_pending"))
        device("nvmlDeviceGetPcieThroughput", lambda i, counter: self._by_arg("pcie", counter, {0: "pcie_tx_kbs"}))
        device("nvmlDeviceGetCurrPcieLinkGeneration", lambda i: rec("pcie_gen"))
        device("nvmlDeviceGetCurrPcieLinkWidth", lambda i: rec("pcie_width"))
        device("nvmlDeviceGetMaxPcieLinkGeneration", lambda i: rec("pcie_gen_max"))
        device("nvmlDeviceGetMaxPcieLinkWidth", lambda i: rec("pcie_width_max"))
        device("nvmlDeviceGetPersistenceMode", lambda i: rec("persistence"))
        device("nvmlDeviceGetComputeMode", lambda i: rec("compute_mode"))
        device("nvmlDeviceGetMigMode", lambda i: [1, 1] if i in self.mig else list(rec("mig")))
        device("nvmlDeviceGetMaxMigDeviceCount", lambda i: 7)
        self._install_mig()
        device("nvmlDeviceGetSerial", lambda i: rec("serial"))
        device("nvmlDeviceGetVbiosVersion", lambda i: rec("vbios"))
        for suffix in ("_v3", "_v2", ""):
            device("nvmlDeviceGetComputeRunningProcesses" + suffix, self._processes)
        device("nvmlDeviceGetProcessUtilization", self._process_utilization)
        device("nvmlDeviceGetFieldValues", self._field_values)
        device("nvmlDeviceRegisterEvents", self._register_events)
        system("nvmlEventSetCreate", lambda: _Obj(devices=[]))
        system("nvmlEventSetWait_v2", self._event_wait)
        system("nvmlEventSetWait", self._event_wait)
        system("nvmlEventSetFree", self._event_free)

    def _install_mig(self) -> None:
        m = self.module
        replay = self

        def mig_handle(handle: Any, slot: int) -> Any:
            replay.calls[("nvmlDeviceGetMigDeviceHandleByIndex", handle.index)] += 1
            instances = replay.mig.get(handle.index)
            if instances is None:
                raise replay.error("NVMLError_NotSupported")
            if not 0 <= slot < len(instances):
                raise replay.error("NVMLError_NotFound")
            return _MigHandle(handle.index, instances[slot])

        def on_mig(name: str, parent: Any, answer: Any) -> None:
            # A function both handles take: a MIG handle gets the instance's answer.
            def wrapper(handle: Any, *args: Any) -> Any:
                if isinstance(handle, _MigHandle):
                    replay.calls[(name + "(mig)", handle.index)] += 1
                    return answer(handle.index, handle.instance)
                return parent(handle, *args)

            wrapper.__name__ = name
            setattr(m, name, wrapper)

        def mig_only(answer: Any) -> Any:
            def wrapper(handle: Any) -> Any:
                if not isinstance(handle, _MigHandle):
                    raise replay.error("NVMLError_InvalidArgument")
                return answer(handle.instance)

            return wrapper

        m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
        m.nvmlDeviceGetGpuInstanceId = mig_only(lambda inst: inst["gi"])  # type: ignore[attr-defined]
        m.nvmlDeviceGetComputeInstanceId = mig_only(lambda inst: inst["ci"])  # type: ignore[attr-defined]
        on_mig(
            "nvmlDeviceGetName",
            m.nvmlDeviceGetName,
            lambda i, inst: "%s MIG %s" % (self._recorded("name"), inst["profile"]),
        )
        on_mig(
            "nvmlDeviceGetUUID",
            m.nvmlDeviceGetUUID,
            lambda i, inst: "MIG-%08x-0000-5000-8000-%012x" % (0x6A00 + i, inst["gi"]),
        )
        on_mig(
            "nvmlDeviceGetMemoryInfo",
            m.nvmlDeviceGetMemoryInfo,
            lambda i, inst: _Obj(total=inst["total"], used=inst["used"], free=inst["total"] - inst["used"]),
        )

    def _by_arg(self, what: str, arg: int, keys: Dict[int, str]) -> Any:
        key = keys.get(arg)
        if key is None:
            raise self.error("NVMLError_NotSupported")  # this argument was not recorded
        return self._recorded(key)

    def _memory_info(self, index: int, version: Any = None) -> Any:
        mem = self._recorded("mem")
        if version:
            return _Obj(
                version=version, total=mem["total"], reserved=mem["reserved"], free=mem["free"], used=mem["used"]
            )
        # v1 has no reserved field: NVML counts it as used.
        return _Obj(total=mem["total"], free=mem["free"], used=mem["used"] + mem["reserved"])

    def _ecc_errors(self, index: int, error_type: int, counter_type: int) -> Any:
        key = {(1, 0): "ecc_vol_uncorr", (1, 1): "ecc_agg_uncorr", (0, 0): "ecc_vol_corr"}.get(
            (error_type, counter_type)
        )
        if key is None:
            raise self.error("NVMLError_NotSupported")
        return self._recorded(key)

    def _processes(self, index: int) -> List[Any]:
        if index in self.mig:  # in MIG mode the parent lists every instance's processes, with their instance ids
            return [
                _Obj(pid=pid, usedGpuMemory=used, gpuInstanceId=inst["gi"], computeInstanceId=inst["ci"])
                for inst in self.mig[index]
                for pid, used in inst["pids"]
            ]
        if self.procs_capture is not None and index == 0:
            return [
                _Obj(
                    pid=p["pid"],
                    usedGpuMemory=p["usedGpuMemory"],
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
                for p in self.procs_capture["procs"]
            ]
        return [_Obj(**p) for p in self._recorded("procs")]

    def _process_utilization(self, index: int, since: int) -> List[Any]:
        if self.procs_capture is None or index != 0:
            raise self.error("NVMLError_NotFound")  # what NVML answers when no process has samples
        stamp = 1_000_000 + self.calls[("nvmlDeviceGetProcessUtilization", index)]
        return [
            _Obj(pid=p["pid"], timeStamp=stamp, smUtil=p["sm"], memUtil=p["mem"], encUtil=0, decUtil=0)
            for p in self.procs_capture["proc_util"]
            if stamp > since
        ]

    def _field_values(self, index: int, field_ids: Iterable[Any]) -> List[Any]:
        counters = (self.pcie_counters or {}).get(index)
        out = []
        for field_id in field_ids:
            value = None
            if counters is not None and field_id in (197, 198):
                value = counters[0] if field_id == 197 else counters[1]
            out.append(
                _Obj(
                    fieldId=field_id,
                    nvmlReturn=0 if value is not None else 3,
                    value=_Obj(ullVal=value or 0),
                )
            )
        return out

    def _register_events(self, index: int, event_types: int, event_set: Any) -> None:
        if not self.events_supported:
            raise self.error("NVMLError_NotSupported")
        event_set.devices.append(index)

    def _event_wait(self, event_set: Any, timeout_ms: int) -> Any:
        for index in event_set.devices:
            faults = self.faults.get(index, {})
            fault = faults.get("nvmlEventSetWait_v2") or faults.get("*")
            if fault:
                raise self.error(fault)
            queue = self.events.get(index)
            if queue:
                event_type, code = queue.popleft()
                return _Obj(
                    device=_Handle(index), eventType=event_type, eventData=code, gpuInstanceId=0, computeInstanceId=0
                )
        raise self.error("NVMLError_Timeout")

    def _event_free(self, event_set: Any) -> None:
        self.freed_sets += 1
