"""The knowledge base: every failure category with its title, severity, likely cause and remedy.

Written from the troubleshooting chapter's tables (CUDA errors, OOM priorities, NCCL errors and debug
variables, deadlocks, numerical stability, storage) and extended with what public issue reports show
(pytorch/pytorch, NVIDIA/nccl, torchelastic launcher output, kernel and NVRM messages).
"""

from __future__ import annotations

from typing import Dict

from opsconsole.diagnosis.finding import SEVERITY_CRITICAL, SEVERITY_ERROR, SEVERITY_WARNING, Category, Severity


def _category(id: str, title: str, severity: Severity, cause: str, remedy: str) -> Category:
    return Category(id=id, title=title, severity=severity, cause=cause, remedy=remedy)


_ENTRIES = (
    _category(
        "cuda_oom",
        "CUDA out of memory",
        SEVERITY_CRITICAL,
        "The GPU ran out of memory: the batch, activations, optimizer state or a leak (tensors kept alive "
        "across steps, e.g. accumulating loss without .item()) need more than the device has; fragmentation "
        "can leave reserved-but-unallocated memory unusable.",
        "Reduce the batch size (keep the effective batch with gradient accumulation); enable gradient "
        "checkpointing; train in mixed precision (FP16/BF16); shard with FSDP/ZeRO; quantize (INT8/INT4) or "
        "offload to CPU; call torch.cuda.empty_cache() after freeing; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; check for leaks with "
        "torch.cuda.memory_summary() and nvidia-smi --query-compute-apps (another process may hold memory).",
    ),
    _category(
        "cuda_device_assert",
        "CUDA device-side assert triggered",
        SEVERITY_CRITICAL,
        "A kernel assertion failed on the GPU, most often an index out of range: class labels outside "
        "[0, num_classes) for a loss, embedding ids beyond the vocabulary, or a bad argument to an op.",
        "Check the data's label range and embedding indices against the model's sizes; rerun with "
        "CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA) to get the failing op in the stack, or on CPU for a "
        "readable error; the CUDA context is unusable afterwards, so restart the process.",
    ),
    _category(
        "cuda_illegal_memory",
        "CUDA illegal memory access",
        SEVERITY_CRITICAL,
        "A kernel read or wrote out of bounds (a bug in a custom/extension kernel, a wrong stride or shape, "
        "a race), or faulty GPU memory; NCCL's watchdog often reports it as the collective's failure.",
        "Check custom kernel code and tensor shapes; run with CUDA_LAUNCH_BLOCKING=1 and under "
        "compute-sanitizer (cuda-memcheck) to find the access; try disabling fused/custom kernels; if it "
        "recurs on one GPU only, check dmesg for Xid errors and ECC counters.",
    ),
    _category(
        "cuda_invalid_device",
        "CUDA invalid device ordinal",
        SEVERITY_ERROR,
        "The program asked for a GPU id that does not exist in this process: LOCAL_RANK or --nproc_per_node "
        "larger than the GPUs visible, or CUDA_VISIBLE_DEVICES restricting the set.",
        "Check CUDA_VISIBLE_DEVICES and nvidia-smi -L; make --nproc_per_node match the GPUs per node; use "
        "torch.cuda.set_device(local_rank) with the local (not global) rank.",
    ),
    _category(
        "cuda_peer_access",
        "CUDA peer-to-peer access unsupported",
        SEVERITY_ERROR,
        "Direct GPU-to-GPU (P2P) access is not supported or not enabled between these GPUs (topology across "
        "PCIe root complexes, IOMMU/ACS settings, virtualisation).",
        "Check the GPU topology with nvidia-smi topo -m; disable P2P (NCCL_P2P_DISABLE=1) to fall back to "
        "shared memory; check IOMMU/ACS settings in the BIOS or kernel.",
    ),
    _category(
        "cuda_driver",
        "CUDA driver/runtime problem",
        SEVERITY_CRITICAL,
        "CUDA could not initialise: the NVIDIA driver is older than the CUDA runtime the framework was built "
        "with, no CUDA device is visible, the GPU is in Exclusive_Process mode and taken, or the driver/device "
        "is in a bad state (after a driver upgrade without reboot NVML reports a Driver/library version "
        "mismatch and CUDA Error 804).",
        "Compare nvidia-smi's driver/CUDA version with nvcc --version (or /usr/local/cuda/version.txt) and "
        "torch.version.cuda; install a "
        "matching driver or a PyTorch build for the installed CUDA; check CUDA_VISIBLE_DEVICES and that "
        "/dev/nvidia* exist in the container; after a driver upgrade reboot (or reload the nvidia modules); "
        "check nvidia-smi -q for Compute Mode; check dmesg for NVRM errors.",
    ),
    _category(
        "nccl_timeout",
        "NCCL collective timeout (watchdog)",
        SEVERITY_CRITICAL,
        "A collective did not complete within the process group timeout: some rank never reached it "
        "(deadlock from conditional collectives or barriers on some ranks only, a rank stuck or much "
        "slower, e.g. on data loading or checkpoint saving), or the network stalled.",
        "Look at the other ranks' logs for the first error; set NCCL_DEBUG=INFO and "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL; make sure every rank calls the same collectives in the same order; "
        "py-spy dump --pid (or strace -p PID -e trace=network) on stuck ranks; raise the timeout (init_process_group(timeout=...)) only for "
        "legitimately long steps such as saving.",
    ),
    _category(
        "nccl_network",
        "NCCL network/system error",
        SEVERITY_CRITICAL,
        "NCCL's network transport failed: a peer is unreachable (network call failed), a socket or "
        "InfiniBand error (completion with error status, RDMA link down; status=12 is the transport retry "
        "counter exceeded: a flapping link or congestion), the wrong interface chosen, or a system "
        "call/resource failure (a too small /dev/shm in containers too).",
        "Check connectivity (ping, nc -zv host 29500), ibstat / ibv_devinfo for IB ports; set "
        "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=ALL; pin the interface with NCCL_SOCKET_IFNAME=eth0 and the HCA "
        "with NCCL_IB_HCA=mlx5_0; for IB completion errors check the port counters (perfquery) and raise "
        "NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT; try NCCL_IB_DISABLE=1 to use TCP; for peer receive failures check the NVLink "
        "(nvidia-smi nvlink --status) and IB links; check switch/link errors.",
    ),
    _category(
        "nccl_remote",
        "A peer rank failed (remote error)",
        SEVERITY_ERROR,
        "Another process of the job exited or detached (remote process exited, connection closed by peer, "
        "the elastic launcher reports a failed child): this rank's error is a consequence, the cause is in "
        "the failing rank's log.",
        "Find the failing rank: the one whose log has an error other than a lost connection, or that the "
        "launcher's failure table lists with a signal (SIGSEGV, SIGABRT, SIGKILL) or an exit code other than 1 "
        "(torchelastic's 'Root Cause (first observed failure)' is the first exit it noticed, often a peer that "
        "only lost its connection); read its log; check that node for OOM kills (dmesg), Xid errors and CUDA "
        "errors, and for a crash signal a core dump or a rerun with PYTHONFAULTHANDLER=1.",
    ),
    _category(
        "nccl_unhandled_cuda",
        "NCCL unhandled CUDA error",
        SEVERITY_CRITICAL,
        "A CUDA call inside NCCL failed: an earlier CUDA error (OOM, illegal access, a bad device) or a "
        "driver/peer-memory problem surfaced in the communicator.",
        "Solve the CUDA error first: look above for the underlying CUDA failure; run with NCCL_DEBUG=INFO to "
        "see the failing CUDA call; check GPU health (nvidia-smi, dmesg Xid).",
    ),
    _category(
        "nan_inf",
        "NaN/Inf in loss or gradients",
        SEVERITY_ERROR,
        "Numerical instability: exploding gradients, a learning rate too high, FP16 overflow without proper "
        "loss scaling, a bad data sample, or a division by zero/log of zero. (A NaN/Inf gradient norm alone, "
        "on steps an fp16 loss scaler skips, is normal and not reported.)",
        "Clip gradients (clip_grad_norm_), lower the learning rate or add warmup; use BF16 or a GradScaler "
        "for FP16; check the data for bad values; enable torch.autograd.set_detect_anomaly(True) to find "
        "the op; skip batches whose loss is not finite.",
    ),
    _category(
        "disk_full",
        "Disk full (no space left on device)",
        SEVERITY_CRITICAL,
        "The file system for checkpoints, logs, caches or /dev/shm ran out of space or quota; a checkpoint "
        "write is then left incomplete.",
        "Free space (df -h; delete old checkpoints, keep only the newest few), move checkpoints to larger "
        "storage, check quotas; verify the last checkpoint is complete before resuming.",
    ),
    _category(
        "io_error",
        "I/O error",
        SEVERITY_ERROR,
        "Reading or writing storage failed: an input/output error from the device, a stale NFS handle, "
        "a lost network file system, permission denied or a missing path.",
        "Check the storage (dmesg for disk/NFS errors, mount, nfsstat -c, iostat -x 1, a dd or fio test); check paths and "
        "permissions; re-mount or move to healthy storage; retry reads of transient network file systems.",
    ),
    _category(
        "checkpoint_corrupt",
        "Checkpoint corrupt or truncated",
        SEVERITY_ERROR,
        "A checkpoint file is incomplete or damaged (the job died while saving, the disk filled up, an "
        "interrupted copy or download), so torch.load cannot read it.",
        "Load an earlier checkpoint; write checkpoints to a temporary name and rename when complete; keep "
        "several and verify them (size, checksum, a test load) after saving; check free space.",
    ),
    _category(
        "data_corrupt",
        "Corrupt data record",
        SEVERITY_ERROR,
        "A training sample cannot be decoded: a truncated or damaged image, malformed JSON/JSON lines, a "
        "broken Arrow/Parquet shard.",
        "Find the file named in the error and verify the data set (md5 checksums against the expected ones, "
        "a json.load / image decode pass over every file); re-download or drop the bad records; make the Dataset skip or log undecodable samples.",
    ),
    _category(
        "dataloader_worker",
        "DataLoader worker failed",
        SEVERITY_ERROR,
        "A DataLoader worker process was killed or exited: out of shared memory (/dev/shm too small, Bus "
        "error), killed by the OOM killer, or an exception/segfault in the Dataset code.",
        "Raise the shared memory limit (docker gives 64 MB by default: --shm-size / --ipc=host, or a larger "
        "/dev/shm); reduce "
        "num_workers or prefetch_factor; check dmesg for OOM kills; run with num_workers=0 to see the "
        "Dataset's own exception.",
    ),
    _category(
        "host_oom",
        "Host out of memory (OOM killer)",
        SEVERITY_CRITICAL,
        "The kernel's OOM killer ended a process because the host ran out of RAM (exit code -9 / SIGKILL): "
        "too many DataLoader workers, loading a whole model or data set into memory per rank, a memory leak.",
        "Check dmesg / journalctl -k for 'Out of memory: Killed process'; reduce num_workers and per-rank "
        "copies (load checkpoints with mmap=True or on one rank), use memory-mapped data sets; watch host "
        "memory; ask the scheduler for more memory.",
    ),
    _category(
        "app_error",
        "Python exception in the training code",
        SEVERITY_ERROR,
        "The failing rank raised an exception of its own that no more specific category explains: a bug "
        "in the training, model or data code, a shape, dtype or index mismatch, a bad configuration value. "
        "Its peers' errors after it (lost connections, timeouts, a launcher's failed-child report) are "
        "consequences.",
        "Read the exception and the innermost frame of your own code in that rank's traceback; reproduce "
        "on one process (world size 1, num_workers=0, on CPU for readable errors) with the same input; "
        "wrap the entry point with torch.distributed.elastic.multiprocessing.errors.record so the "
        "launcher reports the traceback.",
    ),
    _category(
        "gpu_hardware",
        "GPU hardware fault (Xid / ECC / fell off the bus)",
        SEVERITY_CRITICAL,
        "The GPU or its link failed: an NVRM Xid error (79: fallen off the bus, 48/63/64/94/95: ECC, "
        "74: NVLink, 119/120: GSP firmware timeouts), an uncorrectable ECC error or the GPU lost to the "
        "system.",
        "Drain the node; check nvidia-smi -q (ECC, retired pages, remapping), dmesg for the Xid code; "
        "reset the GPU (nvidia-smi --gpu-reset -i N) or reboot after the job is gone; check power, cooling "
        "and seating; RMA if it recurs.",
    ),
)

