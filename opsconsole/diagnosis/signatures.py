"""The failure signatures: which text in a log line means which category, compiled once.

Each signature names literal needles (lower case): a line is tried against a signature's regex only
when the lower-cased line holds one of its needles, and one Aho-Corasick pass over every needle
(candidates) rejects the healthy majority of lines. The needles "nan" and "inf" count only
as whole words there ("INFO" and "inference" are everywhere). Patterns follow the exact messages
that PyTorch, NCCL, the CUDA runtime, torchelastic, the kernel (OOM killer, NVRM Xid) and
PIL/datasets print, and the same failures as TensorFlow, JAX/XLA, ROCm/HIP, Ray and the Hugging Face Hub
word them; tests/data/diagnosis/ and tests/data/diagnosis_real/ hold excerpts of each, noting the report
each copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List, Match, Optional, Pattern, Sequence, Tuple

import ahocorasick_rs


@dataclass(frozen=True)
class Signature:
    """One way a category shows in a line."""

    category: str
    pattern: Pattern[str]
    needles: Tuple[str, ...]  # lower-case literals, one of which the line must contain
    weak: bool = False  # indirect evidence (an exit code, a launcher's report): ranks below direct evidence
    overrides: Tuple[str, ...] = ()  # categories this more specific reading replaces on the same line
    role: str = ""  # ROLE_GENERIC or ROLE_PEER_GONE: read in context by the engine
    check: Optional[Callable[[Match[str]], bool]] = None  # a further test of the match (numbers a regex cannot compare)


ROLE_GENERIC = "generic"  # a generic NCCL result code (unhandled system / internal error)
ROLE_PEER_GONE = "peer_gone"  # a peer closed or reset its connection, or its process exited
ROLE_BARE_EXCEPTION = "bare_exception"  # an exception line quoted alone; inside a traceback the engine reads it


def _sig(
    category: str,
    pattern: str,
    needles: Tuple[str, ...],
    weak: bool = False,
    flags: int = 0,
    overrides: Tuple[str, ...] = (),
    role: str = "",
    check: Optional[Callable[[Match[str]], bool]] = None,
) -> Signature:
    return Signature(category, re.compile(pattern, flags), needles, weak, overrides, role, check)


def _most_steps_skipped(match: Match[str]) -> bool:
    """DeepSpeed's "step=N, skipped=M": fp16 overflowing on most of at least 100 steps has diverged."""
    steps, skipped = int(match.group(1)), int(match.group(2))
    return steps >= 100 and 2 * skipped > steps


_I = re.IGNORECASE

# Xid codes that NVIDIA's Xid catalogue attributes to the application, not the hardware: 13 graphics
# engine exception and 31 MMU fault (an out-of-bounds access), 43 "GPU stopped processing" and 45
# "preemptive cleanup" (what the driver logs when a process is killed).
_XID_APPLICATION = {13, 31}
_XID_BENIGN = {43, 45}
XID_PATTERN = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")

