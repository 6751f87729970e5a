"""Carrying out a retention plan: only inside the root, never through a symlink, audited first.

Each deletion is checked again at the moment it happens (the plan may be minutes old):
the path must still be a direct child of the root (by realpath), must not be a symlink
(lstat), and must have the size and mtime the plan saw; otherwise it is skipped with the
reason. Its audit record is written before the deletion. One failed deletion never stops the
rest: results are per file. An audit record that cannot be written (disk full, permission)
stops the cleanup before the next deletion: the result says what was deleted, what remains
and why it stopped.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

from opsconsole.actions.audit import OUTCOME_CONFIRMED, OUTCOME_FAILED, OUTCOME_OK, OUTCOME_REFUSED
from opsconsole.checkpoints.access import LOCAL, FileSystem
from opsconsole.checkpoints.retention import PlanItem, RetentionPlan, entry_in_root

ACTION_DELETE = "checkpoint.delete"
ACTION_CLEANUP = "checkpoint.cleanup"


@dataclass(frozen=True)
class FileResult:
    """What happened to one planned deletion."""

    path: str
    deleted: bool
    size_bytes: int
    error: Optional[str] = None


@dataclass(frozen=True)
class CleanupResult:
    """Per-file results of one executed plan; `refused` when nothing was attempted at all.

    `stopped` says why the cleanup stopped early (the audit log failed), `remaining` the planned
    paths it did not reach.
    """

    root: str
    node: str
    results: Tuple[FileResult, ...] = ()
    refused: Optional[str] = None
    warnings: Tuple[str, ...] = field(default_factory=tuple)
    stopped: Optional[str] = None
    remaining: Tuple[str, ...] = ()

    @property
    def deleted(self) -> List[FileResult]:
        return [r for r in self.results if r.deleted]

    @property
    def failed(self) -> List[FileResult]:
        return [r for r in self.results if not r.deleted]

    @property
    def bytes_freed(self) -> int:
        return sum(r.size_bytes for r in self.results if r.deleted)

    @property
    def ok(self) -> bool:
        return self.refused is None and self.stopped is None and not self.failed

    def summary(self) -> str:
        """One line: `deleted 3 of 3 (1.2 GiB freed)`, with the first failure and why it stopped, if so.

        Names in it are as found on disk: printers pass it through sanitize.printable_line.
        """
        if self.refused:
            return "cleanup refused: %s" % self.refused
        planned = len(self.results) + len(self.remaining)
        text = "deleted %d of %d (%s freed)" % (len(self.deleted), planned, _size_text(self.bytes_freed))
        if self.failed:
            first = self.failed[0]
            text += "; %d failed: %s: %s" % (len(self.failed), posixpath.basename(first.path), first.error)
        if self.stopped:
            text += "; STOPPED, %d not attempted: %s" % (len(self.remaining), self.stopped)
        return text

    def to_json(self) -> dict:
        return {
            "dir": self.root,
            "node": self.node,
            "refused": self.refused,
            "stopped": self.stopped,
            "bytes_freed": self.bytes_freed,
            "results": [{"path": r.path, "deleted": r.deleted, "size_bytes": r.size_bytes, "error": r.error} for r in self.results],
            "remaining": list(self.remaining),
        }


def _size_text(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return ("%d %s" if unit == "B" else "%.1f %s") % (value, unit)
        value /= 1024.0
    return "%d B" % value


AuditWriter = Callable[[str, str, str, str], Optional[str]]


def audit_writer(audit: Any) -> AuditWriter:
    """A writer returning None when written, else why not: from an AuditLog or a callable.

    The console's `app.audit(action, node, detail, outcome)` returns True when written;
    AuditLog.write returns None when written and a message otherwise. Both are accepted.
    A writer that raises (the console gone while a worker deletes) counts as not written.
    """
    target = audit.write if hasattr(audit, "write") else audit

    def write(action: str, node: str, detail: str, outcome: str) -> Optional[str]:
        try:
            answer = target(action, node, detail, outcome)
        except Exception as exc:
            return "the audit log could not be written: %s" % (str(exc) or type(exc).__name__)
        if answer is True or answer is None:
            return None
        if answer is False:
            return "the audit log could not be written"
        return str(answer)

    return write


def _check_still_planned(fs: FileSystem, item: PlanItem, root: str, root_real: str) -> Optional[str]:
    """Why `item` must not be deleted now (None when it may)."""
    if not entry_in_root(posixpath.normpath(item.path), posixpath.normpath(root)):
        return "not a plain name inside %s" % root
    try:
        parent_real = fs.realpath(posixpath.dirname(item.path))
    except OSError as exc:
        return "cannot resolve its directory: %s" % (exc.strerror or exc)
    if parent_real.rstrip("/") != root_real.rstrip("/"):
        return "outside the configured directory %s (resolves into %s)" % (root_real, parent_real)
    try:
        st = fs.lstat(item.path)
    except FileNotFoundError:
        return "already gone"
    except OSError as exc:
        return "cannot lstat: %s" % (exc.strerror or exc)
    if st.is_link:
        return "is a symlink now: never followed for deletion"
    if item.is_dir != st.is_dir or not (st.is_dir or st.is_file):
        return "changed kind since the plan"
    if not item.is_dir and (st.size != item.size_bytes or abs(st.mtime - item.mtime) > 1e-6):
        return "changed since the plan (size or mtime): not deleted"
    return None


def execute_plan(
    plan: RetentionPlan,
    root: str,
    audit: Any,
    *,
    fs: FileSystem = LOCAL,
    read_only: bool = False,
    user_detail: str = "",
) -> CleanupResult:
    """Delete the plan's `delete` items inside `root`; per-file results (see the module docstring).

    `audit` is an AuditLog or a callable `(action, node, detail, outcome)`; `read_only`
    refuses before anything is touched (and audits the refusal).
    """
    write = audit_writer(audit)
    node = plan.node or fs.node
    targets = plan.to_delete
    if read_only:
        problem = write(ACTION_CLEANUP, node, "read-only: %d deletions in %s refused" % (len(targets), root), OUTCOME_REFUSED)
        return CleanupResult(root, node, refused="read-only console: deleting is off" + _unaudited(problem))
    if posixpath.normpath(plan.root or root) != posixpath.normpath(root):
        problem = write(ACTION_CLEANUP, node, "plan for %s executed against %s: refused" % (plan.root, root), OUTCOME_REFUSED)
        return CleanupResult(root, node, refused="the plan is for %s, not %s%s" % (plan.root, root, _unaudited(problem)))
    try:
        root_real = fs.realpath(root)
    except OSError as exc:
        return CleanupResult(root, node, refused="cannot resolve %s: %s" % (root, exc.strerror or exc))
    results: List[FileResult] = []

    def stopped(at: int, why: str) -> CleanupResult:
        remaining = tuple(item.path for item in targets[at:])
        return CleanupResult(root, node, tuple(results), warnings=plan.warnings, stopped=why, remaining=remaining)

    for index, item in enumerate(targets):
        detail = "delete %s (%d bytes; %s)%s" % (item.path, item.size_bytes, item.reason, user_detail)
        why_not = _check_still_planned(fs, item, root, root_real)
        if why_not is not None:
            results.append(FileResult(item.path, False, item.size_bytes, why_not))
            problem = write(ACTION_DELETE, node, "%s: skipped: %s" % (detail, why_not), OUTCOME_REFUSED)
            if problem:
                return stopped(index + 1, problem)
            continue
        problem = write(ACTION_DELETE, node, detail, OUTCOME_CONFIRMED)
        if problem:  # no record, no deletion: and the next ones would fare no better
            return stopped(index, problem)
        try:
            if item.is_dir:
                fs.rmtree(item.path)
            else:
                fs.remove(item.path)
        except (OSError, ValueError) as exc:  # ValueError: a name the remote side cannot encode
            error = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            results.append(FileResult(item.path, False, item.size_bytes, error))
            problem = write(ACTION_DELETE, node, "%s: %s" % (detail, error), OUTCOME_FAILED)
        else:
            results.append(FileResult(item.path, True, item.size_bytes))
            problem = write(ACTION_DELETE, node, "%s: deleted" % detail, OUTCOME_OK)
        if problem:
            return stopped(index + 1, "result of %s not recorded: %s" % (posixpath.basename(item.path), problem))
    return CleanupResult(root, node, tuple(results), warnings=plan.warnings)


def _unaudited(problem: Optional[str]) -> str:
    return "" if problem is None else " (and the refusal was not recorded: %s)" % problem


def plan_directory(listing: Any, fs: FileSystem = LOCAL, *, keep: int, min_age: float, now: float) -> RetentionPlan:
    """The retention plan of a scanned directory, with the open-file check done first."""
    from opsconsole.checkpoints.remote import open_files_for
    from opsconsole.checkpoints.retention import plan_retention

    warnings: List[str] = []
    if listing.problem:
        warnings.append(listing.problem)
    try:
        opened = open_files_for(fs, listing.root)
        open_paths = opened.paths
        if opened.note:
            warnings.append(opened.note)
    except Exception as exc:  # psutil or the node failing must not block the plan; it is shown
        open_paths = frozenset()
        warnings.append("open-file check failed: %s" % exc)
    return plan_retention(
        listing.entries, keep=keep, min_age=min_age, now=now, open_paths=open_paths,
        root=listing.root, node=listing.node, warnings=warnings,
    )
