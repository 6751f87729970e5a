"""Whose job each GPU runs, as the panes show, filter and count it: Slurm jobs read on the node,
Kubernetes pods and HPC jobs from dcgm-exporter, containers; MIG instances as rows; --slurm-job marks.
"""

from __future__ import annotations

from types import SimpleNamespace

from test_tui_panes import SIZE, PaneApp, cells, keys, status_text

from opsconsole.fleet_view import (
    GPU_FILTER,
    GPU_PROCESSES,
    NODE_FILTER,
    PROCESS_FILTER,
    cluster_gpu_rows,
    filter_rows,
    node_rows,
    parse_filter,
    process_rows,
)
from opsconsole.jobs_view import count_jobs, frame_jobs
from opsconsole.model import STATE_DOWN, STATE_UP, GpuSample, MigDevice, NodeFrame, NodeState, ProcessSample
from opsconsole.nodes.slurm import SlurmJob, SlurmRun
from opsconsole.nodes.totals import totals_of
from opsconsole.snapshot_format import snapshot_document, snapshot_table
from opsconsole.tui.cluster import ClusterGpusPane
from opsconsole.tui.nodes import NodesPane

NOW = 1_800_000_000.0
GIB = 2**30


def slurm_node() -> NodeState:
    """gpu01: GPU 0 runs Slurm job 812 (alice, step 0), GPU 1 a container outside Slurm, GPU 2 nothing."""
    frame = NodeFrame(
        node="gpu01",
        time=NOW,
        gpus=(
            GpuSample(index=0, name="NVIDIA H200"),
            GpuSample(index=1, name="NVIDIA H200"),
            GpuSample(index=2, name="NVIDIA H200"),
        ),
        processes=(
            ProcessSample(pid=4101, user="alice", gpu_index=0, job_id="812", job_step="0", job_user="alice"),
            ProcessSample(pid=4102, user="alice", gpu_index=0, job_id="812", job_step="0", job_user="alice"),
            ProcessSample(pid=5000, user="root", gpu_index=1, container="docker/2403ccfe427f"),
        ),
    )
    return NodeState(name="gpu01", state=STATE_UP, frame=frame, received_at=NOW)


def k8s_node() -> NodeState:
    """gpu02 (from Prometheus): GPU 0 in pod ml/train-0, GPU 1 in MIG mode with one instance serving a pod."""
    frame = NodeFrame(
        node="gpu02",
        time=NOW,
        gpus=(
            GpuSample(index=0, name="NVIDIA H200", pod="train-0", namespace="ml", container="trainer"),
            GpuSample(
                index=1,
                name="NVIDIA H200",
                mig_mode=True,
                memory_used=15 * GIB,
                memory_total=140 * GIB,
                mig_devices=(
                    MigDevice(
                        gpu_instance_id=1,
                        profile="3g.71gb",
                        memory_used=3 * GIB,
                        memory_total=70 * GIB,
                        pod="infer-7",
                        namespace="serving",
                    ),
                    MigDevice(gpu_instance_id=2, profile="3g.71gb", memory_used=12 * GIB, memory_total=70 * GIB),
                ),
            ),
            GpuSample(index=2, name="NVIDIA H200", job_id="100001"),  # dcgm-exporter's hpc_job
        ),
    )
    return NodeState(name="gpu02", state=STATE_UP, frame=frame, received_at=NOW)


def fleet():
    down = NodeState(name="gpu03", state=STATE_DOWN, frame=slurm_node().frame, received_at=NOW - 120)
    return {"gpu01": slurm_node(), "gpu02": k8s_node(), "gpu03": down}


def test_gpu_rows_carry_their_jobs_and_mig_instances_have_rows_of_their_own():
    rows = {r.key: r for r in cluster_gpu_rows(fleet())}
    assert rows["gpu01/0"].jobs == ("812",) and rows["gpu01/0"].job_users == ("alice",)
    assert rows["gpu01/1"].jobs == ("docker/2403ccfe427f",)
    assert rows["gpu01/2"].jobs == ()
    assert rows["gpu02/0"].jobs == ("ml/train-0",)
    assert rows["gpu02/2"].jobs == ("100001",)
    mig = rows["gpu02/1.mig1"]
    assert (mig.index, mig.mig_instance, mig.name, mig.mem_used, mig.jobs) == (
        1,
        1,
        "MIG 3g.71gb",
        3 * GIB,
        ("serving/infer-7",),
    )
    assert rows["gpu02/1.mig2"].jobs == () and rows["gpu02/1"].mem_used == 15 * GIB
    assert list(rows).index("gpu02/1.mig1") == list(rows).index("gpu02/1") + 1  # under its GPU