SIGNATURES: Tuple[Signature, ...] = (
    # --- kernel / hardware ---------------------------------------------------------------------------
    _sig("gpu_hardware", r"NVRM: Xid \(", ("nvrm: xid",)),  # the code decides: xid_category()
    _sig("gpu_hardware", r"fallen off the bus", ("fallen off the bus",), flags=_I),
    # The driver sees the GPU but cannot bring it up (after Xid 79/48, a bad PCIe link, a dying board).
    _sig(
        "gpu_hardware",
        r"NVRM: .*(?:RmInitAdapter failed|rm_init_adapter failed)",
        ("rminitadapter failed", "rm_init_adapter failed"),
    ),
    _sig(
        "gpu_hardware",
        r"uncorrectable ECC error|ECC errors? (?:detected|encountered)|cudaErrorECCUncorrectable"
        r"|row.?remap(?:ping)? failure|GPU is lost|GPU requires reset|double.?bit (?:ECC|error)"
        r"|Unable to determine the device handle for GPU",
        (
            "uncorrectable ecc",
            "ecc error",
            "cudaerroreccuncorrectable",
            "remap",
            "gpu is lost",
            "gpu requires reset",
            "double bit",
            "double-bit",
            "device handle for gpu",
        ),
        flags=_I,
    ),
    _sig(
        "host_oom",
        r"Out of memory: Killed process|Killed process \d+ \(.*\) total-vm|invoked oom-killer"
        r"|Memory cgroup out of memory|oom-kill:constraint|Detected \d+ oom[_-]kill events?"
        r"|task \d+: Out Of Memory|Out of memory: Kill process \d+|\bOOMKilled\b"
        r"|killed by the cgroup out-of-memory handler",
        ("out of memory", "killed process", "oom-killer", "oom-kill", "oom_kill", "oomkilled", "out-of-memory handler"),
    ),
    # SIGKILL in the words of torchelastic, shells, Python and launchers: a killed process. The OOM killer is one
    # sender (its own line, above, is host_oom); a scheduler's limit and a kill -9 are others.
    _sig(
        "rank_crashed",
        r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\) received|\bKilled\s+(?:python|torchrun|deepspeed|\S*\.py)"
        r"|terminated with signal SIGKILL|died with <Signals\.SIGKILL: 9>|(?:^|it/s\]|s/it\])\s*Killed\s*$"
        r"|exits with return code = -9\b|exit code 137\b|(?:exit|error|return) (?:code|status):? ?-9\b|returncode=-9\b"
        r"|exit status 137\b|^\[\d+\]\s+\d+ killed\s+\S"
        # strerror-style "Killed" from a shell in another locale (zh_CN, de, ru, fr, ja)
        r"|(?:^|it/s\]|s/it\])\s*(?:已杀死|已殺死|Getötet|Убито|Processus arrêté|強制終了)\s*$",
        (
            "exitcode",
            "sigkill",
            "killed",
            "return code = -9",
            "exit code 137",
            "code -9",
            "code: -9",
            "status -9",
            "status: -9",
            "returncode=-9",
            "exit status 137",
            "已杀死",
            "已殺死",
            "getötet",
            "убито",
            "processus arrêté",
            "強制終了",
        ),
        weak=True,
    ),
    # Ray's memory monitor kills workers before the kernel does; a host allocation refused is the same story.
    _sig(
        "host_oom",
        r"Task was killed due to the node running low on memory|killed due to memory pressure \(OOM\)"
        r"|System memory low at node|DefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
        (
            "running low on memory",
            "memory pressure (oom)",
            "system memory low",
            "can't allocate memory",
            "not enough memory",
        ),
        overrides=("cuda_oom",),
    ),
    # The host's memory refused in the words of Python, NumPy and the C++ runtime, and by Slurm's and Colab's limits.
    _sig(
        "host_oom",
        r"^\s*(?:[\w.]+\.)?_?(?:Array)?MemoryError\b(?!.*(?:CUDA|GPU|device))|Unable to allocate [\d.]+ [KMGTP]i?B for an array"
        r"|std::bad_alloc|[Ee]xceeded (?:job |step )?memory limit|session crashed after using all available RAM",
        (
            "memoryerror",
            "unable to allocate",
            "std::bad_alloc",
            "exceeded memory limit",
            "exceeded job memory limit",
            "exceeded step memory limit",
            "all available ram",
        ),
        overrides=("app_error",),
    ),
    # More ways of saying SIGKILL (macOS's and zsh's, signal 9 in words, exit code 137 with a colon).
    _sig(
        "rank_crashed",
        r"^Killed: 9\s*$|^zsh: killed\s+\S|(?:killed|terminated|died) (?:by|with) signal:? ?(?:9\b|SIGKILL)"
        r"|exit (?:code|status)[:=] ?137\b",
        ("killed: 9", "zsh: killed", "by signal", "with signal", "code: 137", "code=137", "status: 137", "status=137"),
        weak=True,
    ),
    # --- CUDA --------------------------------------------------------------------------------------
    # "CUDA out of memory" is torch's allocator's sentence ("CUDA out of memory. Tried to allocate ..."), ended by
    # a stop; followed by a lower-case word it is prose naming the feature ("CUDA out of memory handling: enabled
    # auto batch size finder"), not an OOM.
    _sig(
        "cuda_oom",
        r"CUDA out of memory(?![ \t]+[a-z])|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
        r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|Cuda failure (?:2 )?'out of memory'"
        r"|Failed to CUDA (?:calloc|malloc|host alloc)",
        ("out of memory", "outofmemoryerror", "cudaerrormemoryallocation", "alloc_failed", "failed to cuda"),
    ),
    # The same on the other stacks: XLA (JAX, TF), TensorFlow's BFC allocator (not its CPU allocator), ROCm/HIP.
    _sig(
        "cuda_oom",
        r"RESOURCE_EXHAUSTED: (?:Out of memory|.*Ran out of memory in memory space|Attempting to reserve .*"
        r"That was not possible|Error allocating device buffer)|CUDA_ERROR_OUT_OF_MEMORY"
        r"|OOM when allocating tensor(?!.*device:CPU)|ResourceExhaustedError: failed to allocate memory"
        r"|HIP out of memory|HIP_ERROR_OutOfMemory|hipErrorOutOfMemory",
        (
            "resource_exhausted: ",
            "cuda_error_out_of_memory",
            "oom when allocating tensor",
            "failed to allocate memory",
            "hip out of memory",
            "hip_error_outofmemory",
            "hiperroroutofmemory",
        ),
    ),
    _sig(
        "cuda_device_assert",
        r"device-side assert(?:ion)? triggered|\.cuh?:\d+: \w.*Assertion `.*` failed"
        r"|cudaErrorAssert",
        ("device-side assert", "assertion `", "cudaerrorassert"),
    ),
    _sig(
        "cuda_illegal_memory",
        r"illegal memory access|cudaErrorIllegalAddress|illegal instruction was encountered"
        r"|CUDA error: misaligned address|\(74 vs\. 0\)\s+misaligned address|cudaErrorMisalignedAddress|CUDA error: unspecified launch failure"
        r"|cudaErrorLaunchFailure|HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION",
        (
            "illegal memory",
            "illegaladdress",
            "illegal instruction",
            "misaligned",
            "unspecified launch failure",
            "cudaerrorlaunchfailure",
            "memory_aperture_violation",
        ),
    ),
    _sig(
        "cuda_invalid_device",
        r"invalid device ordinal|cudaErrorInvalidDevice\b",
        ("invalid device ordinal", "cudaerrorinvaliddevice"),
    ),
    # cudaErrorPeerAccessAlreadyEnabled is what enabling twice returns: NCCL and torch ignore it.
    _sig(
        "cuda_peer_access",
        r"cudaErrorPeerAccess(?!AlreadyEnabled)\w*|peer access is not supported"
        r"|peer mapping resources exhausted|cudaErrorTooManyPeers",
        ("cudaerrorpeeraccess", "peer access is not supported", "peer mapping", "toomanypeers"),
    ),
    _sig(
        "cuda_driver",
        r"NVIDIA driver on your system is too old|driver version is insufficient for CUDA runtime"
        r"|Found no NVIDIA driver|no CUDA-capable device is detected|No CUDA GPUs are available"
        r"|CUDA initialization: |cudaErrorNoDevice|cudaErrorInsufficientDriver|Driver/library version mismatch"
        r"|no kernel image is available for execution|CUDA error: initialization error"
        r"|CUDA error: system not yet initialized|CUDA-capable device\(s\) is/are busy or unavailable"
        r"|all CUDA-capable devices are busy or unavailable|cudaErrorDevicesUnavailable|cudaErrorInitializationError"
        r"|is not compatible with the current PyTorch installation|invalid device function|hipErrorNoBinaryForGpu"
        r"|Failed to initialize NVML|^No devices were found"
        r"|failed call to cuInit|[Cc]all to cuInit results in|CUDA_ERROR_UNKNOWN|cudaErrorUnknown|CUDA unknown error"
        r"|CUDA error: unknown error|unknown error \(code 999|\berror 999\b|CUDA_ERROR_NO_DEVICE|CudaSupportError"
        r"|forward compatibility was attempted on non supported HW|cudaErrorCompatNotSupportedOnDevice"
        r"|CUDA_ERROR_COMPAT_NOT_SUPPORTED|unsupported display driver / cuda driver combination"
        r"|cudaErrorSystemDriverMismatch|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH|couldn't communicate with the NVIDIA driver"
        r"|CUDA driver initialization failed|PTX was compiled with an unsupported toolchain|cudaErrorUnsupportedPtxVersion"
        r"|CUDA driver is a stub library|cudaErrorStubLibrary|torch\.cuda\.is_available\(\) is False"
        r"|Torch not compiled with CUDA enabled",
        (
            "nvidia driver on your system",
            "driver version is insufficient",
            "no nvidia driver",
            "cuda-capable",
            "no cuda gpus",
            "cuda initialization: ",
            "cudaerrornodevice",
            "cudaerrorinsufficientdriver",
            "driver/library version mismatch",
            "no kernel image",
            "initialization error",
            "not yet initialized",
            "failed to initialize nvml",
            "no devices were found",
            "devicesunavailable",
            "initializationerror",
            "not compatible with the current pytorch installation",
            "invalid device function",
            "nobinaryforgpu",
            "cuinit",
            "cuda_error_unknown",
            "cudaerrorunknown",
            "cuda unknown error",
            "unknown error",
            "error 999",
            "cuda_error_no_device",
            "cudasupporterror",
            "forward compatibility",
            "compatnotsupported",
            "compat_not_supported",
            "unsupported display driver",
            "systemdrivermismatch",
            "system_driver_mismatch",
            "communicate with the nvidia driver",
            "cuda driver initialization failed",
            "unsupported toolchain",
            "unsupportedptxversion",
            "stub library",
            "cudaerrorstublibrary",
            "is_available() is false",
            "not compiled with cuda",
        ),
    ),
    # The same, further out: a numeric 999, ROCm with no device, CUDA libraries missing at import (not TensorFlow's
    # dlerror warnings on a CPU-only machine, which it survives), cuDNN/NVML version mismatches, the container runtime.
    _sig(
        "cuda_driver",
        r"(?:error|Error)[= :(]{1,3}999\b|No HIP GPUs are available|hipErrorNoDevice|CUDA_ERROR_NOT_INITIALIZED"
        r"|(?:ImportError|OSError): lib(?:cuda|cudart|cublas|cudnn|nvrtc|nvidia-ml)\S*\.so[.\d]*: cannot open shared object"
        r"|Could not load library libcudnn\w*\.so|cuDNN version incompatibility|NVML library version mismatch"
        r"|nvml error: driver not loaded|could not select device driver .* with capabilities: \[\[gpu\]\]"
        r"|Unable to initialize backend 'cuda'|No visible GPU devices",
        (
            "error 999",
            "error=999",
            "error: 999",
            "error(999",
            "error (999",
            "no hip gpus",
            "hiperrornodevice",
            "cuda_error_not_initialized",
            "cannot open shared object",
            "could not load library libcudnn",
            "cudnn version incompatibility",
            "nvml library version mismatch",
            "driver not loaded",
            "could not select device driver",
            "unable to initialize backend 'cuda'",
            "no visible gpu devices",
        ),
    ),
    # cuDNN that cannot create its handle or list its algorithms: a cuDNN/CUDA/driver mismatch in the environment.
    _sig(
        "cuda_driver",
        r"CUDNN_STATUS_NOT_INITIALIZED|Check failed: stream->parent\(\)->GetConvolveAlgorithms",
        ("cudnn_status_not_initialized", "getconvolvealgorithms"),
    ),
    # --- NCCL / torch.distributed --------------------------------------------------------------------
    _sig(
        "nccl_unhandled_cuda",
        r"unhandled cuda error|ncclUnhandledCudaError",
        ("unhandled cuda", "ncclunhandledcudaerror"),
    ),
    # NCCL's generic result codes say only that something failed; after a peer went away they mean that.
    _sig(
        "nccl_network",
        r"unhandled system error|ncclSystemError|ncclInternalError"
        r"|internal error - please report this issue to the NCCL developers|, internal error, NCCL version",
        ("unhandled system error", "ncclsystemerror", "ncclinternalerror", "internal error"),
        role="generic",
    ),
    _sig(
        "nccl_network",
        r"NET/IB\w* ?: ?.*(?:completion .*(?:status=|error)|error|failed)"
        r"|NET/Socket ?: .*(?:error|failed)"
        r"|NCCL WARN (?:[\w/]+ ?: ?)?(?:Connect to .* failed|Call to \w+ .*failed)(?!.*(?:reset by peer|Broken pipe|closed))"
        r"|NCCL WARN .*(?:Connection refused|No route to host|Network is unreachable|Connection timed out)"
        r"|\bsocket\w*: Connect to \S+ failed|network call failed|CANNOT RECV FROM PEER|Bootstrap : no socket interface found"
        r"|The client socket has failed to connect to|DistNetworkError: (?!.*(?:reset by peer|closed))"
        r"|NET/OFI .*(?:error|failed)|Transport retry count exceeded on|\(detected in ncclIb"
        # A connection being set up that failed with anything but ncclRemoteError (6, the peer's side)
        r"|Failed to execute operation Connect from rank \d+, retcode [0-57-9]"
        r"|Error encountered progressing operation=Connect, res=[0-57-9]",
        (
            "net/ib",
            "net/socket",
            "connect to",
            "call to ",
            "connection refused",
            "no route to host",
            "network is unreachable",
            "connection timed out",
            "network call failed",
            "cannot recv from peer",
            "no socket interface",
            "client socket",
            "distnetworkerror",
            "net/ofi",
            "transport retry count exceeded",
            "detected in ncclib",
            "operation connect from rank",
            "operation=connect",
        ),
    ),
    _sig(
        "nccl_timeout",
        r"Watchdog caught collective operation timeout|collective operation timeout"
        r"|Some NCCL operations have failed or timed out|watchdog got stuck for|Timeout at NCCL work"
        r"|Heartbeat monitor timed out|DistStoreError: .*[Tt]imed out"
        r"|Timed out (?:after|waiting) .*(?:store|rendezvous|barrier|clients)|Timed out initializing process group"
        r"|Timed out waiting \d+ms for (?:recv|send) operation|failed to pass monitoredBarrier"
        r"|RendezvousTimeoutError|Socket Timeout",
        (
            "collective operation timeout",
            "failed or timed out",
            "watchdog got stuck",
            "timeout at nccl work",
            "heartbeat monitor timed out",
            "diststoreerror",
            "timed out after",
            "timed out waiting",
            "timed out initializing",
            "monitoredbarrier",
            "rendezvoustimeouterror",
            "socket timeout",
        ),
    ),
    # A peer's connection gone: the cause is on the other side.
    _sig(
        "nccl_remote",
        r"remote process exited|ncclRemoteError|[Cc]onnection closed by (?:remote )?peer|remote detached"
        r"|Connection reset by peer|failed : Broken pipe|NCCL communicator was aborted|RendezvousClosedError"
        r"|Horovod has been shut down",
        (
            "remote process",
            "ncclremoteerror",
            "closed by",
            "remote detached",
            "reset by peer",
            "broken pipe",
            "communicator was aborted",
            "rendezvousclosed",
            "horovod has been shut down",
        ),
        weak=True,
        role="peer_gone",
    ),
    # A Ray actor or worker gone (ActorDiedError, RayActorError): its own log holds the cause.
    _sig(
        "nccl_remote",
        r"The actor died unexpectedly|The actor is dead because its worker process has died"
        r"|A worker died or was killed while executing a task",
        ("actor died unexpectedly", "actor is dead", "worker died or was killed"),
        weak=True,
    ),
    # The launcher's report of a failed child (its own error, if any, is in that child's lines).
    _sig(
        "nccl_remote",
        r"ChildFailedError|Sending process \d+ closing signal SIGTERM"
        r"|failed \(exitcode: (?!-9\b)-?\d+\) local_rank"
        r"|exitcode\s*:\s*(?!-9\b)-?\d+ \(pid|Signal \d+ \(SIG\w+\) received by PID"
        r"|task \d+: Exited with exit code [1-9]|process \d+ terminated with exit code [1-9]",
        (
            "childfailederror",
            "closing signal",
            "exitcode",
            "received by pid",
            "exited with exit code",
            "terminated with exit code",
        ),
        weak=True,
    ),
    # --- numerics ------------------------------------------------------------------------------------
    # Only the loss: a NaN/Inf grad norm alone is what fp16 loss scaling shows on the steps it skips.
    # One signature per phrasing, each with its own needles, so a line runs only the regex it may match;
    # case spelled out instead of IGNORECASE, a literal first in every branch (sre scans for it in C).
    # "oss" first, "[Ll]" and the letter before it checked behind: 1.7 us a Megatron metrics line, 8 us with "[Ll]" first.
    _sig(
        "nan_inf",
        r"oss(?<![A-Za-z][Ll]oss)(?<=[Ll]oss)(?:_(?!scale)\w{1,20})?['\"]?\s*(?:is\s+|[:=]\s*|\s+)(?:total[:=]\s*)?['\"]?"
        r"[\[(]?(?:-?(?:nan|NaN|NAN)|[-+]?(?:inf|Inf|INF))\b",
        ("nan", "inf"),
    ),
    _sig("nan_inf", r"number of nan iterations:\s*[1-9]", ("nan iterations",)),
    _sig(
        "nan_inf",
        r"Nan in summary histogram|\b(?:NaN|nan) loss(?:es)? (?:at|in|on|during|after|for|from)\b",
        ("nan in summary histogram", "nan loss"),
    ),
    # The loss in words ("loss became NaN") or as a printed tensor ("loss: tensor(nan, device='cuda:0')"); a
    # distribution whose parameters went NaN (torch.distributions' validation); NaN "detected"/"encountered".
    _sig(
        "nan_inf",
        r"oss(?:es)? (?:becomes?|became|goes to|went to|turns? (?:in)?to|is going to|explodes? to) (?:nan|NaN|NAN|inf|Inf)\b"
        r"|oss\w{0,20}['\"]?\s*[:=]?\s*tensor\(\[*(?:nan|inf|-inf)\b"
        # torch.distributions' Real() constraint fails only on NaN/Inf (a scale that went negative fails Positive())
        r"|(?:to satisfy the constraint |to be within the support \()(?:IndependentConstraint\()?Real\(\).*but found invalid values"
        r"|(?<![A-Za-z])(?:NaN|nan|NAN) (?:detected|encountered)\b(?!.*[Ss]kip)"
        r"|\b(?:[Ee]ncountered|[Dd]etected) (?:a |an )?(?:NaN|nan|NAN|non-finite)\b(?!.*[Ss]kip)",
        (
            "oss become",
            "oss became",
            "oss goes to",
            "oss went to",
            "oss turn",
            "oss is going to",
            "oss explode",
            "tensor(nan",
            "tensor(inf",
            "tensor(-inf",
            "but found invalid values",
            "nan detected",
            "nan encountered",
            "encountered nan",
            "encountered a nan",
            "detected nan",
            "detected a nan",
            "encountered non-finite",
            "detected non-finite",
        ),
    ),
    # Dynamic loss scaling that never recovers: the scale driven to its floor (apex prints Python's
    # repr, so below 1e-4 it is in e- notation; fairseq's default floor is 1e-4; DeepSpeed's is 1).
    # A scale halved all the way to zero (DeepSpeed's "Attempted loss scale: 0.0, reducing to 0.0") is the same story.
    _sig(
        "nan_inf",
        r"loss scale to:? (?:\d(?:\.\d+)?e-\d|0\.000\d)|Attempted loss scale: 1(?:\.0)?, reducing to 1\b"
        r"|Attempted loss scale: 0(?:\.0+)?, reducing to 0(?:\.0+)?\b",
        ("loss scale to", "attempted loss scale: 1", "attempted loss scale: 0"),
    ),
    _sig("nan_inf", r"\bstep=(\d+), skipped=(\d+)", ("skipped=",), check=_most_steps_skipped),
    _sig(
        "nan_inf",
        r"returned nan values|contains (?:NaN|Inf|nan|inf)\b|probability tensor contains either `inf`, `nan`"
        r"|Detected (?:NaN|Inf|non-finite)|[Nn]a[Nn] (?:loss|gradients?) (?:detected|encountered)",
        (
            "returned nan",
            "contains nan",
            "contains inf",
            "probability tensor",
            "detected nan",
            "detected inf",
            "detected non-finite",
            "nan loss",
            "nan gradient",
        ),
    ),
    # The frameworks' own NaN checks: TensorFlow's CheckNumerics op ("LossTensor is inf or nan : Tensor had NaN
    # values"), Megatron's grad-norm and loss checks ("Rank 11: found NaN in local grad norm ...", the rerun
    # machine's "Unexpected result nan"), tf.estimator's NanLossDuringTrainingError.
    _sig(
        "nan_inf",
        r"Tensor had (?:NaN|Inf) values|found (?:NaN|Inf) in local (?:grad norm|forward loss)"
        r"|Unexpected result nan\b|NaN loss during training",
        (
            "tensor had nan",
            "tensor had inf",
            "found nan in local",
            "found inf in local",
            "unexpected result nan",
            "nan loss during training",
        ),
    ),
    _sig(
        "nan_inf",
        r"is non-finite, so it cannot be clipped|FloatingPointError|Minimum loss scale reached"
        r"|loss scale already at minimum|Loss became infinite or NaN|Invalid loss, terminating training",
        (
            "non-finite",
            "floatingpointerror",
            "minimum loss scale",
            "loss scale already at minimum",
            "loss became infinite",
            "invalid loss, terminating",
        ),
    ),
    # The HF Trainer's metrics when the weights went NaN: the loss reads 0.0 and the grad norm NaN, step after
    # step (a step an fp16 scaler skips still reports its real loss).
    _sig("nan_inf", r"'loss': 0\.0, 'grad_norm': nan\b", ("'grad_norm': nan",)),
    # Megatron's metrics line with loss scale 1.0 (bf16/fp32: no dynamic scaler skips a step): a NaN/Inf grad
    # norm there is the model's. InternEvo's own check says it in words.
    _sig(
        "nan_inf",
        r"loss scale: 1\.0 \| grad norm: (?:nan|inf)\b|[Nn]a[Nn] grad norm occurs",
        ("grad norm: nan", "grad norm: inf", "nan grad norm occurs"),
    ),
    # "NaN detected in loss", "Inf found in the gradients": needles on the verb, not on every whole-word "nan" (each
    # Megatron metrics line says "number of nan iterations").
    _sig(
        "nan_inf",
        r"(?<![A-Za-z])(?:NaN|nan|Inf|inf)(?: or (?:Inf|inf|NaN|nan))? (?:detected|found|encountered) in (?:the )?"
        r"(?:loss|grad|gradients?|outputs?|logits|parameters|weights)\b",
        ("detected in", "found in", "encountered in"),
    ),
    # --- storage -------------------------------------------------------------------------------------
    _sig(
        "disk_full",
        # The message itself, not prose about it: "No space left on device would abort; 120 GiB free" (a pre-flight
        # check saying what it guards against) goes on with a modal verb where the error's text ends or gives its code.
        r"[Nn]o space left on device(?!\s+(?:would|will|could|can|may|might|should|shall)\b)|Errno 28\]|ENOSPC|[Dd]isk quota exceeded|Errno 122\]"
        r"|\d+ requested and \d+ written|Wrote only \d+ of \d+ bytes|write error: wrote \d+ blocks instead of \d+"
        r"|장치에 남은 공간이 없음"
        r"|Não há espaço disponível no dispositivo|Spazio esaurito sul device|Brak miejsca na urządzeniu"
        r"|PytorchStreamWriter failed writing|inline_container\.cc:\d+\] \. unexpected pos"
        r"|kind: StorageFull|Not enough (?:free )?disk space|database or disk is full|No usable temporary directory found"
        r"|[Oo]ut of disk space|\bEDQUOT\b|not enough space on the disk|WinError 112\]|ERROR_DISK_FULL"
        r"|设备上没有空间|裝置上已無多餘空間|Auf dem Gerät ist kein Speicherplatz mehr verfügbar"
        r"|Aucun espace disponible sur le périphérique|No queda espacio en el dispositivo|デバイスに空き領域がありません"
        r"|На устройстве не осталось свободного места|超出磁盘限额",
        (
            "no space left",
            "errno 28]",
            "enospc",
            "quota exceeded",
            "errno 122]",
            "pytorchstreamwriter",
            "unexpected pos",
            "storagefull",
            "disk space",
            "disk is full",
            "no usable temporary directory",
            "edquot",
            "space on the disk",
            "winerror 112]",
            "error_disk_full",
            "设备上没有空间",
            "裝置上已無多餘空間",
            "kein speicherplatz",
            "aucun espace disponible",
            "no queda espacio",
            "デバイスに空き領域がありません",
            "не осталось свободного места",
            "超出磁盘限额",
            "requested and",
            "wrote only",
            "blocks instead of",
            "장치에 남은 공간이 없음",
            "não há espaço disponível",
            "spazio esaurito",
            "brak miejsca na urządzeniu",
        ),
    ),
    _sig(
        "io_error",
        r"Input/output error|Errno 5\]|Stale file handle|Errno 116\]|Transport endpoint is not connected"
        r"|Read-only file system|Errno 30\]|blk_update_request: I/O error|Buffer I/O error|EXT4-fs error"
        r"|nfs: server \S+ not responding|LustreError|PermissionError: \[Errno 13\]|FileNotFoundError: \[Errno 2\]",
        (
            "input/output",
            "errno 5]",
            "stale file",
            "errno 116]",
            "transport endpoint",
            "read-only file",
            "errno 30]",
            "i/o error",
            "ext4-fs error",
            "not responding",
            "lustreerror",
            "permissionerror",
            "filenotfounderror",
        ),
    ),
    _sig("io_error", r"PermissionDeniedError|Permission denied: /", ("permissiondeniederror", "permission denied: /")),
    # Remote storage that did not answer: the Hugging Face Hub, S3/GCS object stores, dataset mirrors. A
    # request that will be retried (huggingface_hub's "Retrying in 1s", wandb's retry loop) is not a failure.
    _sig(
        "io_error",
        r"^(?!.*(?:Retrying in|retry loop))(?:.*(?:Read timed out|ReadTimeout|Read timeout on endpoint URL"
        r"|We couldn't connect to 'https?://|LocalEntryNotFoundError|Couldn.t reach https?://"
        r"|Max retries exceeded with url|ChunkedEncodingError|Connection broken: ))",
        (
            "read timed out",
            "readtimeout",
            "read timeout on endpoint",
            "couldn't connect to",
            "localentrynotfound",
            "couldn't reach",
            "couldn’t reach",
            "max retries exceeded",
            "chunkedencodingerror",
            "connection broken: ",
        ),
        overrides=("nccl_remote",),
    ),
    _sig(
        "io_error",
        r"^(?!.*(?:Retrying in|retry loop|[Rr]etrying))(?:.*(?:Connection aborted\.|ProtocolError\(|urlopen error"
        r"|RemoteDisconnected|IncompleteRead\(|ConnectTimeoutError|NewConnectionError|NameResolutionError"
        r"|The read operation timed out|SSLError\(|SSLEOFError|EndpointConnectionError|HTTPError: 5\d\d Server Error"
        r"|HfHubHTTPError: 5\d\d|Consistency check failed: file should be of size"
        r"|An existing connection was forcibly closed by the remote host|aiohttp\.client_exceptions\.\w+|ClientOSError"
        r"|ServerDisconnectedError|ClientPayloadError|ClientConnectorError|ConnectionClosedError"
        r"|Connection was closed before we received a valid response|ServiceUnavailable: 503|DeadlineExceeded: 504"
        r"|^\s*(?:[\w.]+\.)?ConnectionResetError: \[(?:Errno|WinError) \d+\]|ConnectionResetError\((?:104|54|10054),))",
        (
            "connection aborted.",
            "protocolerror(",
            "urlopen error",
            "remotedisconnected",
            "incompleteread(",
            "connecttimeouterror",
            "newconnectionerror",
            "nameresolutionerror",
            "read operation timed out",
            "sslerror(",
            "ssleoferror",
            "endpointconnectionerror",
            "server error",
            "hfhubhttperror: 5",
            "consistency check failed",
            "forcibly closed by the remote host",
            "aiohttp.client_exceptions.",
            "clientoserror",
            "serverdisconnectederror",
            "clientpayloaderror",
            "clientconnectorerror",
            "connectionclosederror",
            "closed before we received a valid response",
            "serviceunavailable: 503",
            "deadlineexceeded: 504",
            "connectionreseterror: [",
            "connectionreseterror(",
        ),
        overrides=("nccl_remote", "nccl_network"),
    ),
    # torch>=2.6 refuses unknown globals with "Weights only load failed": a policy, not a damaged file.
    _sig(
        "checkpoint_corrupt",
        r"PytorchStreamReader failed|failed finding central directory"
        r"|UnpicklingError(?!: Weights only load failed)|pickle data was truncated|SafetensorError|HeaderTooLarge"
        r"|MetadataIncompleteBuffer|archive is corrupted|EOFError: Ran out of input|The file might be corrupted",
        (
            "pytorchstreamreader",
            "central directory",
            "unpickling",
            "pickle data",
            "safetensor",
            "headertoolarge",
            "metadataincomplete",
            "archive is corrupted",
            "ran out of input",
            "might be corrupted",
        ),
    ),
    # libjpeg's "Corrupt JPEG data: N extraneous bytes" is a warning on an image that still decodes.
    _sig(
        "data_corrupt",
        r"UnidentifiedImageError|cannot identify image file|image file is truncated"
        r"|broken data stream when reading image|JSONDecodeError|ArrowInvalid|DatasetGenerationError"
        r"|Parquet magic bytes not found|Error -3 while decompressing|UnicodeDecodeError: 'utf-8' codec can't decode"
        r"|tarfile\.ReadError|decoding image failed|struct\.error: unpack(?:_from)? requires a buffer",
        (
            "unidentifiedimage",
            "identify image",
            "image file is truncated",
            "broken data stream",
            "jsondecodeerror",
            "arrowinvalid",
            "datasetgenerationerror",
            "magic bytes",
            "decompressing",
            "unicodedecodeerror",
            "readerror",
            "decoding image",
            "struct.error",
        ),
    ),
    _sig("data_corrupt", r"DataLossError: corrupted record|Data loss: corrupted record", ("corrupted record",)),
    _sig(
        "dataloader_worker",
        r"DataLoader worker \(pid\(?s?\)? [\d, ]+\) (?:is killed by signal|exited unexpectedly)"
        r"|Unexpected (?:bus error|segmentation fault) encountered in worker|out of shared memory"
        r"|Too many open files\. Communication with the workers|DataLoader timed out after",
        (
            "dataloader worker",
            "encountered in worker",
            "shared memory",
            "communication with the workers",
            "dataloader timed out",
        ),
    ),
    # Shared memory (/dev/shm, torch's </torch_...> segments) filling up is a loader problem, not a full disk.
    _sig(
        "dataloader_worker",
        r"unable to (?:write to file|mmap \d+ bytes from file|open shared memory object) </?torch_"
        r"|No space left on device.*/dev/shm|/dev/shm.*No space left on device",
        ("</torch_", "<torch_", "/dev/shm"),
        overrides=("disk_full",),
    ),
    _sig(
        "dataloader_worker",
        r"Caught \w+ in DataLoader worker process \d+",
        ("in dataloader worker process",),
        weak=True,
        overrides=("app_error",),  # "RuntimeError: Caught ..." is the worker's report, not an app error of its own
    ),
    # The training script's own bugs in the words PyTorch and Lightning use for them, for the logs that keep
    # only the exception line (a notebook's traceback, a report that quotes the last line).
    _sig(
        "app_error",
        r"mat1 and mat2 shapes cannot be multiplied|Expected all tensors to be on the same device"
        r"|IndexError: index out of range in self|IndexError: list index out of range\s*$|Expected input batch_size \(\d+\) to match target batch_size"
        r"|does not require grad and does not have a grad_fn|Error\(s\) in loading state_dict for"
        r"|MisconfigurationException|Target modules .{0,400} not found in the base model",
        (
            "mat1 and mat2",
            "expected all tensors to be on the same device",
            "index out of range in self",
            "to match target batch_size",
            "index out of range",
            "does not require grad",
            "error(s) in loading state_dict",
            "misconfigurationexception",
            "not found in the base model",
        ),
    ),
    # Ranks that called different collectives, or the same one with different sizes: gloo aborts the receiving
    # rank ("Received data size doesn't match expected size"), TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatch.
    # The training code's bug, not a peer's failure.
    _sig(
        "app_error",
        r"Is there a distributed collective mismatch|Received data size doesn't match expected size"
        r"|Detected mismatch between collectives on ranks",
        ("collective mismatch", "doesn't match expected size", "mismatch between collectives"),
    ),
    # IPython's traceback header names the exception before its frames ("IndexError    Traceback (most
    # recent call last)"); a more specific line further down still wins on precedence.
    _sig(
        "app_error",
        r"^\s*(?!BrokenPipe|ConnectionReset)\w+(?:Error|Exception)\s{2,}Traceback \(most recent call last\)\s*$",
        ("traceback (most recent call last)",),
    ),
    # The same IPython header naming an HTTP client's exception: a download that failed (I/O), not the app.
    _sig(
        "io_error",
        r"^\s*(?:ProtocolError|MaxRetryError|SSLError|ConnectTimeoutError|ReadTimeoutError|ReadTimeout|ConnectTimeout"
        r"|RemoteDisconnected|IncompleteRead|ChunkedEncodingError|NewConnectionError)\s{2,}Traceback \(most recent call last\)",
        ("traceback (most recent call last)",),
        overrides=("app_error",),
    ),
    # Sacred's traceback header, which the engine does not read as one ("most recent calls WITHOUT ...").
    _sig("app_error", r"Traceback \(most recent calls WITHOUT Sacred internals\)", ("without sacred internals",)),
    # A builtin exception quoted alone, at the start of its line (an excerpt that kept only the last line of the
    # traceback, in backticks or not); more specific categories win on precedence.
    _sig(
        "app_error",
        r"^[`'\"]?(?:[a-z_][\w.]*\.)?(?:RuntimeError|ValueError|TypeError|IndexError|KeyError|AttributeError"
        r"|NotImplementedError|ZeroDivisionError|ModuleNotFoundError|ImportError|NameError|UnboundLocalError"
        r"|RecursionError): \S(?!.*(?:[Rr]etry|[Rr]etrying|[Ss]kipping|[Ii]gnor))",
        (
            "runtimeerror: ",
            "valueerror: ",
            "typeerror: ",
            "indexerror: ",
            "keyerror: ",
            "attributeerror: ",
            "notimplementederror: ",
            "zerodivisionerror: ",
            "modulenotfounderror: ",
            "importerror: ",
            "nameerror: ",
            "unboundlocalerror: ",
            "recursionerror: ",
        ),
        role=ROLE_BARE_EXCEPTION,
    ),
    # Hydra's line after an exception escaped the task (the traceback is shown only with HYDRA_FULL_ERROR=1).
    _sig("app_error", r"HYDRA_FULL_ER+O+R=1 for a complete stack trace", ("for a complete stack trace",)),
)

