"""The probe's health mode: an on-node GPU sanity suite with torch, in the spirit of `dcgmi diag -r 1/2`.

`python -m opsconsole.probe.health_mode --json` (or the probe bundle started through
opsconsole.health.remote) prints one JSON object per line, each a HealthResult in its
wire form (check, node, status, message, gpu, evidence, remedy, time, duration_s).

Per GPU, in one thread per GPU (torch releases the GIL inside CUDA calls): CUDA init; an
fp64 matmul against a CPU reference computed once (relative error bound); a bf16 GEMM
repeated and compared bit for bit; a memory pattern write and verify over a share of free
memory; device-to-device copy bandwidth; a NaN/Inf check. On nodes with several GPUs, one
NCCL all-reduce across them (torch.cuda.nccl, single process) with its result and bus
bandwidth. A GPU with running compute processes is refused (it would disturb the job)
unless --force. Without torch or CUDA every check reports `error` with the reason.

Stdlib only at import time; torch and pynvml are imported inside functions. Python 3.6+.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from opsconsole.probe import nvidia_driver

PASS, WARN, FAIL, ERROR, SKIP = "pass", "warn", "fail", "error", "skip"
PREFIX = "gpu_sanity."
EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

# Sizes per level: level 1 is the quick one (seconds), level 2 a longer soak.
LEVELS = {
    1: {"fp64_n": 1024, "bf16_n": 4096, "bf16_repeats": 20, "copy_mib": 1024, "copy_repeats": 10, "nccl_mib": 256},
    2: {"fp64_n": 4096, "bf16_n": 8192, "bf16_repeats": 100, "copy_mib": 4096, "copy_repeats": 20, "nccl_mib": 1024},
}
FP64_RELATIVE_BOUND = 1e-12  # fp64 with another summation order differs by ~1e-15 * sqrt(n)
MIN_COPY_GBPS = 50.0  # far below any datacenter GPU's HBM: lower means a broken or throttled GPU
BUSY_MEMORY_BYTES = 2 << 30  # memory in use with no listed process: a job we cannot see (another container)
CHUNK_BYTES = 1 << 30  # the pattern test allocates in chunks, so fragmented memory still fits
PATTERNS = (0x5555555555555555, -0x5555555555555556, 0)  # 0101..., 1010..., then address-derived

REMEDY_INIT = "check the driver (nvidia-smi), dmesg for XIDs, and that torch's CUDA matches the driver"
REMEDY_COMPUTE = "wrong arithmetic results: drain the node and run `dcgmi diag -r 3`; replace the GPU if it repeats"
REMEDY_MEMORY = "GPU memory returned other data than written: drain the node, check ECC and remapped rows, RMA"
REMEDY_COPY = "memory bandwidth far too low: check clocks and clock-event reasons (throttling), power and cooling"
REMEDY_NCCL = "check NVLink (nvidia-smi nvlink -s), the topology (nvidia-smi topo -m) and NCCL_DEBUG=INFO output"
REMEDY_BUSY = "the GPU runs a job: rerun when it is free, or pass --force to test it anyway (disturbs the job)"


def result(
    check: str,
    node: str,
    status: str,
    message: str,
    gpu: Optional[int] = None,
    evidence: Sequence[Tuple[str, str]] = (),
    remedy: str = "",
    duration_s: Optional[float] = None,
) -> Dict[str, Any]:
    """One result in HealthResult's wire form."""
    return {
        "check": PREFIX + check,
        "node": node,
        "status": status,
        "message": message,
        "gpu": gpu,
        "evidence": [[str(k), str(v)] for k, v in evidence],
        "remedy": remedy,
        "time": time.time(),
        "duration_s": None if duration_s is None else round(duration_s, 4),
    }


# --- comparisons (pure; torch on any device, tested on CPU) ----------------------------


def relative_error(value: Any, reference: Any) -> float:
    """Frobenius-norm relative error of `value` against `reference` (both fp64 tensors)."""
    import torch

    denominator = torch.linalg.norm(reference).item()
    difference = torch.linalg.norm(value.to(reference.device, reference.dtype) - reference).item()
    return difference / denominator if denominator else difference


