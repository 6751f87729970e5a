"""/metrics pages in dcgm-exporter's exact format, rendered as its own template renders them.

Source: NVIDIA/dcgm-exporter at commit d5e5f510a1b6 ("Rename Hostname label to hostname (#655)"),
internal/pkg/rendermetrics/render_metrics.go, the GPU entity template (its tabs shown as spaces):

    gpuMetricsFormat = `
    {{- range $counter, $metrics := . -}}
    # HELP {{ $counter.FieldName }} {{ $counter.Help }}
    # TYPE {{ $counter.FieldName }} {{ $counter.PromType }}
    {{- range $metric := $metrics }}
    {{ $counter.FieldName }}{gpu="{{ $metric.GPU }}",{{ $metric.UUID }}="{{ $metric.GPUUUID }}",pci_bus_id="{{ $metric.GPUPCIBusID }}",device="{{ $metric.GPUDevice }}",modelName="{{ $metric.GPUModelName }}"{{if $metric.MigProfile}},GPU_I_PROFILE="{{ $metric.MigProfile }}",GPU_I_ID="{{ $metric.GPUInstanceID }}"{{end}}{{if $metric.Hostname }},hostname="{{ $metric.Hostname }}"{{end}}

    {{- range $k, $v := $metric.Labels -}}
        ,{{ $k }}="{{ $v }}"
    {{- end -}}
    {{- range $k, $v := $metric.Attributes -}}
        ,{{ $k }}="{{ $v }}"
    {{- end -}}

    } {{ $metric.Value -}}
    {{- end }}
    {{ end }}`

Go templates range over maps in sorted key order; `Labels` holds the label-type counters
(DCGM_FI_DRIVER_VERSION), `Attributes` the Kubernetes pod mapper's pod/namespace/container
(and the HPC mapper's hpc_job). Before that commit the host label was spelled `Hostname`:
`hostname_label` renders either. The counters are etc/default-counters.csv's (same commit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# etc/default-counters.csv (d5e5f510a1b6): field, Prometheus type, help.
DEFAULT_COUNTERS: Tuple[Tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
)
DRIVER_VERSION = "580.95.05"
# What DCGM does not keep per MIG instance: the GPU's utilisation and memory copy utilisation.
NOT_PER_INSTANCE = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL")


@dataclass
class MigInstance:
    gpu_instance_id: int
    profile: str  # "3g.40gb"
    fb_used_mib: int
    fb_free_mib: int
    engine_active: float  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, a ratio
    attributes: Dict[str, str] = field(default_factory=dict)


@dataclass
class Gpu:
    index: int
    util: int = 37
    fb_used_mib: int = 1010
    fb_free_mib: int = 142144
    temp: int = 41
    power_w: float = 120.5
    attributes: Dict[str, str] = field(default_factory=dict)  # pod, namespace, container (the pod mapper's)
    mig: Sequence[MigInstance] = ()

    @property
    def uuid(self) -> str:
        return "GPU-6777fcb4-080d-bc07-9109-%012x" % (0xA000 + self.index)

    def value(self, counter: str, instance: Optional[MigInstance]) -> float:
        if instance is not None:
            if counter == "DCGM_FI_DEV_FB_USED":
                return instance.fb_used_mib
            if counter == "DCGM_FI_DEV_FB_FREE":
                return instance.fb_free_mib
            if counter == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
                return instance.engine_active
        return {
            "DCGM_FI_DEV_SM_CLOCK": 1980,
            "DCGM_FI_DEV_MEM_CLOCK": 3201,
            "DCGM_FI_DEV_MEMORY_TEMP": 45,
            "DCGM_FI_DEV_GPU_TEMP": self.temp,
            "DCGM_FI_DEV_POWER_USAGE": self.power_w,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 10203506,
            "DCGM_FI_DEV_GPU_UTIL": self.util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": 22,
            "DCGM_FI_DEV_FB_FREE": self.fb_free_mib,
            "DCGM_FI_DEV_FB_USED": self.fb_used_mib,
            "DCGM_FI_DEV_FB_RESERVED": 615,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": self.util / 100.0,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.61,
            "DCGM_FI_PROF_DRAM_ACTIVE": 0.4,
        }.get(counter, 0)


def _format_value(value: float) -> str:
    # dcgm-exporter prints the DCGM value as text: integers without a point, floats as Go's %v would.
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_page(gpus: Sequence[Gpu], hostname: str, hostname_label: str = "hostname", uuid_label: str = "UUID") -> str:
    """The /metrics text dcgm-exporter serves for `gpus` of host `hostname` (GPU entities only)."""
    out: List[str] = []
    for name, prom_type, help_text in DEFAULT_COUNTERS:
        out.append("# HELP %s %s" % (name, help_text))
        out.append("# TYPE %s %s" % (name, prom_type))
        for gpu in gpus:
            entities: Sequence[Optional[MigInstance]] = list(gpu.mig) or [None]
            for instance in entities:
                if instance is not None and name in NOT_PER_INSTANCE:
                    continue
                labels = (
                    '%s{gpu="%d",%s="%s",pci_bus_id="00000000:%02X:00.0",device="nvidia%d",modelName="NVIDIA H200"'
                    % (name, gpu.index, uuid_label, gpu.uuid, 0x18 + gpu.index, gpu.index)
                )
                if instance is not None:
                    labels += ',GPU_I_PROFILE="%s",GPU_I_ID="%d"' % (instance.profile, instance.gpu_instance_id)
                if hostname:
                    labels += ',%s="%s"' % (hostname_label, hostname)
                for key, value in sorted({"DCGM_FI_DRIVER_VERSION": DRIVER_VERSION}.items()):
                    labels += ',%s="%s"' % (key, value)
                attributes = instance.attributes if instance is not None else gpu.attributes
                for key, value in sorted(attributes.items()):
                    labels += ',%s="%s"' % (key, value)
                out.append("%s} %s" % (labels, _format_value(gpu.value(name, instance))))
    return "\n".join(out) + "\n"