_WORD_NEEDLES = ("nan", "inf")  # whole words only in the prefilter


# One pass rejects a healthy line: an Aho-Corasick automaton (a DFA, ahocorasick_rs) over the union of
# every signature's needles, 0.8 us a line where one regex alternation of them took 7.8 us (sre tries
# the alternation at every position) and pyahocorasick's iterator 2-2.5 us (the benchmark's lines,
# benchmarks/diagnosis_throughput.py). "nan" and "inf" stay out of it: "inf" is in every "INFO" and
# "inference". They are found as whole words by a regex each, behind a substring test (both in C).
_NEEDLES = sorted({needle for sig in SIGNATURES for needle in sig.needles if needle not in _WORD_NEEDLES})
# Substrings (lower case) by which the engine reads a line's structure: traceback frames, headers and chains,
# torch.multiprocessing's and torchelastic's reports. In the same automaton, so that a line holding none of them and
# no signature's needle is done with after this one pass (engine.Diagnoser; NCCL's lines it tests for itself).
STRUCTURE_NEEDLES = (
    'file "',
    "(most recent call last)",
    "-- process ",
    "root cause (first observed failure):",
    "failures:",
    "above exception",
)
_NEEDLES += [needle for needle in STRUCTURE_NEEDLES if needle not in _NEEDLES]
# needle index -> the positions in SIGNATURES of the signatures that name it (none for a structure needle)
_SIGNATURES_OF = tuple(tuple(i for i, sig in enumerate(SIGNATURES) if needle in sig.needles) for needle in _NEEDLES)
find_needles = ahocorasick_rs.AhoCorasick(
    _NEEDLES, implementation=ahocorasick_rs.Implementation.DFA
).find_matches_as_indexes
SURROGATE = re.compile("[\ud800-\udfff]")
# The word, its whole-word regex (the literal first: sre scans for it in C), the signatures naming it.
NAN_WORD = re.compile(r"nan(?<![a-z]nan)(?![a-z])")
INF_WORD = re.compile(r"inf(?<![a-z]inf)(?![a-z])")
_NAN_AT = tuple(i for i, sig in enumerate(SIGNATURES) if "nan" in sig.needles)
_INF_AT = tuple(i for i, sig in enumerate(SIGNATURES) if "inf" in sig.needles)