def bitwise_mismatches(a: Any, b: Any) -> int:
    """Elements whose bits differ between two tensors of one shape and 2-byte dtype (NaN-safe)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError("shapes or dtypes differ: %s %s vs %s %s" % (tuple(a.shape), a.dtype, tuple(b.shape), b.dtype))
    view = torch.int16 if a.element_size() == 2 else torch.int32 if a.element_size() == 4 else torch.int64
    return int((a.view(view) != b.view(view)).sum().item())


def non_finite_count(tensor: Any) -> int:
    """NaN and Inf elements in a floating tensor."""
    import torch

    return int((~torch.isfinite(tensor)).sum().item())


def fill_pattern(buffer: Any, pattern: int, offset: int) -> None:
    """Fill an int64 buffer with `pattern`, or with its element addresses (offset + i) for pattern 0."""
    import torch

    if pattern == 0:
        torch.arange(offset, offset + buffer.numel(), dtype=torch.int64, device=buffer.device, out=buffer)
    else:
        buffer.fill_(pattern)


def pattern_mismatches(buffer: Any, pattern: int, offset: int) -> int:
    """Elements of an int64 buffer that differ from what fill_pattern wrote."""
    import torch

    if pattern == 0:
        expected = torch.arange(offset, offset + buffer.numel(), dtype=torch.int64, device=buffer.device)
        return int((buffer != expected).sum().item())
    return int((buffer != pattern).sum().item())


def bus_bandwidth_gbps(nbytes: int, seconds: float, ranks: int) -> Tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in GB/s of an all-reduce, as nccl-tests computes them."""
    if seconds <= 0 or ranks < 1:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2.0 * (ranks - 1) / ranks


# --- which GPUs are busy ---------------------------------------------------------------


