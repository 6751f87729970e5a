"""NVML's numeric codes as tables: clock event reason bits, compute modes, error codes, XIDs.

Pure data and pure functions (stdlib only), shared by the NVML reader and the nvidia-smi
parser. The numbers are NVML's C ABI values (nvml.h), the same in every pynvml release, so
the reader does not depend on which constants a given pynvml happens to export.
"""

from typing import Dict, Optional, Tuple

# --- error codes (nvmlReturn_t) -------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

# A field that raises one of these is simply absent on this GPU or driver: None, no error.
UNSUPPORTED_CODES = frozenset((NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND))
# The GPU itself is gone (fell off the bus, XID 79): mark it lost and stop asking this tick.
LOST_CODES = frozenset((NVML_ERROR_GPU_IS_LOST, NVML_ERROR_GPU_NOT_FOUND))
# nvmlInit failed because there is no NVIDIA driver here: fall back to nvidia-smi.
NO_DRIVER_CODES = frozenset((NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED))

# --- call arguments ----------------------------------------------------------------------

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_INFO_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x0000000000000008
NVML_PSTATE_UNKNOWN = 32
# nvmlDeviceGetFieldValues ids: cumulative PCIe byte counters (no 20 ms sampling window).
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198

# --- clock event (throttle) reasons -------------------------------------------------

# (bit, name) in bit order; names as pynvml's nvmlClocksEventReason* constants.
CLOCK_EVENT_REASONS = (
    (0x0000000000000001, "GpuIdle"),
    (0x0000000000000002, "ApplicationsClocksSetting"),
    (0x0000000000000004, "SwPowerCap"),
    (0x0000000000000008, "HwSlowdown"),
    (0x0000000000000010, "SyncBoost"),
    (0x0000000000000020, "SwThermalSlowdown"),
    (0x0000000000000040, "HwThermalSlowdown"),
    (0x0000000000000080, "HwPowerBrakeSlowdown"),
    (0x0000000000000100, "DisplayClockSetting"),
    (0x0000000000000200, "BoardLimit"),
    (0x0000000000000400, "Reliability"),
)
_KNOWN_REASON_BITS = 0
for _bit, _name in CLOCK_EVENT_REASONS:
    _KNOWN_REASON_BITS |= _bit

# Reasons that mean the GPU is being held back by something worth an operator's attention.
SLOWDOWN_REASONS = frozenset(
    (
        "SwPowerCap",
        "HwSlowdown",
        "SwThermalSlowdown",
        "HwThermalSlowdown",
        "HwPowerBrakeSlowdown",
    )
)


def decode_clock_event_reasons(mask: int) -> Tuple[str, ...]:
    """Names of the set bits of a clock event reasons mask; unknown bits as one hex entry."""
    mask = int(mask)
    names = tuple(name for bit, name in CLOCK_EVENT_REASONS if mask & bit)
    unknown = mask & ~_KNOWN_REASON_BITS
    if unknown:
        names += ("0x%x" % unknown,)
    return names


def parse_clock_event_mask(text: str) -> Tuple[str, ...]:
    """Decode nvidia-smi's `clocks_event_reasons.active` ("0x0000000000000004")."""
    return decode_clock_event_reasons(int(text.strip(), 16))


# --- modes ---------------------------------------------------------------------------

COMPUTE_MODES: Dict[int, str] = {
    0: "Default",
    1: "Exclusive_Thread",  # support removed from drivers, still a valid code
    2: "Prohibited",
    3: "Exclusive_Process",
}


def compute_mode_name(code: int) -> str:
    """The nvidia-smi spelling of a compute mode code."""
    return COMPUTE_MODES.get(int(code), "Unknown(%d)" % int(code))


def pstate_number(code: int) -> Optional[int]:
    """P-state 0..15, or None for NVML_PSTATE_UNKNOWN."""
    code = int(code)
    return None if code == NVML_PSTATE_UNKNOWN or code < 0 else code


# --- XID events --------------------------------------------------------------------

# The XIDs an operator of a training cluster most often meets (NVIDIA's XID catalogue).
XID_MEANINGS: Dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup (after a previous error)",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def describe_xid(code: int) -> str:
    """ "XID 79: GPU has fallen off the bus", or just "XID n" for an unlisted code."""
    meaning = XID_MEANINGS.get(int(code))
    return "XID %d: %s" % (code, meaning) if meaning else "XID %d" % code


def error_code(exc: BaseException) -> Optional[int]:
    """The nvmlReturn_t of a pynvml NVMLError (its `.value`), None for other exceptions."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None