def test_job_and_user_filters_in_every_pane():
    states = fleet()
    gpus = cluster_gpu_rows(states)
    assert [r.key for r in filter_rows(gpus, parse_filter("job:812", GPU_FILTER), GPU_FILTER)] == ["gpu01/0", "gpu03/0"]
    assert [r.key for r in filter_rows(gpus, parse_filter("job:ml/train-0", GPU_FILTER), GPU_FILTER)] == ["gpu02/0"]
    assert [r.key for r in filter_rows(gpus, parse_filter("job:serving/*", GPU_FILTER), GPU_FILTER)] == ["gpu02/1.mig1"]
    assert [r.key for r in filter_rows(gpus, parse_filter("user:alice node:gpu01", GPU_FILTER), GPU_FILTER)] == [
        "gpu01/0"
    ]
    nodes = node_rows(states, NOW)
    assert [r.name for r in filter_rows(nodes, parse_filter("job:812", NODE_FILTER), NODE_FILTER)] == ["gpu01", "gpu03"]
    assert [r.name for r in filter_rows(nodes, parse_filter("job:100001", NODE_FILTER), NODE_FILTER)] == ["gpu02"]
    procs = process_rows(states, None, GPU_PROCESSES)
    assert [r.key for r in filter_rows(procs, parse_filter("job:812 node:gpu01", PROCESS_FILTER), PROCESS_FILTER)] == [
        "gpu01/4101@0",
        "gpu01/4102@0",
    ]
    assert [r.pid for r in filter_rows(procs, parse_filter("job:docker/*", PROCESS_FILTER), PROCESS_FILTER)] == [
        5000,
        5000,
    ]


def test_the_followed_job_is_marked_and_jobs_are_counted_once_across_nodes():
    rows = cluster_gpu_rows(fleet(), job="812")
    assert sorted(r.key for r in rows if r.marked) == ["gpu01/0", "gpu03/0"]
    assert frame_jobs(k8s_node().frame) == ("100001", "ml/train-0", "serving/infer-7")
    # 812 once though on two nodes; the container once per node (gpu01, gpu03); two pods and an HPC job.
    assert count_jobs(fleet().values()) == 1 + 2 + 3
    assert totals_of(fleet().values(), NOW, stale_after=10.0).jobs == 1 + 1 + 3  # the header counts live nodes only


def test_snapshot_json_and_text_carry_the_jobs():
    document = snapshot_document([slurm_node(), k8s_node()], NOW)
    first, second = document["nodes"]
    assert first["processes"][0]["job_id"] == "812" and first["processes"][0]["job_user"] == "alice"
    assert first["processes"][2]["container"] == "docker/2403ccfe427f"
    assert second["gpus"][1]["mig_devices"][0]["profile"] == "3g.71gb" and second["gpus"][0]["pod"] == "train-0"
    assert "alice(4101) job 812" in snapshot_table([slurm_node()], NOW)


async def test_cluster_pane_shows_jobs_mig_rows_and_marks_the_followed_job():
    pane = ClusterGpusPane()
    app = PaneApp(pane)
    run = SlurmRun(jobs=(SlurmJob(job_id="812", nodes=("gpu01",)),), label="job 812")
    async with app.run_test(size=SIZE) as pilot:
        app.fleet = SimpleNamespace(slurm_run=run)  # what the console's Fleet offers: the followed run
        pane.show(fleet(), None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        assert "gpu02/1.mig1" in keys(table)
        assert cells(table, "gpu02/1.mig1")["index"] == "1.1"
        assert cells(table, "gpu02/1.mig1")["name"] == "MIG 3g.71gb"
        assert cells(table, "gpu02/0")["jobs"] == "ml/train-0"
        assert cells(table, "gpu01/0")["jobs"] == "\u25b6 812"
        assert cells(table, "gpu01/2")["jobs"] == "-"
        assert "2 GPUs of job 812" in status_text(pane)
        pane.apply_filter("job:812")
        await pilot.pause()
        assert keys(table) == ["gpu01/0", "gpu03/0"]


async def test_nodes_pane_shows_jobs():
    pane = NodesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show(fleet(), None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        assert cells(table, "gpu01")["jobs"].startswith("812,docker/")
        assert cells(table, "gpu02")["jobs"] == "100001,ml/tra…"  # cut to the column, whole in the filter


async def test_processes_pane_shows_each_gpu_process_job_and_filters_by_it():
    from opsconsole.tui.processes import ProcessesPane

    pane = ProcessesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show({"gpu01": slurm_node()}, None, NOW)
        await pilot.pause()
        table = pane.query_one("#gpu-processes")
        assert cells(table, "gpu01/4101@0")["job"] == "812"
        assert cells(table, "gpu01/5000@1")["job"] == "docker/2403…"
        pane.apply_filter("job:812")
        await pilot.pause()
        assert keys(table) == ["gpu01/4101@0", "gpu01/4102@0"]