def nvml_inventory() -> Tuple[Optional[List[Dict[str, Any]]], str]:
    """[{index, uuid, pids}] of every GPU by NVML (else nvidia-smi), or (None, why) when neither answers."""
    try:
        import pynvml  # lazily: not on every node

        pynvml.nvmlInit()
        try:
            out: List[Dict[str, Any]] = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
                used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                out.append({"index": index, "uuid": uuid, "pids": pids, "used_bytes": used})
            return out, "nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        nvml_error = "%s: %s" % (type(exc).__name__, exc)
        no_pynvml = isinstance(exc, ImportError)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        # Without pynvml (or NVML) and nvidia-smi, the driver's own traces tell "no GPU here" from "no tools".
        if nvidia_driver.driver_evidence() is None:
            return None, nvidia_driver.NO_DRIVER_DETAIL
        if no_pynvml:
            return None, "%s and nvidia-smi is missing" % nvidia_driver.without_pynvml(nvml_error)
        return None, "NVML failed (%s) and nvidia-smi is missing" % nvml_error
    try:
        gpus = subprocess.run(
            [smi, "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
        )
        apps = subprocess.run(
            [smi, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "nvidia-smi failed: %s" % exc
    if gpus.returncode != 0 or apps.returncode != 0:
        return None, "nvidia-smi failed: %s" % (gpus.stderr or apps.stderr).strip()[:200]
    out = []
    for line in gpus.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            used = int(float(parts[2]) * 2**20) if parts[2].replace(".", "", 1).isdigit() else 0
            out.append({"index": int(parts[0]), "uuid": parts[1], "pids": [], "used_bytes": used})
    by_uuid = {g["uuid"]: g for g in out}
    for line in apps.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1] in by_uuid:
            by_uuid[parts[1]]["pids"].append(int(parts[0]))
    return out, "nvidia-smi"


def nvidia_device_files(dev: str = "/dev") -> List[str]:
    """The NVIDIA GPU device files (/dev/nvidia0, ...): a node with a GPU has one per GPU."""
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    return sorted(name for name in names if name.startswith("nvidia") and name[len("nvidia") :].isdigit())


def no_gpu_reason(inventory: Optional[List[Dict[str, Any]]], source: str, device_files: Sequence[str]) -> str:
    """Why this node has no GPU to test, or "" when it may have one.

    No GPU at all (no NVIDIA device file, and NVML/nvidia-smi list none or cannot run) is a skip,
    not an error: there is nothing to test and no job to disturb. With a device file present but no
    listing, the GPUs exist and their processes are unknown: refusals() refuses them.
    """
    if inventory or device_files:
        return ""
    return source if inventory is None else "%s lists no GPU" % source


def refusals(
    inventory: Optional[List[Dict[str, Any]]],
    why: str,
    wanted: Optional[Sequence[int]],
    force: bool,
    node: str,
    own_pid: int,
) -> Tuple[Optional[List[int]], List[Dict[str, Any]]]:
    """(GPU indices to test, refusal results): a GPU running compute processes is refused unless forced.

    When the processes cannot be listed at all, every GPU is refused unless forced: the
    suite must not disturb a job it cannot see.
    """
    if inventory is None:
        if not force:
            return [], [
                result(
                    "refused",
                    node,
                    ERROR,
                    "cannot list compute processes (%s): not testing (--force to test)" % why,
                    None,
                    (("reason", why),),
                    REMEDY_BUSY,
                )
            ]
        return list(wanted) if wanted is not None else None, []  # None: every GPU torch sees
    indices = [g["index"] for g in inventory]
    chosen = [i for i in (wanted if wanted is not None else indices)]
    results = []
    testable = []
    by_index = {g["index"]: g for g in inventory}
    for index in chosen:
        gpu = by_index.get(index)
        if gpu is None:
            results.append(
                result(
                    "cuda_init",
                    node,
                    ERROR,
                    "GPU %d does not exist (GPUs: %s)" % (index, ",".join(map(str, indices)) or "none"),
                    index,
                )
            )
            continue
        others = [pid for pid in gpu["pids"] if pid != own_pid]
        used = gpu.get("used_bytes") or 0
        if not others and used > BUSY_MEMORY_BYTES and not force:
            # Processes of another container (PID namespace) are not listed, but their memory shows.
            results.append(
                result(
                    "refused",
                    node,
                    ERROR,
                    "GPU %d has %.1f GiB in use by processes not visible here: not tested" % (index, used / 2**30),
                    index,
                    (("used_gib", "%.1f" % (used / 2**30)),),
                    REMEDY_BUSY,
                )
            )
            continue
        if others and not force:
            results.append(
                result(
                    "refused",
                    node,
                    ERROR,
                    "GPU %d runs %d compute process(es) (pid %s): not tested"
                    % (index, len(others), ",".join(map(str, others[:5]))),
                    index,
                    (("pids", ",".join(map(str, others))),),
                    REMEDY_BUSY,
                )
            )
            continue
        testable.append(index)
    return testable, results


# --- the tests, per GPU ----------------------------------------------------------------


class GpuSuite:
    """The sanity tests of one GPU (torch device `device`, reported as NVML index `index`)."""

    def __init__(
        self,
        node: str,
        index: int,
        device: int,
        sizes: Dict[str, int],
        memory_share: float,
        fp64_inputs: Tuple[Any, Any, Any],
    ) -> None:
        self.node = node
        self.index = index
        self.device = device
        self.sizes = sizes
        self.memory_share = memory_share
        self.fp64_inputs = fp64_inputs
        self.results: List[Dict[str, Any]] = []
        self.outputs: List[Any] = []  # tensors the NaN/Inf check reads

    def add(
        self, check: str, status: str, message: str, evidence: Sequence[Tuple[str, str]], remedy: str, started: float
    ) -> None:
        self.results.append(
            result(check, self.node, status, message, self.index, evidence, remedy, time.perf_counter() - started)
        )

    def run(self) -> List[Dict[str, Any]]:
        import torch

        with torch.cuda.device(self.device):
            for name, test in (
                ("cuda_init", self.cuda_init),
                ("fp64_matmul", self.fp64_matmul),
                ("bf16_gemm", self.bf16_gemm),
                ("memory_pattern", self.memory_pattern),
                ("d2d_copy", self.d2d_copy),
                ("nan_inf", self.nan_inf),
            ):
                started = time.perf_counter()
                try:
                    test(started)
                except Exception as exc:  # one test failing to run never stops the others
                    self.add(
                        name,
                        ERROR,
                        "GPU %d: %s: %s"
                        % (self.index, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else ""),
                        (),
                        REMEDY_INIT,
                        started,
                    )
                    if name == "cuda_init":
                        break  # nothing else can run on this GPU
                torch.cuda.empty_cache()
        self.outputs = []
        return self.results

    def cuda_init(self, started: float) -> None:
        import torch

        x = torch.ones(1024, device="cuda")
        total = float(x.sum().item())
        torch.cuda.synchronize()
        props = torch.cuda.get_device_properties(self.device)
        free, total_mem = torch.cuda.mem_get_info()
        status = PASS if total == 1024.0 else FAIL
        self.add(
            "cuda_init",
            status,
            "GPU %d: %s, CUDA context up" % (self.index, props.name),
            (
                ("name", props.name),
                ("capability", "%d.%d" % (props.major, props.minor)),
                ("memory_free_gib", "%.1f" % (free / 2**30)),
                ("memory_total_gib", "%.1f" % (total_mem / 2**30)),
            ),
            REMEDY_INIT,
            started,
        )

    def fp64_matmul(self, started: float) -> None:
        import torch

        a, b, reference = self.fp64_inputs
        product = a.cuda() @ b.cuda()
        torch.cuda.synchronize()
        error = relative_error(product.cpu(), reference)
        self.outputs.append(product)
        status = PASS if error <= FP64_RELATIVE_BOUND else FAIL
        self.add(
            "fp64_matmul",
            status,
            "GPU %d: fp64 %dx%d matmul, relative error %.2e vs CPU (bound %.0e)"
            % (self.index, a.shape[0], a.shape[0], error, FP64_RELATIVE_BOUND),
            (("relative_error", "%.3e" % error), ("bound", "%.0e" % FP64_RELATIVE_BOUND), ("n", str(a.shape[0]))),
            REMEDY_COMPUTE,
            started,
        )

    def bf16_gemm(self, started: float) -> None:
        import torch

        n, repeats = self.sizes["bf16_n"], self.sizes["bf16_repeats"]
        generator = torch.Generator(device="cuda").manual_seed(1234 + self.index)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=generator)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=generator)
        first = a @ b
        out = torch.empty_like(first)
        torch.cuda.synchronize()
        mismatched_runs = 0
        worst = 0
        begin = time.perf_counter()
        for _ in range(repeats):
            torch.matmul(a, b, out=out)
            diff = bitwise_mismatches(first, out)  # syncs: each run is compared on its own
            if diff:
                mismatched_runs += 1
                worst = max(worst, diff)
        elapsed = time.perf_counter() - begin
        tflops = 2.0 * n**3 * repeats / elapsed / 1e12 if elapsed > 0 else 0.0
        self.outputs.append(first)
        status = PASS if mismatched_runs == 0 else FAIL
        message = (
            "GPU %d: bf16 %dx%d GEMM x%d bit-identical" % (self.index, n, n, repeats)
            if status == PASS
            else "GPU %d: bf16 GEMM differed in %d of %d runs (up to %d elements)"
            % (self.index, mismatched_runs, repeats, worst)
        )
        self.add(
            "bf16_gemm",
            status,
            message,
            (
                ("repeats", str(repeats)),
                ("mismatched_runs", str(mismatched_runs)),
                ("tflops_with_compare", "%.1f" % tflops),
            ),
            REMEDY_COMPUTE,
            started,
        )

    def memory_pattern(self, started: float) -> None:
        import torch

        free, _ = torch.cuda.mem_get_info()
        target = int(free * self.memory_share)
        chunks = []
        allocated = 0
        while allocated + 8 <= target:
            size = min(CHUNK_BYTES, target - allocated) // 8
            try:
                chunks.append(torch.empty(size, dtype=torch.int64, device="cuda"))
            except RuntimeError:  # out of memory: test what we have
                break
            allocated += size * 8
        bad = 0
        for pattern in PATTERNS:
            offset = 0
            for chunk in chunks:
                fill_pattern(chunk, pattern, offset)
                offset += chunk.numel()
            offset = 0
            for chunk in chunks:
                bad += pattern_mismatches(chunk, pattern, offset)
                offset += chunk.numel()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        del chunks
        gib = allocated / 2**30
        status = PASS if bad == 0 and allocated > 0 else FAIL if bad else ERROR
        message = (
            "GPU %d: %.1f GiB written and verified with %d patterns" % (self.index, gib, len(PATTERNS))
            if status == PASS
            else (
                "GPU %d: %d words differed from the pattern written" % (self.index, bad)
                if bad
                else "GPU %d: no memory could be allocated" % self.index
            )
        )
        self.add(
            "memory_pattern",
            status,
            message,
            (
                ("tested_gib", "%.2f" % gib),
                ("share_of_free", "%g" % self.memory_share),
                ("mismatched_words", str(bad)),
                ("gib_per_s", "%.0f" % (gib * len(PATTERNS) * 2 / elapsed if elapsed > 0 else 0.0)),
            ),
            REMEDY_MEMORY,
            started,
        )

    def d2d_copy(self, started: float) -> None:
        import torch

        nbytes = self.sizes["copy_mib"] << 20
        repeats = self.sizes["copy_repeats"]
        src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(repeats):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = begin.elapsed_time(end) / 1000.0
        gbps = nbytes * repeats / seconds / 1e9 if seconds > 0 else 0.0
        same = bool(torch.equal(src, dst))
        status = FAIL if not same else WARN if gbps < MIN_COPY_GBPS else PASS
        message = "GPU %d: device-to-device copy %.0f GB/s (read+write %.0f GB/s)" % (self.index, gbps, 2 * gbps)
        if not same:
            message = "GPU %d: the copy differs from its source" % self.index
        self.add(
            "d2d_copy",
            status,
            message,
            (
                ("copy_gbps", "%.1f" % gbps),
                ("read_write_gbps", "%.1f" % (2 * gbps)),
                ("bytes", str(nbytes)),
                ("repeats", str(repeats)),
                ("identical", str(same)),
            ),
            REMEDY_COPY,
            started,
        )

    def nan_inf(self, started: float) -> None:
        import torch

        generator = torch.Generator(device="cuda").manual_seed(99 + self.index)
        sample = torch.randn(1 << 22, device="cuda", generator=generator)
        tensors = list(self.outputs) + [sample, torch.exp(sample.clamp(-20, 20))]
        bad = sum(non_finite_count(t.float()) for t in tensors)
        elements = sum(t.numel() for t in tensors)
        status = PASS if bad == 0 else FAIL
        message = (
            "GPU %d: no NaN/Inf in %d results" % (self.index, elements)
            if status == PASS
            else "GPU %d: %d NaN/Inf in results of finite inputs" % (self.index, bad)
        )
        self.add(
            "nan_inf", status, message, (("elements", str(elements)), ("non_finite", str(bad))), REMEDY_COMPUTE, started
        )