def scan(lowered: str) -> Tuple[list, bool, bool]:
    """The automaton's hits in the lower-cased line (needle index, start, end), and whether it holds "inf" and
    "nan" as whole words. The engine runs the same steps inline (a call a line is worth avoiding there)."""
    try:
        hits = find_needles(lowered, overlapping=True)
    except UnicodeEncodeError:  # a lone surrogate (bytes decoded with surrogateescape): no needle holds one
        hits = find_needles(SURROGATE.sub("\ufffd", lowered), overlapping=True)
    # "info" and "nano..." hold the word but never as a whole one. For "inf" the whole-word regex alone is cheaper
    # than counting "inf" against "info" first (0.18 against 0.23 us a line: every INFO line holds one); for "nan"
    # only more of it than of "nano" (and of Megatron's "number of nan iterations", a counter's name with a needle
    # of its own) is worth a search.
    inf = "inf" in lowered and INF_WORD.search(lowered) is not None
    nan = (
        "nan" in lowered
        and lowered.count("nan") != lowered.count("nano") + lowered.count("nan iter")
        and NAN_WORD.search(lowered) is not None
    )
    return hits, inf, nan


def positions_of(hits: list, inf: bool, nan: bool) -> Sequence[int]:
    """The positions in SIGNATURES of the signatures that scan's result makes candidates, in order."""
    if len(hits) == 1 and not inf and not nan:
        return _SIGNATURES_OF[hits[0][0]]  # already in order (a structure needle's: none)
    found: set = set()
    for needle, _, _ in hits:
        found.update(_SIGNATURES_OF[needle])
    if inf:
        found.update(_INF_AT)
    if nan:
        found.update(_NAN_AT)
    return sorted(found)


