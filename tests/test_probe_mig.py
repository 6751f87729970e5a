"""MIG devices from NVML on an SSH node: each instance under its parent GPU, with its memory and processes.

The real H200 runs with MIG off and no test changes a GPU's mode: the NVML replay (tests/nvml_replay.py)
answers NVML's MIG calls for two 3g.71gb instances, beside the recorded GPU's own answers.
"""

from __future__ import annotations

from nvml_replay import H200_MIG_3G, ReplayNvml

from opsconsole.fleet_view import cluster_gpu_rows
from opsconsole.model import STATE_UP, NodeFrame, NodeState, checked
from opsconsole.probe.agent import Probe
from opsconsole.probe.gpu import GpuReader
from opsconsole.probe.wire_delta import DeltaEncoder, StreamDecoder

MIB = 2**20


def test_mig_instances_are_read_under_their_gpu_with_their_memory_and_processes():
    replay = ReplayNvml(gpus=2, mig={0: H200_MIG_3G})
    reader = GpuReader(nvml=replay.module)
    reading = reader.read()
    mig_gpu, plain_gpu = reading.gpus
    assert mig_gpu.mig_mode is True and plain_gpu.mig_mode is False
    assert [
        (m.gpu_instance_id, m.compute_instance_id, m.profile, m.memory_used, m.memory_total)
        for m in mig_gpu.mig_devices
    ] == [
        (1, 0, "3g.71gb", 3000 * MIB, 71_940_702_208),
        (2, 0, "3g.71gb", 12000 * MIB, 71_940_702_208),
    ]
    assert all(m.uuid.startswith("MIG-") for m in mig_gpu.mig_devices)
    assert plain_gpu.mig_devices == () and replay.count("nvmlDeviceGetMigDeviceHandleByIndex", 1) == 0
    assert [(p.pid, p.gpu_index, p.mig_instance) for p in reading.processes] == [(4101, 0, 1), (4102, 0, 2)]
    # The handles are found once per slow tick (all 7 slots asked, 5 empty); memory is read every tick.
    reader.read()
    assert replay.count("nvmlDeviceGetMigDeviceHandleByIndex", 0) == 7
    assert replay.count("nvmlDeviceGetMemoryInfo(mig)", 0) == 4


def test_a_failing_instance_is_an_error_on_its_gpu_and_the_rest_still_reads():
    replay = ReplayNvml(gpus=1, mig={0: H200_MIG_3G})
    broken = replay.module.nvmlDeviceGetMemoryInfo

    def memory(handle, *args):
        if getattr(handle, "instance", {}).get("gi") == 2:
            raise replay.error("NVMLError_Unknown")
        return broken(handle, *args)

    replay.module.nvmlDeviceGetMemoryInfo = memory
    (gpu,) = GpuReader(nvml=replay.module).read().gpus
    assert [(m.gpu_instance_id, m.memory_used) for m in gpu.mig_devices] == [(1, 3000 * MIB), (2, None)]
    assert any(e.startswith("mig_devices: instance 2 memory:") for e in gpu.errors)
    assert gpu.memory_used is not None and not gpu.lost


def test_a_mig_frame_passes_the_checks_and_the_delta_stream_and_shows_as_rows():
    probe = Probe(node_name="gpu-m", top=0, gpu_reader=GpuReader(nvml=ReplayNvml(gpus=1, mig={0: H200_MIG_3G}).module))
    encoder, decoder = DeltaEncoder(keyframe_every=30), StreamDecoder()
    frames = [checked(probe.poll()) for _ in range(3)]
    results = [decoder.decode_line(encoder.encode(frame)) for frame in frames]
    assert [error for _, error in results] == [None, None, None] and encoder.deltas == 2
    decoded = [frame for frame, _ in results]
    assert all(isinstance(d, NodeFrame) for d in decoded)
    assert decoded[-1].gpus[0].mig_devices == frames[-1].gpus[0].mig_devices
    assert [p.mig_instance for p in decoded[-1].processes] == [1, 2]
    rows = cluster_gpu_rows({"gpu-m": NodeState(name="gpu-m", state=STATE_UP, frame=decoded[-1])})
    assert [(r.key, r.name, r.mem_used, r.process_count) for r in rows] == [
        ("gpu-m/0", "NVIDIA H200", decoded[-1].gpus[0].memory_used, 2),
        ("gpu-m/0.mig1", "MIG 3g.71gb", 3000 * MIB, 1),
        ("gpu-m/0.mig2", "MIG 3g.71gb", 12000 * MIB, 1),
    ]