def nccl_allreduce(node: str, devices: Sequence[Tuple[int, int]], mib: int) -> Dict[str, Any]:
    """One all-reduce (sum) over several GPUs in this process: checks the sum, reports bus bandwidth."""
    import torch
    import torch.cuda.nccl as nccl

    started = time.perf_counter()
    ranks = len(devices)
    count = (mib << 20) // 4
    tensors = []
    for rank, (_, device) in enumerate(devices):
        tensors.append(torch.full((count,), float(rank + 1), dtype=torch.float32, device="cuda:%d" % device))
    nccl.all_reduce(tensors)  # warm-up: also builds the communicator
    for rank, tensor in enumerate(tensors):
        tensor.fill_(float(rank + 1))
    for _, device in devices:
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    nccl.all_reduce(tensors)
    for _, device in devices:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - begin
    expected = ranks * (ranks + 1) / 2.0
    wrong = sum(int((t != expected).sum().item()) for t in tensors)
    algbw, busbw = bus_bandwidth_gbps(count * 4, seconds, ranks)
    status = PASS if wrong == 0 else FAIL
    indices = ",".join(str(index) for index, _ in devices)
    message = (
        "GPUs %s: NCCL all-reduce of %d MiB correct, bus bandwidth %.0f GB/s" % (indices, mib, busbw)
        if status == PASS
        else "GPUs %s: NCCL all-reduce gave %d wrong elements" % (indices, wrong)
    )
    return result(
        "nccl_allreduce",
        node,
        status,
        message,
        None,
        (
            ("gpus", indices),
            ("bytes", str(count * 4)),
            ("algbw_gbps", "%.1f" % algbw),
            ("busbw_gbps", "%.1f" % busbw),
            ("wrong_elements", str(wrong)),
            ("nccl_version", str(getattr(torch.cuda.nccl, "version", lambda: "?")())),
        ),
        REMEDY_NCCL,
        time.perf_counter() - started,
    )