CATEGORIES: Dict[str, Category] = {entry.id: entry for entry in _ENTRIES}

# A rank that failed of its own (the launcher's table: a crash signal, an exit code, a kill) with no lost
# connection of its own: the peers' lost connections are its consequences. The verdict's title says which.
CATEGORIES["rank_crashed"] = _category(
    "rank_crashed",
    "A rank crashed or exited of its own",
    SEVERITY_CRITICAL,
    "The launcher's failure table lists a rank that ended of its own (a crash signal, an exit code, a kill) "
    "and reported no lost connection itself: the other ranks' lost connections are consequences.",
    "Read that rank's own log for why it ended.",
)
# The children the launcher stopped after one failed (its "Sending process PID closing signal SIGTERM", their table
# rows with -15), whose own output lost no peer: consequences of the crash, never a root cause. Not in CATEGORIES
# (what a line is read as): only the verdict's attribution (engine.attributed, the summary's rows) gives it.
STOPPED_CATEGORY = _category(
    "rank_stopped",
    "Stopped by the launcher after another rank failed",
    SEVERITY_WARNING,
    "Once a child fails, torchelastic stops the others: it sends them a closing signal ('Sending process PID "
    "closing signal SIGTERM') and lists them in its failure table with exit code -15 (SIGTERM). These ranks did not "
    "fail and lost no peer in their own output: they were stopped, a consequence of the failure the root cause names.",
    "Read the failed rank's own log first (the root cause's row). If its exception was a collective's timeout, the "
    "rank it waited for is among these: a rank stuck outside the collective is stopped by the launcher, not failed "
    "(py-spy dump --pid on it shows where it is stuck).",
)
RANK_CRASH_REMEDIES = {
    "crash": "A crash in native code: get its core dump (ulimit -c unlimited; coredumpctl list) or rerun with "
    "PYTHONFAULTHANDLER=1 (faulthandler prints every thread's Python stack) and TORCH_SHOW_CPP_STACKTRACES=1; "
    "suspect native extensions (custom CUDA/C++ ops, compiled kernels), library versions that do not match "
    "the torch build, and the driver (dmesg for NVRM/Xid lines on that node).",
    "exit": "The rank exited with that code itself, without a traceback: read that rank's own log (its last "
    "lines) for why it exited (sys.exit, os._exit, a script's own check), and grep its code for the exit call.",
    "exit1": "Read that rank's own output for its traceback (the job's stderr, or torchrun's --log-dir "
    "attempt_N/RANK/stderr.log); to keep it next time, run torchrun with --tee 3 or --log-dir DIR --redirects 3, or "
    "wrap the entry point with torch.distributed.elastic.multiprocessing.errors.record so the launcher's table "
    "shows it. If the exception was a collective's timeout (gloo's 'Timed out waiting ... for recv operation', a "
    "process group's watchdog), the rank it waited for is among those the launcher stopped after it.",
    "SIGTERM": "Someone sent it SIGTERM from outside the launcher: the scheduler (a time limit, preemption, "
    "scancel; sacct -j JOB -o JobID,State,Elapsed,Timelimit and the scheduler's log say which), an operator's "
    "kill, or a node health check; handle SIGTERM to save a checkpoint before the time limit.",
    "SIGKILL": "Find who sent the SIGKILL. The kernel's OOM killer: dmesg -T | grep -i -e 'out of memory' -e "
    "oom-kill on that node (or journalctl -k) shows 'Out of memory: Killed process PID'; a kill inside a job's or "
    "container's cgroup is counted in its memory.events (oom_kill N; cgroup v2 /sys/fs/cgroup/<path>/memory.events, "
    "v1 memory.oom_control's oom_kill, the path from /proc/PID/cgroup of a process of the job); in Kubernetes the "
    "pod's state says OOMKilled. A scheduler's time or memory limit: sacct -j JOB -o JobID,State,Elapsed,Timelimit,"
    "ReqMem,MaxRSS (TIMEOUT, OUT_OF_MEMORY) and the scheduler's log. A user's or a health check's kill -9: the "
    "node's auth and audit logs. If it was the OOM killer: reduce num_workers and per-rank copies (load "
    "checkpoints with mmap=True or on one rank), use memory-mapped data sets, ask the scheduler for more memory.",
    "signal": "It was ended by that signal: find who sent it (the scheduler's log, dmesg on that node), and "
    "read the rank's own log up to the end.",
}
RANK_CRASH_SIGNALS = frozenset(("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"))