def candidates(lowered: str) -> List[int]:
    """The positions in SIGNATURES of the signatures whose needles the lower-cased line holds, in order;
    [] when it holds none ("nan" and "inf" count as whole words only): the one pass of the automaton
    replaces a needle test per signature."""
    hits, inf, nan = scan(lowered)
    if not hits and not inf and not nan:
        return []  # the healthy majority: no set built
    return list(positions_of(hits, inf, nan))


# Lines that contain a needle but are known to be healthy: apex/fairseq loss scaling, NCCL's INFO
# chatter and its optional-plugin warnings.
BENIGN: Pattern[str] = re.compile(
    r"Gradient overflow\. +Skipping step(?!.*loss scale to \d(?:\.\d+)?e-)|reducing loss scale to (?!\d(?:\.\d+)?e-)"
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
    return [(category, weak) for category, weak, _ in match_roles(line)]


def match_roles(line: str) -> List[Tuple[str, bool, str]]:
    """Like match_line, with each match's role (ROLE_GENERIC, ROLE_PEER_GONE or "")."""
    return match_positions(line, candidates(line.lower()))


def match_positions(line: str, positions: Sequence[int]) -> List[Tuple[str, bool, str]]:
    """match_roles for the candidate signatures at `positions` (candidates' or positions_of's result)."""
    if not positions:
        return []
    if "NCCL INFO" in line and all(SIGNATURES[position].category in _SOFT for position in positions):
        return []  # BENIGN would clear whatever these match: NCCL's INFO chatter, without its regexes
    matches: List[Tuple[str, bool, str]] = []
    overridden: set = set()
    for position in positions:
        sig = SIGNATURES[position]
        found = sig.pattern.search(line)
        if found is None or (sig.check is not None and not sig.check(found)):
            continue
        if sig.needles == ("nvrm: xid",):
            decided = xid_category(line)
            if decided is not None:
                matches.append(decided + ("",))
            continue
        matches.append((sig.category, sig.weak, sig.role))
        overridden.update(sig.overrides)
    if overridden:
        matches = [match for match in matches if match[0] not in overridden]
    if matches and all(category in _SOFT for category, _, _ in matches) and BENIGN.search(line):
        return []
    return matches


# Categories whose needles are common words; a line matching only these is checked against BENIGN.
_SOFT = {"nan_inf", "nccl_timeout", "nccl_network", "nccl_remote"}
