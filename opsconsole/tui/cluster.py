"""The Cluster GPUs pane: every GPU of every node in one table, to find idle or hot ones."""

from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Any, List, Mapping, Optional, Tuple

from rich.text import Text
from textual.widgets import DataTable

from opsconsole.fleet_view import GPU_FILTER, GPU_SORT_KEYS, GpuRow, cluster_gpu_rows, filter_rows
from opsconsole.model import NodeState
from opsconsole.tui.formatting import (
    NA,
    STALE_ROW_STYLE,
    counted,
    format_age,
    format_memory_pair,
    format_percent,
    format_power_pair,
    format_temperature,
    shorten,
    state_style,
)
from opsconsole.tui.table_diff import TableRow
from opsconsole.tui.table_pane import Column, SortedTable, TablePane

USERS_WIDTH = 20
JOBS_WIDTH = 16
MARK = "\u25b6"  # ▶ before the job of a row that runs the followed job (--slurm-job)

GPU_COLUMNS = (
    Column("node", "Node"),
    Column("index", "GPU", 3),
    Column("name", "Name"),
    Column("util", "Util", 5),
    Column("memory", "Memory", 15),
    Column("mem_percent", "Mem%", 5),
    Column("temp", "Temp", 5),
    Column("power", "Power", 11),
    Column("users", "Users", USERS_WIDTH),
    Column("jobs", "Job", JOBS_WIDTH),
    Column("node_state", "Node state", 11),
)


def _users(row: GpuRow) -> str:
    if not row.users:
        return "-" if row.process_count == 0 else NA
    return shorten(",".join(row.users), USERS_WIDTH)


def _jobs(row: GpuRow) -> str:
    if not row.jobs:
        return "-"
    return shorten((MARK + " " if row.marked else "") + ",".join(row.jobs), JOBS_WIDTH)


def followed_jobs(fleet: Any) -> Tuple[str, ...]:
    """The job ids the console follows (--slurm-job, or --slurm-user's running jobs); () when none."""
    run = getattr(fleet, "slurm_run", None)
    return tuple(job.job_id for job in getattr(run, "jobs", ()) or ())


def node_state_text(row: GpuRow, states: Mapping[str, NodeState], now: float) -> str:
    """`up`, or `down 2m` (with the age of the kept frame) for a node that is not live."""
    if row.live:
        return row.node_state
    state = states.get(row.node)
    age = state.age(now) if state is not None else None
    return row.node_state if age is None else "%s %s" % (row.node_state, format_age(age))


def nodes_part(states: Mapping[str, NodeState], node: Optional[str], with_gpus: AbstractSet[str]) -> str:
    """The nodes in view (`node` alone when drilled into), those whose frame lists no GPU said so:
    `1 node without GPUs`, `3 nodes (1 without GPUs)`; a node with no frame yet is counted, no more."""
    shown = [state for name, state in states.items() if node is None or name == node]
    without = sum(1 for state in shown if state.frame is not None and state.name not in with_gpus)
    text = counted(len(shown), "nodes")
    if without and without == len(shown):
        return text + " without GPUs"
    return text + (" (%d without GPUs)" % without if without else "")


def gpu_table_row(row: GpuRow, node_state: str) -> TableRow:
    """A GPU's cells; GPUs of a node that is not live are dimmed and show the frame's age."""
    base = "" if row.live else STALE_ROW_STYLE

    def cell(text: str, style: str = base) -> Text:
        return Text(text, style=style, end="")

    name = (row.name or NA) + (" LOST" if row.lost else "")
    index = str(row.index) if row.mig_instance is None else "%d.%d" % (row.index, row.mig_instance)
    return TableRow(
        row.key,
        (
            cell(row.node),
            cell(index),
            cell(name, "bold red" if row.lost else base),
            cell(format_percent(row.util)),
            cell(format_memory_pair(row.mem_used, row.mem_total)),
            cell(format_percent(row.mem_percent)),
            cell(format_temperature(row.temp)),
            cell(format_power_pair(row.power, row.power_limit)),
            cell(_users(row)),
            cell(_jobs(row), "bold magenta" if row.marked else base),
            cell(node_state, state_style(row.node_state)),
        ),
    )


class ClusterGpusPane(TablePane):
    """Every GPU of every node: node, index, name, util, memory, temp, power, users, job, node state.

    A GPU in MIG mode is followed by a row per MIG instance (GPU `0.1`: GPU 0's instance 1) with
    its own memory. The job is the Slurm job id of its processes, or the pod dcgm-exporter names;
    ▶ marks the GPUs of the followed job (--slurm-job).
    Keys: `s` next sort column, `r` reverse, header click sorts. Filter (AND of terms): free
    text, `node:gpu01`, `user:alice`, `job:812`, `job:ml/train-0`, `gpu:0`, `util<10`, `util>90`,
    `mem>80`, `temp>80`, `power>500`.
    """

    pane_id = "cluster"
    title = "Cluster GPUs"
    key = "5"
    filter_fields = GPU_FILTER

    def make_tables(self) -> List[SortedTable]:
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="cluster-table")
        return [SortedTable(table, GPU_SORT_KEYS)]

    def draw(self) -> List[str]:
        sorted_table = self.tables[0]
        sorted_table.set_columns(GPU_COLUMNS)  # once; later calls see the same layout and return
        jobs = followed_jobs(getattr(self.app, "fleet", None))
        rows = cluster_gpu_rows(self.states, self.node, jobs[0] if len(jobs) == 1 else None)
        if len(jobs) > 1:  # --slurm-user: every one of the user's jobs is followed
            rows = [replace(row, marked=any(job in row.jobs for job in jobs)) for row in rows]
        shown = filter_rows(rows, self.filter, self.filter_fields)
        states, now = self.states, self.now
        sorted_table.show(
            shown,
            lambda row: gpu_table_row(row, node_state_text(row, states, now)),
            signature=lambda row: (row, node_state_text(row, states, now)),
        )
        marked = sum(1 for row in rows if row.marked and row.mig_instance is None)
        return (
            [
                self.count_part(sorted_table, "GPUs"),
                nodes_part(self.states, self.node, {row.node for row in rows}),
            ]
            + (["%d GPUs of job %s" % (marked, ",".join(jobs))] if jobs else [])
            + [
                "sort: " + sorted_table.sort_label(),
            ]
        )

    def selected_node(self) -> Optional[str]:
        """The node of the GPU under the cursor (for the app's drill-down), None if none."""
        table = self.tables[0].table
        if table.row_count == 0:
            return None
        key = table.ordered_rows[table.cursor_row].key.value or ""
        return key.rsplit("/", 1)[0] or None  # "node/3" and a MIG instance's "node/3.mig1"