# --- the whole suite -------------------------------------------------------------------


def torch_devices(indices: Sequence[int], inventory: Optional[List[Dict[str, Any]]]) -> Dict[int, int]:
    """NVML index -> torch device number, matched by UUID (CUDA_VISIBLE_DEVICES may renumber)."""
    import torch

    by_uuid = {}
    for device in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            by_uuid[str(uuid).replace("GPU-", "")] = device
    out = {}
    for index in indices:
        uuid = None
        for gpu in inventory or ():
            if gpu["index"] == index:
                uuid = gpu["uuid"].replace("GPU-", "")
        if uuid is not None and uuid in by_uuid:
            out[index] = by_uuid[uuid]
        elif index < torch.cuda.device_count() and not os.environ.get("CUDA_VISIBLE_DEVICES"):
            out[index] = index  # PCI bus order (set below) matches NVML's order
    return out


def run_suite(
    node: str,
    level: int = 1,
    gpus: Optional[Sequence[int]] = None,
    force: bool = False,
    memory_share: float = 0.25,
    emit: Any = None,
) -> List[Dict[str, Any]]:
    """Run the suite on this machine; every result is also passed to emit(result) as it comes."""
    out: List[Dict[str, Any]] = []
    lock = threading.Lock()

    def push(item: Dict[str, Any]) -> None:
        with lock:
            out.append(item)
            if emit is not None:
                emit(item)

    started = time.perf_counter()
    inventory, source = nvml_inventory()
    no_gpu = no_gpu_reason(inventory, source, nvidia_device_files())
    if no_gpu:
        push(result("suite", node, SKIP, "skipped: no GPU (%s)" % no_gpu, None, (("source", source),)))
        return out
    testable, refused = refusals(inventory, source, gpus, force, node, os.getpid())
    for item in refused:
        push(item)
    if testable is not None and not testable:
        if not refused:
            push(
                result(
                    "cuda_init",
                    node,
                    ERROR,
                    "no GPU to test (%s)" % (source if inventory is None else "no GPUs found"),
                    None,
                    (("source", source),),
                    REMEDY_INIT,
                )
            )
        return out
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch numbering as NVML's
    try:
        import torch
    except Exception as exc:
        push(
            result(
                "cuda_init",
                node,
                ERROR,
                "torch is not available on this node (%s: %s)" % (type(exc).__name__, exc),
                None,
                (),
                REMEDY_INIT,
            )
        )
        return out
    import_s = time.perf_counter() - started
    if not torch.cuda.is_available():
        push(
            result(
                "cuda_init",
                node,
                ERROR,
                "CUDA is not available to torch %s (cuda %s)" % (torch.__version__, torch.version.cuda),
                None,
                (("torch", torch.__version__), ("torch_cuda", str(torch.version.cuda))),
                REMEDY_INIT,
            )
        )
        return out
    if testable is None:  # forced without an inventory: whatever torch sees
        testable = list(range(torch.cuda.device_count()))
    devices = torch_devices(testable, inventory)
    for index in testable:
        if index not in devices:
            push(
                result(
                    "cuda_init",
                    node,
                    ERROR,
                    "GPU %d is not visible to CUDA (CUDA_VISIBLE_DEVICES=%r)"
                    % (index, os.environ.get("CUDA_VISIBLE_DEVICES")),
                    index,
                    (),
                    REMEDY_INIT,
                )
            )
    sizes = LEVELS[level]
    n = sizes["fp64_n"]
    generator = torch.Generator().manual_seed(42)
    a = torch.randn(n, n, dtype=torch.float64, generator=generator)
    b = torch.randn(n, n, dtype=torch.float64, generator=generator)
    reference = a @ b  # once on the CPU, shared by every GPU
    suites = [
        GpuSuite(node, index, devices[index], sizes, memory_share, (a, b, reference))
        for index in testable
        if index in devices
    ]

    def work(suite: GpuSuite) -> None:
        for item in suite.run():
            push(item)

    threads = [
        threading.Thread(target=work, args=(suite,), name="gpu%d" % suite.index, daemon=True) for suite in suites
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    healthy = [
        (s.index, s.device)
        for s in suites
        if all(r["status"] != ERROR for r in s.results if r["check"] == PREFIX + "cuda_init")
    ]
    if len(healthy) >= 2:
        try:
            push(nccl_allreduce(node, healthy, sizes["nccl_mib"]))
        except Exception as exc:
            push(
                result(
                    "nccl_allreduce",
                    node,
                    ERROR,
                    "NCCL all-reduce could not run: %s: %s" % (type(exc).__name__, str(exc)[:200]),
                    None,
                    (),
                    REMEDY_NCCL,
                )
            )
    push(
        result(
            "suite",
            node,
            worst(out),
            "level %d suite on GPU %s in %.1f s (torch import %.1f s)"
            % (level, ",".join(str(s.index) for s in suites) or "-", time.perf_counter() - started, import_s),
            None,
            (
                ("level", str(level)),
                ("gpus", str(len(suites))),
                ("torch_import_s", "%.2f" % import_s),
                ("torch", torch.__version__),
            ),
            "",
            time.perf_counter() - started,
        )
    )
    return out


def worst(results: Sequence[Dict[str, Any]]) -> str:
    order = {PASS: 0, WARN: 1, ERROR: 2, FAIL: 3}
    status = PASS
    for item in results:
        if order.get(item["status"], 0) > order[status]:
            status = item["status"]
    return status


def exit_status(results: Sequence[Dict[str, Any]]) -> int:
    """0: all pass or warn; 1: any fail; 2: something could not run."""
    statuses = {item["status"] for item in results}
    if FAIL in statuses:
        return EXIT_FAIL
    if ERROR in statuses or not results:
        return EXIT_ERROR
    return EXIT_OK


def _gpu_list(text: str) -> List[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected GPU indices like 0,1,3")


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number")
    if not 0.0 < value <= 0.9:
        raise argparse.ArgumentTypeError("must be > 0 and <= 0.9")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opsconsole-health", description="GPU sanity tests on this node (JSON lines with --json)."
    )
    parser.add_argument("--json", action="store_true", help="print one JSON result per line")
    parser.add_argument("--level", type=int, choices=sorted(LEVELS), default=1, help="1: quick (seconds), 2: longer")
    parser.add_argument(
        "--gpus", type=_gpu_list, default=None, metavar="LIST", help="NVML indices to test (default: all)"
    )
    parser.add_argument("--force", action="store_true", help="also test GPUs that run compute processes")
    parser.add_argument(
        "--memory-share", type=_share, default=0.25, metavar="F", help="share of free memory the pattern test uses"
    )
    parser.add_argument("--node-name", default=None, metavar="NAME", help="node name in results (default: hostname)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    node = args.node_name or socket.gethostname()

    def emit(item: Dict[str, Any]) -> None:
        if args.json:
            line = json.dumps(item, sort_keys=True)
        else:
            gpu = "" if item["gpu"] is None else " gpu%d" % item["gpu"]
            line = "%-5s %s%s: %s" % (item["status"], item["check"], gpu, item["message"])
        sys.stdout.write(line + "\n")
        sys.stdout.flush()  # the console reads results as they come

    results = run_suite(node, args.level, args.gpus, args.force, args.memory_share, emit)
    sys.stdout.flush()
    code = exit_status(results)
    # Worker threads are done; skip interpreter teardown of CUDA/NCCL state (can hang on a sick GPU).
    os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