def rank_crash_text(rank: object, exitcode: object, signal: object) -> tuple:
    """(title, remedy) for a rank that ended of its own: crashed (a fault signal), exited N, killed by S."""
    who = "Rank %s" % rank if rank is not None else "A process"
    if signal in RANK_CRASH_SIGNALS:
        return "%s crashed (signal %s)" % (who, signal), RANK_CRASH_REMEDIES["crash"]
    if signal:
        kind = signal if signal in ("SIGTERM", "SIGKILL") else "signal"
        return "%s was killed by signal %s" % (who, signal), RANK_CRASH_REMEDIES[kind]
    if isinstance(exitcode, int) and exitcode < 0:
        return "%s was killed by signal %d" % (who, -exitcode), RANK_CRASH_REMEDIES["signal"]
    return "%s exited with code %s" % (who, exitcode), RANK_CRASH_REMEDIES["exit1" if exitcode == 1 else "exit"]


# A gloo collective timeout ("Timed out waiting 5000ms for recv operation", gloo's enforce fail): the same
# story as NCCL's watchdog, without NCCL's variables.
GLOO_TIMEOUT_TITLE = "gloo collective timeout"
GLOO_TIMEOUT_CAUSE = (
    "A gloo collective (or send/recv) did not complete within the process group timeout: some rank never "
    "reached it (a conditional collective or barrier on some ranks only, a rank stuck or much slower, e.g. on "
    "data loading or checkpoint saving), or the connection between the ranks stalled."
)
GLOO_TIMEOUT_REMEDY = (
    "Find the rank the others waited for: the one that did not time out itself (the launcher stops it "
    "afterwards); py-spy dump --pid on it shows where it is stuck; run with TORCH_DISTRIBUTED_DEBUG=DETAIL to "
    "compare each rank's collectives; make sure every rank calls the same collectives in the same order; "
    "pin gloo's interface with GLOO_SOCKET_IFNAME if the ranks cannot reach each other; raise the timeout "
    "(init_process_group(timeout=...)) only for legitimately long steps such as saving."
)

