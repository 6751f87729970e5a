"""The failure signatures: which text in a log line means which category, compiled once.

Each signature names literal needles (lower case): a line is tried against a signature's regex only
when the lower-cased line holds one of its needles, and one regex over every needle (PREFILTER)
rejects the healthy majority of lines with a single search. Patterns follow the exact messages that
PyTorch, NCCL, the CUDA runtime, torchelastic, the kernel (OOM killer, NVRM Xid) and PIL/datasets print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Pattern, Tuple


@dataclass(frozen=True)
class Signature:
    """One way a category shows in a line."""

    category: str
    pattern: Pattern[str]
    needles: Tuple[str, ...]  # lower-case literals, one of which the line must contain
    weak: bool = False  # indirect evidence (an exit code, a launcher's report): ranks below direct evidence


def _sig(category: str, pattern: str, needles: Tuple[str, ...], weak: bool = False, flags: int = 0) -> Signature:
    return Signature(category, re.compile(pattern, flags), needles, weak)


_I = re.IGNORECASE

# Xid codes that NVIDIA's Xid catalogue attributes to the application, not the hardware: 13 graphics
# engine exception and 31 MMU fault (an out-of-bounds access), 43 "GPU stopped processing" and 45
# "preemptive cleanup" (what the driver logs when a process is killed).
_XID_APPLICATION = {13, 31}
_XID_BENIGN = {43, 45}
XID_PATTERN = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")

SIGNATURES: Tuple[Signature, ...] = (
    # --- kernel / hardware ---------------------------------------------------------------------------
    _sig("gpu_hardware", r"NVRM: Xid \(", ("nvrm: xid",)),  # code checked in xid_category()
    _sig("gpu_hardware", r"fallen off the bus", ("fallen off the bus",), flags=_I),
    _sig("gpu_hardware", r"uncorrectable ECC error|ECC error(?:s)? (?:detected|encountered)|cudaErrorECCUncorrectable"
         r"|row.?remap(?:ping)? failure|GPU is lost|GPU requires reset|double.?bit ECC",
         ("ecc", "gpu is lost", "gpu requires reset", "remap"), flags=_I),
    _sig("host_oom", r"Out of memory: Killed process|Killed process \d+ \(.*\) total-vm|invoked oom-killer"
         r"|Memory cgroup out of memory|oom-kill:constraint|Detected \d+ oom[_-]kill event", ("out of memory", "oom"), flags=0),
    _sig("host_oom", r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\) received|\bKilled\s+(?:python|torchrun|\S*\.py)"
         r"|died with <Signals\.SIGKILL: 9>", ("-9", "sigkill", "killed"), weak=True),
    # --- CUDA --------------------------------------------------------------------------------------
    _sig("cuda_oom", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
         r"|CUBLAS_STATUS_ALLOC_FAILED|Cuda failure (?:2 )?'out of memory'|CUDNN_STATUS_ALLOC_FAILED",
         ("out of memory", "outofmemoryerror", "cudaerrormemoryallocation", "alloc_failed")),
    _sig("cuda_device_assert", r"device-side assert(?:ion)? triggered|\.cuh?:\d+: \w.*Assertion `.*` failed"
         r"|cudaErrorAssert", ("device-side assert", "assertion `", "cudaerrorassert")),
    _sig("cuda_illegal_memory", r"illegal memory access|cudaErrorIllegalAddress|illegal instruction was encountered"
         r"|CUDA error: misaligned address|cudaErrorMisalignedAddress",
         ("illegal memory", "illegaladdress", "illegal instruction", "misaligned")),
    _sig("cuda_invalid_device", r"invalid device ordinal|cudaErrorInvalidDevice\b", ("invalid device ordinal", "cudaerrorinvaliddevice")),
    _sig("cuda_peer_access", r"cudaErrorPeerAccess\w*|peer access is not supported|peer mapping resources exhausted"
         r"|cudaErrorTooManyPeers", ("peeraccess", "peer access", "peer mapping", "toomanypeers")),
    _sig("cuda_driver", r"NVIDIA driver on your system is too old|driver version is insufficient for CUDA runtime"
         r"|Found no NVIDIA driver|no CUDA-capable device is detected|No CUDA GPUs are available"
         r"|CUDA initialization: |cudaErrorNoDevice|cudaErrorInsufficientDriver|Driver/library version mismatch"
         r"|no kernel image is available for execution|CUDA error: initialization error"
         r"|CUDA error: system not yet initialized|CUDA-capable device\(s\) is/are busy or unavailable"
         r"|Failed to initialize NVML",
         ("driver", "cuda-capable", "cuda gpus", "cuda initialization", "nodevice", "kernel image",
          "initialization error", "not yet initialized", "nvml")),
    # --- NCCL / torch.distributed --------------------------------------------------------------------
    _sig("nccl_unhandled_cuda", r"unhandled cuda error|ncclUnhandledCudaError", ("unhandled cuda", "ncclunhandledcudaerror")),
    _sig("nccl_network", r"unhandled system error|ncclSystemError|NET/IB ?: .*(?:completion .*status=|error|failed)"
         r"|NET/Socket ?: .*(?:error|failed)|NCCL WARN (?:Net ?: )?(?:Connect to .* failed|Call to \w+ failed)"
         r"|NCCL WARN .*(?:Connection refused|No route to host|Network is unreachable|Connection timed out)"
         r"|network call failed|CANNOT RECV FROM PEER|Bootstrap : no socket interface found"
         r"|ncclInternalError|internal error - please report this issue to the NCCL developers"
         r"|The client socket has failed to connect to|DistNetworkError: (?!.*(?:reset by peer|closed))",
         ("system error", "ncclsystemerror", "net/ib", "net/socket", "nccl warn", "network call failed",
          "cannot recv", "no socket interface", "internal", "client socket", "distnetworkerror")),
    _sig("nccl_timeout", r"Watchdog caught collective operation timeout|collective operation timeout"
         r"|Some NCCL operations have failed or timed out|watchdog got stuck for"
         r"|DistStoreError: .*[Tt]imed out|Timed out (?:after|waiting) .*(?:store|rendezvous|barrier)"
         r"|RendezvousTimeoutError|Socket Timeout",
         ("timeout", "timed out", "watchdog got stuck")),
    _sig("nccl_remote", r"remote process exited|ncclRemoteError|[Cc]onnection closed by (?:remote )?peer|remote detached"
         r"|Connection reset by peer|ChildFailedError|Sending process \d+ closing signal SIGTERM"
         r"|NCCL communicator was aborted|failed \(exitcode: (?!-9\b)-?\d+\) local_rank"
         r"|exitcode\s*:\s*(?!-9\b)-?\d+ \(pid|RendezvousClosedError|Signal \d+ \(SIG\w+\) received by PID",
         ("remote", "closed by", "reset by peer", "childfailederror", "closing signal", "communicator was aborted",
          "exitcode", "rendezvousclosed", "received by pid"), weak=True),
    # --- numerics ------------------------------------------------------------------------------------
    _sig("nan_inf", r"\b(?:train[_ ])?(?:loss|grad[_ ]norm|gradient norm)\b\s*(?:is\s*)?[:=]?\s*(?:nan|[-+]?inf)\b"
         r"|returned nan values|is non-finite, so it cannot be clipped|contains (?:NaN|Inf)\b"
         r"|probability tensor contains either `inf`, `nan`|FloatingPointError|Detected (?:NaN|Inf|non-finite)"
         r"|\bnan (?:loss|gradients?) (?:detected|encountered)|Loss is (?:nan|inf)",
         ("nan", "inf", "floatingpointerror"), flags=_I),
    # --- storage -------------------------------------------------------------------------------------
    _sig("disk_full", r"No space left on device|Errno 28\]|ENOSPC|Disk quota exceeded|Errno 122\]"
         r"|PytorchStreamWriter failed writing|inline_container\.cc:\d+\] \. unexpected pos",
         ("no space left", "errno 28]", "enospc", "quota exceeded", "errno 122]", "pytorchstreamwriter", "unexpected pos")),
    _sig("io_error", r"Input/output error|Errno 5\]|Stale file handle|Errno 116\]|Transport endpoint is not connected"
         r"|Read-only file system|Errno 30\]|blk_update_request: I/O error|Buffer I/O error|EXT4-fs error"
         r"|nfs: server \S+ not responding|PermissionError: \[Errno 13\]|FileNotFoundError: \[Errno 2\]",
         ("input/output", "errno 5]", "stale file", "errno 116]", "transport endpoint", "read-only file", "errno 30]",
          "i/o error", "ext4-fs error", "not responding", "permissionerror", "filenotfounderror")),
    _sig("checkpoint_corrupt", r"PytorchStreamReader failed|failed finding central directory|UnpicklingError"
         r"|pickle data was truncated|SafetensorError|HeaderTooLarge|MetadataIncompleteBuffer"
         r"|archive is corrupted|EOFError: Ran out of input|The file might be corrupted",
         ("pytorchstreamreader", "central directory", "unpickling", "pickle data", "safetensor", "headertoolarge",
          "metadataincomplete", "archive is corrupted", "ran out of input", "might be corrupted")),
    _sig("data_corrupt", r"UnidentifiedImageError|cannot identify image file|image file is truncated"
         r"|broken data stream when reading image|Corrupt JPEG data|Premature end of JPEG file|JSONDecodeError"
         r"|ArrowInvalid|DatasetGenerationError|Parquet magic bytes not found|Error -3 while decompressing"
         r"|UnicodeDecodeError: 'utf-8' codec can't decode|tarfile\.ReadError|truncated file|decoding image failed",
         ("unidentifiedimage", "identify image", "image file is truncated", "broken data stream", "jpeg",
          "jsondecodeerror", "arrowinvalid", "datasetgenerationerror", "magic bytes", "decompressing",
          "unicodedecodeerror", "readerror", "truncated file", "decoding image")),
    _sig("dataloader_worker", r"DataLoader worker \(pid\(?s?\)? [\d, ]+\) (?:is killed by signal|exited unexpectedly)"
         r"|Unexpected (?:bus error|segmentation fault) encountered in worker|out of shared memory"
         r"|unable to (?:write to file|mmap \d+ bytes from file|open shared memory object) </?torch_"
         r"|Too many open files\. Communication with the workers|DataLoader timed out after",
         ("dataloader worker", "encountered in worker", "shared memory", "</torch_", "<torch_",
          "communication with the workers", "dataloader timed out")),
    _sig("dataloader_worker", r"Caught \w+ in DataLoader worker process \d+", ("in dataloader worker process",), weak=True),
)

# One search rejects a healthy line; its needles are the union of every signature's.
_NEEDLES = sorted({needle for sig in SIGNATURES for needle in sig.needles}, key=len, reverse=True)
PREFILTER: Pattern[str] = re.compile("|".join(re.escape(needle) for needle in _NEEDLES))

# Lines that contain a needle but are known to be healthy (fp16 loss scaling, NCCL's optional plugins).
BENIGN: Pattern[str] = re.compile(
    r"Gradient overflow\. +Skipping step|reducing loss scale to|loss scale(?:r)? .*(?:reduc|lower)"
    r"|NCCL WARN (?:Failed to open libibverbs|Could not find real path of|NET/Plugin|Error: network \S+ not found)"
    r"|NCCL INFO",
    re.IGNORECASE,
)


def xid_category(line: str) -> Optional[Tuple[str, bool]]:
    """What an NVRM Xid line means: (category, weak), or None for the Xids a killed process leaves."""
    match = XID_PATTERN.search(line)
    if match is None:
        return ("gpu_hardware", False)
    code = int(match.group(1))
    if code in _XID_BENIGN:
        return None
    if code in _XID_APPLICATION:
        return ("cuda_illegal_memory", True)
    return ("gpu_hardware", False)


def match_line(line: str) -> List[Tuple[str, bool]]:
    """Every (category, weak) whose signature the line matches, in SIGNATURES order; [] when healthy."""
    lowered = line.lower()
    if PREFILTER.search(lowered) is None:
        return []
    matches: List[Tuple[str, bool]] = []
    for sig in SIGNATURES:
        if not any(needle in lowered for needle in sig.needles):
            continue
        if sig.pattern.search(line) is None:
            continue
        if sig.category == "gpu_hardware" and "nvrm: xid" in lowered and sig.needles == ("nvrm: xid",):
            decided = xid_category(line)
            if decided is not None:
                matches.append(decided)
            continue
        matches.append((sig.category, sig.weak))
    if matches and _only_soft(matches) and BENIGN.search(line):
        return []
    return matches


# Categories whose needles are common words; a line matching only these is checked against BENIGN.
_SOFT = {"nan_inf", "nccl_timeout", "nccl_network", "nccl_remote"}


def _only_soft(matches: List[Tuple[str, bool]]) -> bool:
    return all(category in _SOFT for category, _ in matches)
