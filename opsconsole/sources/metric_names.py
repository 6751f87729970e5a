"""Metric and label names shared by the exporter (sink) and the Prometheus source.

dcgm-exporter's names where one exists, so existing dashboards and alerts work on our
exporter and the console reads a site's dcgm-exporter unchanged; the rest under
`opsconsole_`. Stdlib only: the source imports this without prometheus_client.
"""

from __future__ import annotations

from typing import Dict, Tuple

MIB = 1024 * 1024

# dcgm-exporter's labels on every GPU series.
LABEL_GPU = "gpu"
LABEL_UUID = "UUID"
LABEL_DEVICE = "device"
LABEL_MODEL = "modelName"
LABEL_HOSTNAME = "Hostname"
LABEL_PCI_BUS_ID = "pci_bus_id"
LABEL_DRIVER = "DCGM_FI_DRIVER_VERSION"

# (metric, GpuSample field, kind). kind: a number the field is divided by to make the
# metric's unit (FB_* are MiB, energy is mJ), or "bool" (1/0). dcgm-exporter units.
GPU_METRICS: Tuple[Tuple[str, str, object], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "utilization_gpu", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "utilization_memory", 1),
    ("DCGM_FI_DEV_FB_USED", "memory_used", MIB),
    ("DCGM_FI_DEV_FB_FREE", "memory_free", MIB),
    ("DCGM_FI_DEV_FB_RESERVED", "memory_reserved", MIB),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature", 1),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "temperature_slowdown", 1),
    ("DCGM_FI_DEV_SHUTDOWN_TEMP", "temperature_shutdown", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "power_draw_w", 1),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", 1),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_j", 0.001),
    ("DCGM_FI_DEV_SM_CLOCK", "clock_sm_mhz", 1),
    ("DCGM_FI_DEV_MEM_CLOCK", "clock_mem_mhz", 1),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "clock_sm_max_mhz", 1),
    ("DCGM_FI_DEV_MAX_MEM_CLOCK", "clock_mem_max_mhz", 1),
    ("DCGM_FI_DEV_FAN_SPEED", "fan_percent", 1),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_volatile_corrected", 1),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_volatile_uncorrected", 1),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_aggregate_corrected", 1),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_aggregate_uncorrected", 1),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_rows_corrected", 1),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_rows_uncorrected", 1),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remapped_rows_failure", "bool"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "retired_pages_pending", "bool"),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "pcie_gen", 1),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie_width", 1),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "pcie_gen_max", 1),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "pcie_width_max", 1),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "pcie_tx_kbs", 1),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "pcie_rx_kbs", 1),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay_count", 1),
    ("DCGM_FI_DEV_PERSISTENCE_MODE", "persistence_mode", "bool"),
    ("DCGM_FI_DEV_MIG_MODE", "mig_mode", "bool"),
    # Ours: fields dcgm-exporter has no name for.
    ("opsconsole_gpu_memory_total_bytes", "memory_total", 1),
    ("opsconsole_gpu_pstate", "pstate", 1),
    ("opsconsole_gpu_ecc_enabled", "ecc_enabled", "bool"),
    ("opsconsole_gpu_remapped_rows_pending", "remapped_rows_pending", "bool"),
    ("opsconsole_gpu_lost", "lost", "bool"),
)
INTEGER_FIELDS = frozenset(
    (
        "memory_used",
        "memory_free",
        "memory_reserved",
        "memory_total",
        "clock_sm_mhz",
        "clock_mem_mhz",
        "clock_sm_max_mhz",
        "clock_mem_max_mhz",
        "ecc_volatile_corrected",
        "ecc_volatile_uncorrected",
        "ecc_aggregate_corrected",
        "ecc_aggregate_uncorrected",
        "remapped_rows_corrected",
        "remapped_rows_uncorrected",
        "pcie_gen",
        "pcie_width",
        "pcie_gen_max",
        "pcie_width_max",
        "pcie_tx_kbs",
        "pcie_rx_kbs",
        "pcie_replay_count",
        "pstate",
    )
)
GPU_METRIC_FIELDS: Dict[str, Tuple[str, object]] = {name: (attr, kind) for name, attr, kind in GPU_METRICS}