# gloo's lost connection ("[.../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer", "Read
# error ...: Connection reset by peer"): the peer-lost category (id nccl_remote, kept: JSON, alert rules
# "finding.nccl_remote" and recordings name it) in gloo's words, not NCCL's.
GLOO_PEER_LOST_TITLE = "A peer rank failed (gloo connection lost)"
GLOO_PEER_LOST_CAUSE = (
    "gloo's connection to another rank of the job was closed or reset (gloo's transport, not NCCL): that process "
    "exited, crashed or was killed, or stopped after its own failure; this rank's error is a consequence, the "
    "cause is in the failing rank's log."
)

# A process killed by SIGKILL with no OOM-killer line in the logs: the OOM killer is one sender, not the only one.
SIGKILL_TITLE = "Killed by SIGKILL (no OOM-killer line seen)"
SIGKILL_CAUSE = (
    "The process was killed by SIGKILL (exit code -9, or 137 from a shell) and no line of the kernel's OOM killer "
    "is in these logs: the OOM killer sends SIGKILL when the host or the job's cgroup runs out of memory, and so "
    "do a scheduler enforcing a time or memory limit and a user's kill -9. Its peers' errors after it are "
    "consequences."
)
HOST_OOM_SEEN_CAUSE = CATEGORIES["host_oom"].cause + " The OOM killer's own report was seen in the logs."

