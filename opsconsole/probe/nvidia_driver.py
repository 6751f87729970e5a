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


def nothing_for_nvml() -> bool:
    """Neither the driver's /proc file nor NVML's library by the name pynvml loads (libnvidia-ml.so.1):
    pynvml's init could only fail, so the probe need not import pynvml at all (~2 MB of its memory
    that would stay loaded for nothing on a login node or a VM). Cheaper than driver_evidence():
    no find_library, which may run ldconfig."""
    try:
        with open(PROC_VERSION, "rb"):
            return False
    except OSError:
        pass
    try:
        ctypes.CDLL(NVML_LIBRARY)  # what pynvml's nvmlInit loads next anyway
    except OSError:
        return True
    return False


def without_pynvml(import_error: str, evidence_of: Callable[[], Optional[str]] = driver_evidence) -> str:
    """Why NVML is not used when `import pynvml` failed: no driver at all, or a driver without pynvml."""
    evidence = evidence_of()
    if evidence is None:
        return NO_DRIVER_DETAIL
    return "pynvml not installed (%s; the NVIDIA driver is present: %s)" % (import_error, evidence)
