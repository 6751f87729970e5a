"""The checkpoint cleanup action: the retention plan of opsconsole.checkpoints, carried out audited.

Planning scans the directory (locally, or over the node's SFTP) and makes the retention plan
with the directory's `keep` and `min_age` from `[[checkpoints]]`; only configured directories
are cleaned. The confirmation lists what goes and asks for the directory's name typed.
Running audits the attempt (ActionRunner), then `execute_plan` checks that the directory is
the one the plan was made for (its identity, pinned at planning), checks each unit whole again
(identity, not in use) and audits each deletion itself before it happens; the result record follows. A deletion whose
record cannot be written does not happen, and the cleanup stops there: the report lists what was
deleted, what was not attempted, and why it stopped. Names from the disk are shown through
sanitize.printable_line (a newline or an escape sequence in a file name stays one visible line).

Filesystem calls block, so they run in a worker thread; over SSH, SftpFileSystem hands
them to the console's event loop, which owns the node's connection, and deletes through
probe/delete_units.py run on the node (never by SFTP path).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import time
from typing import Any, Mapping, Optional, Tuple

from opsconsole.config import CheckpointDirConfig, Config
from opsconsole.sanitize import printable_line
from opsconsole.units import format_bytes

CLEANUP_MODULE = "opsconsole.checkpoints.cleanup"
LISTED_ITEMS = 12  # deletions named in the confirmation; the rest are counted


def unavailable() -> Optional[str]:
    """Why cleanup cannot run in this build, None when it can."""
    try:
        from opsconsole.checkpoints.cleanup import execute_plan, plan_directory  # noqa: F401
    except ImportError:
        return "checkpoint cleanup is not available in this build (%s missing)" % CLEANUP_MODULE
    return None


def configured_dir(config: Config, node: str, path: str) -> Optional[CheckpointDirConfig]:
    """The [[checkpoints]] entry for `path` on `node` (an entry without node is the local node's)."""
    local_names = {n.name for n in config.nodes if n.local}
    wanted = posixpath.normpath(path)
    for entry in config.checkpoints:
        entry_node = entry.node
        same_node = entry_node == node or (entry_node is None and (node in local_names or not local_names))
        if same_node and posixpath.normpath(entry.path) == wanted:
            return entry
    return None


def _filesystem(ctx: Any, node: str) -> Any:
    """The node's file system from the console's registry (ctx.filesystems: shared with the Checkpoints
    pane, kept open), else one made for this call (a headless run: closed by _close)."""
    from opsconsole.actions.runner import remote_link
    from opsconsole.checkpoints.filesystems import FileSystems

    registry = ctx.filesystems or FileSystems(timeout=ctx.config.ssh.connect_timeout + 30.0)
    return registry.get(node, remote_link(ctx.link), asyncio.get_running_loop())


def root_of(path: str, fs: Any) -> str:
    """The directory as the file system names it: `~` expanded for a local one."""
    return path if getattr(fs, "remote", False) else os.path.expanduser(path)


async def _close(fs: Any, ctx: Any) -> None:
    if ctx.filesystems is not None:
        return  # the console's registry keeps it for the pane and the next cleanup
    aclose = getattr(fs, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            pass  # closing a broken SFTP channel: nothing left to do


def cleanup_argv(node: str, path: str, keep: int, min_age: float, local: bool) -> Tuple[str, ...]:
    """The headless command that does the same (shown in the confirmation and the audit log)."""
    argv = ("opsconsole", "cleanup", path, "--keep", str(keep), "--min-age", "%g" % min_age)
    return argv if local else argv + ("--node", node)


async def plan_cleanup(action: Any, target: Any, ctx: Any, params: Mapping[str, str]) -> Any:
    from opsconsole.actions.plan import Plan, Refused
    from opsconsole.checkpoints.cleanup import plan_directory
    from opsconsole.checkpoints.scan import scan_directory

    why = unavailable()
    if why:
        raise Refused(why)
    if not target.path:
        raise Refused("no checkpoint directory selected")
    entry = configured_dir(ctx.config, target.node, target.path)
    if entry is None:
        raise Refused(
            "%s on %s is not a [[checkpoints]] directory of the config: not cleaned"
            % (printable_line(target.path), printable_line(target.node))
        )
    state = ctx.get_state()
    if not ctx.local and (state is None or not state.is_live):
        # The fleet owns logging in: no SFTP login to a node waiting in auth or hostkey, or down.
        raise Refused(
            "%s is %s: its checkpoints are not cleaned until it is connected"
            % (printable_line(target.node), state.state if state is not None else "unknown")
        )
    fs = _filesystem(ctx, target.node)
    try:
        listing = await asyncio.to_thread(scan_directory, root_of(target.path, fs), fs)
        retention = await asyncio.to_thread(
            plan_directory, listing, fs, keep=entry.keep, min_age=entry.min_age, now=time.time()
        )
    except OSError as exc:
        raise Refused(printable_line("%s on %s: %s" % (target.path, target.node, exc.strerror or exc))) from None
    finally:
        await _close(fs, ctx)
    doomed = retention.to_delete
    if not doomed:
        raise Refused("nothing to delete in %s (keep %d, min age %g s)" % (target.path, entry.keep, entry.min_age))
    notes = [
        "deletes %d of %d, frees %s; kept: the newest %d, best, latest's target, open and recent files"
        % (len(doomed), len(retention.items), format_bytes(retention.bytes_freed), entry.keep)
    ]
    kept = [item for item in retention.items if not item.delete]
    # Every deletion up to the limit, and what is kept and why (best, latest), so the plan can be judged.
    for item in doomed[:LISTED_ITEMS] + kept[:LISTED_ITEMS]:
        notes.append(
            "%-6s %s (%s): %s"
            % (
                "delete" if item.delete else "keep",
                printable_line(item.name),
                format_bytes(item.size_bytes),
                printable_line(item.reason),
            )
        )
    if len(doomed) > LISTED_ITEMS or len(kept) > LISTED_ITEMS:
        notes.append("... and %d more" % (max(0, len(doomed) - LISTED_ITEMS) + max(0, len(kept) - LISTED_ITEMS)))
    notes.extend("warning: %s" % printable_line(w) for w in retention.warnings)
    argv = cleanup_argv(target.node, target.path, entry.keep, entry.min_age, ctx.local)
    where = (
        "on this machine (%s)" % target.node
        if ctx.local
        else "on %s over SSH (listed by SFTP, deleted by a pinned helper on the node)" % target.node
    )
    word = posixpath.basename(posixpath.normpath(target.path)) or target.path
    return Plan(action, target, argv, where, notes=tuple(notes), word=word, payload=retention)


def _outcome_word(item: Any) -> str:
    """deleted, kept, or partly (some of the unit went before it failed: it is no longer whole)."""
    if item.deleted:
        return "deleted"
    return "partly " if item.went else "kept   "


async def run_cleanup(plan: Any, ctx: Any) -> Any:
    from opsconsole.actions.plan import ActionReport
    from opsconsole.actions.runner import CommandResult
    from opsconsole.checkpoints.cleanup import execute_plan

    retention = plan.payload
    lines = []

    async def execute() -> CommandResult:
        fs = _filesystem(ctx, plan.target.node)
        try:
            result = await asyncio.to_thread(
                execute_plan,
                retention,
                root_of(plan.target.path, fs),
                ctx.runner.audit,
                fs=fs,
                read_only=ctx.config.console.read_only,
            )
        finally:
            await _close(fs, ctx)
        lines.append(printable_line(result.summary()))
        for item in result.results:
            lines.append(
                printable_line(
                    "%s %s%s" % (_outcome_word(item), item.path, "" if item.deleted else ": %s" % item.error)
                )
            )
        lines.extend(printable_line("not attempted %s" % path) for path in result.remaining)
        if result.stopped:
            lines.append(printable_line("stopped: %s" % result.stopped))  # last: the result record's summary
        return CommandResult(
            0 if result.ok else 1, stdout="\n".join(lines[1:]), error=None if result.refused is None else lines[0]
        )

    outcome = await ctx.runner.run("checkpoint_cleanup", plan.target.node, plan.target.describe(), plan.argv, execute)
    if not outcome.ran:
        lines = ["NOT RUN: %s" % outcome.audit_problem]
    return ActionReport(
        outcome.ok, "Cleanup of %s on %s" % (plan.target.path, plan.target.node), tuple(lines), (outcome,)
    )