# A refused allocation is raised in the process (Python, NumPy, C++, PyTorch's CPU allocator): no one killed
# it, so there is no OOM-killer line to look for; the size it asked for is the first thing to check.
HOST_ALLOCATION_REFUSED_TITLE = "Host memory allocation refused"
HOST_ALLOCATION_REFUSED_CAUSE = (
    "A host (CPU) memory allocation was refused inside the process, which raised instead of being killed "
    "(Python's MemoryError, NumPy's 'Unable to allocate', C++ std::bad_alloc, PyTorch's DefaultCPUAllocator): "
    "the host or the job's memory limit (cgroup, ulimit -v) had no room for it, or the size asked for was "
    "absurd (a wrong shape, a whole data set loaded at once)."
)
HOST_ALLOCATION_REFUSED_REMEDY = (
    "Check the size the failing line asked for (the shape or file behind it) and the limits: ulimit -v, the "
    "job's memory request (sacct -j JOB -o ReqMem,MaxRSS), free -g on the node. Then: reduce num_workers and "
    "per-rank copies (load checkpoints with mmap=True or on one rank), use memory-mapped data sets; ask the "
    "scheduler for more memory."
)

# A path that does not exist is most often the job's own (a config value, the working directory, a data set
# not copied to that node) before it is the storage's: those checks first.
MISSING_PATH_REMEDY = (
    "A path does not exist where that rank looked: check the path in the configuration and arguments, the "
    "working directory the launcher started the rank in (relative paths), that the file was written or copied "
    "to that node (node-local disks) and that the shared file system is mounted there (ls the path on that node)."
)