# The clock event (throttle) reasons as NVML's bitmask; dcgm-exporter renamed the field in DCGM 3.3.
METRIC_CLOCK_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
METRIC_CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
# The last XID error code of the GPU (dcgm-exporter keeps the latest; 0: none yet).
METRIC_XID = "DCGM_FI_DEV_XID_ERRORS"
# Ours: one series per active reason (value 1), and per-GPU counts the probe knows.
METRIC_CLOCK_REASON_ACTIVE = "opsconsole_gpu_clock_event_reason_active"
METRIC_XID_EVENTS = "opsconsole_gpu_xid_events"  # counter; exposed as ..._total
METRIC_GPU_PROCESSES = "opsconsole_gpu_processes"
METRIC_GPU_ERRORS = "opsconsole_gpu_read_errors"
METRIC_COMPUTE_MODE = "opsconsole_gpu_compute_mode_info"
METRIC_PROCESS_MEMORY = "opsconsole_gpu_process_memory_bytes"
METRIC_PROCESS_SM = "opsconsole_gpu_process_sm_percent"
# Whose job a GPU process is (read on the node: opsconsole/probe/jobs.py), as labels of the two above.
PROCESS_JOB_LABELS = (
    ("slurm_job_id", "job_id"),
    ("slurm_job_step", "job_step"),
    ("slurm_job_user", "job_user"),
    ("process_container", "container"),
)

# Host fields under opsconsole_ (the source prefers node-exporter's when both exist).
HOST_CPU_PERCENT = "opsconsole_host_cpu_percent"
HOST_CPU_COUNT = "opsconsole_host_cpu_count"
HOST_IOWAIT = "opsconsole_host_iowait_percent"
HOST_LOAD = "opsconsole_host_load_average"  # label period = "1", "5", "15"
HOST_MEM_TOTAL = "opsconsole_host_memory_total_bytes"
HOST_MEM_USED = "opsconsole_host_memory_used_bytes"
HOST_MEM_AVAILABLE = "opsconsole_host_memory_available_bytes"
HOST_SWAP_TOTAL = "opsconsole_host_swap_total_bytes"
HOST_SWAP_USED = "opsconsole_host_swap_used_bytes"
HOST_FS_SIZE = "opsconsole_host_filesystem_size_bytes"  # label mountpoint
HOST_FS_USED = "opsconsole_host_filesystem_used_bytes"
HOST_FS_FREE = "opsconsole_host_filesystem_free_bytes"
HOST_NET_RX = "opsconsole_host_network_receive_bytes_per_second"  # label device
HOST_NET_TX = "opsconsole_host_network_transmit_bytes_per_second"
HOST_UPTIME = "opsconsole_host_uptime_seconds"
FRAME_SEQ = "opsconsole_frame_seq"
FRAME_TIME = "opsconsole_frame_timestamp_seconds"
FRAME_ERRORS = "opsconsole_frame_errors"
PROBE_SECONDS = "opsconsole_probe_duration_seconds"
NODE_INFO = "opsconsole_node_info"  # labels driver_version, gpu_source

HOST_METRICS = (
    HOST_CPU_PERCENT,
    HOST_CPU_COUNT,
    HOST_IOWAIT,
    HOST_LOAD,
    HOST_MEM_TOTAL,
    HOST_MEM_USED,
    HOST_MEM_AVAILABLE,
    HOST_SWAP_TOTAL,
    HOST_SWAP_USED,
    HOST_FS_SIZE,
    HOST_FS_USED,
    HOST_FS_FREE,
    HOST_NET_RX,
    HOST_NET_TX,
    HOST_UPTIME,
    FRAME_SEQ,
    FRAME_TIME,
    FRAME_ERRORS,
    PROBE_SECONDS,
    NODE_INFO,
)

# node-exporter's gauges the source reads (counters go through rate(), see sources/prometheus.py).
NODE_EXPORTER_GAUGES = (
    "node_load1",
    "node_load5",
    "node_load15",
    "node_memory_MemTotal_bytes",
    "node_memory_MemAvailable_bytes",
    "node_memory_SwapTotal_bytes",
    "node_memory_SwapFree_bytes",
    "node_boot_time_seconds",
)
NODE_EXPORTER_FILESYSTEM = ("node_filesystem_size_bytes", "node_filesystem_free_bytes", "node_filesystem_avail_bytes")

# dcgm-exporter's labels beyond a GPU's own: the host (`Hostname` until 4.x, `hostname` since its
# commit d5e5f51 "Rename Hostname label to hostname"), a MIG instance, and whose work it runs
# (the Kubernetes pod mapper's pod/namespace/container, the HPC job mapper's hpc_job).
LABEL_HOSTNAME_NEW = "hostname"
LABEL_GPU_I_ID = "GPU_I_ID"
LABEL_GPU_I_PROFILE = "GPU_I_PROFILE"
LABEL_POD = "pod"
LABEL_NAMESPACE = "namespace"
LABEL_CONTAINER = "container"
LABEL_HPC_JOB = "hpc_job"
JOB_LABELS = (LABEL_POD, LABEL_NAMESPACE, LABEL_CONTAINER, LABEL_HPC_JOB)
# A MIG instance's graphics engine activity (a ratio): its utilisation, as GPU_UTIL is not kept per instance.
METRIC_GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
# Fields dcgm-exporter keeps per MIG instance (the rest are the parent GPU's, repeated on each instance).
MIG_INSTANCE_FIELDS = frozenset(("memory_used", "memory_free", "memory_reserved"))
