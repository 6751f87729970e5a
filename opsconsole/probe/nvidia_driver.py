"""Whether this node has an NVIDIA driver, told without pynvml (stdlib only, Python 3.6+).

A node whose python3 lacks pynvml and which has no nvidia-smi may still have GPUs (the driver is
there, only the Python binding is not) or none at all (no driver). The two need different fixes, so
the probe tells them apart by what the driver itself leaves: the kernel module's
/proc/driver/nvidia/version, and NVML's shared library (libnvidia-ml.so.1) that dlopen can load.
"""

import ctypes
import ctypes.util
from typing import Callable, Optional

PROC_VERSION = "/proc/driver/nvidia/version"
NVML_LIBRARY = "libnvidia-ml.so.1"
NO_DRIVER = "no NVIDIA driver on this node"
NO_DRIVER_DETAIL = "%s (no %s, %s not loadable)" % (NO_DRIVER, PROC_VERSION, NVML_LIBRARY)


def driver_evidence() -> Optional[str]:
    """What shows an NVIDIA driver on this node (its /proc file or NVML's library), or None when nothing does."""
    try:
        with open(PROC_VERSION, "rb"):
            return PROC_VERSION
    except OSError:
        pass
    names = [NVML_LIBRARY]
    try:
        found = ctypes.util.find_library("nvidia-ml")  # may run ldconfig: only when the plain name failed
    except Exception:
        found = None
    for name in names + ([found] if found and found != NVML_LIBRARY else []):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


def without_pynvml(import_error: str, evidence_of: Callable[[], Optional[str]] = driver_evidence) -> str:
    """Why NVML is not used when `import pynvml` failed: no driver at all, or a driver without pynvml."""
    evidence = evidence_of()
    if evidence is None:
        return NO_DRIVER_DETAIL
    return "pynvml not installed (%s; the NVIDIA driver is present: %s)" % (import_error, evidence)