COLLECTIVE_MISMATCH_REMEDY = (
    "The ranks called different collectives, or the same collective with different tensor sizes or dtypes "
    "(a rank-dependent shape, a branch or a loop only some ranks take, an uneven last batch): it does not "
    "reproduce on one process. Run with TORCH_DISTRIBUTED_DEBUG=DETAIL to have each rank's collective and "
    "shapes compared, and make every rank pass the same shapes in the same order."
)

# An index out of range on the CPU is what a device-side assert is on the GPU: the same checks.
INDEX_ERROR_REMEDY = (
    "An index was out of range: check the data's label range against the number of classes "
    "([0, num_classes) for the loss) and token/embedding ids against the vocabulary (nn.Embedding's "
    "num_embeddings), and the shapes and lengths the indices were computed from; print the min/max of "
    "the offending batch's indices."
)

STALL_CATEGORY = _category(
    "stall",
    "Possible hang: logs stopped advancing",
    SEVERITY_WARNING,
    "The run's logs have not advanced while its processes are alive and its GPUs idle: a deadlock (a "
    "collective or barrier reached by some ranks only, mismatched send/recv), a stuck data loader or I/O.",
    "S in the console (headless: opsconsole stacks) dumps every rank's stack and names the odd one out "
    "(the same as py-spy dump --pid <pid> on every rank); strace -p <pid> -e trace=network; "
    "set NCCL_DEBUG=INFO to see the last collective; check the other ranks' logs; make sure every rank "
    "calls the same collectives; set a process group timeout so a hang becomes an error.",
)

STRAGGLER_CATEGORY = _category(
    "straggler",
    "Straggler rank",
    SEVERITY_WARNING,
    "One rank's log lags the others: a slower GPU (throttling, a sick GPU), a slower node or link, or "
    "data loading/storage slower on that node; the others wait for it at every collective.",
    "Compare that node's GPU clocks, temperature and utilisation with the others; check its data loading "
    "and storage (iostat); py-spy dump the lagging rank; consider draining the node.",
)
