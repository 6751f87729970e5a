"""Carrying out a retention plan on the directory it was made for, unit by unit, never on files in use.

When the plan is made (`plan_directory`, `pin_plan`) the directory is opened with
O_DIRECTORY|O_NOFOLLOW and its identity (st_dev, st_ino) recorded, with every doomed unit's
members: each directory's exact entries and each file's device, inode, size and mtime AS THE
LISTING SAW THEM when it judged the unit (PlanItem.judged), not as they are when the plan is
pinned: a file rewritten between the listing and the pin keeps the old identity in the plan,
so the deleter finds it changed and keeps the unit. A file the listing did not judge (one that
appeared since) is left out of the records, so its presence keeps the unit too. A unit that
cannot be pinned (gone, a symlink) or whose files were not all judged is kept, with the reason.

At execution the directory is opened again the same way and must be the same one: a root
swapped for a symlink or another directory while the confirmation waited is refused whole,
audited. Each unit is then checked whole (every member as recorded, none open or mapped by a
process) and its audit record written before it is deleted, relative to the directory's
descriptor, never following a link (probe/delete_units.py: in this process for a local
directory, on the node over its SSH connection for a remote one). A changed or busy unit is
kept with the reason; a unit that fails midway is reported with the members that went. One
failed unit never stops the rest; an audit record that cannot be written stops the cleanup
before the next deletion: the result says what was deleted, what remains and why it stopped.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from opsconsole.audit_outcomes import OUTCOME_CONFIRMED, OUTCOME_FAILED, OUTCOME_OK, OUTCOME_REFUSED
from opsconsole.checkpoints.access import LOCAL, FileSystem
from opsconsole.checkpoints.retention import SHOWN_UNITS, PlanItem, RetentionPlan
from opsconsole.probe import delete_units
from opsconsole.sanitize import escaped, printable_json
from opsconsole.units import format_bytes

ACTION_DELETE = "checkpoint.delete"
# The registry's id for this action (opsconsole/actions/registry.py): the console's runner records, the
# refusals written here and `opsconsole cleanup`'s name one action one way in the audit log.
ACTION_CLEANUP = "checkpoint_cleanup"
NS_PER_S = 1_000_000_000
SHOWN_MEMBERS = 8


@dataclass(frozen=True)
class FileResult:
    """What happened to one planned unit; `went` names its members deleted when it failed midway."""

    path: str
    deleted: bool
    size_bytes: int
    error: Optional[str] = None
    went: Tuple[str, ...] = ()

    def partly_deleted(self) -> Optional[Dict[str, Any]]:
        """A unit that failed part way, in numbers: files that went of the unit's, entries (files and
        directories) that went, the first SHOWN_MEMBERS of them and how many more; None when nothing
        went. Bounded whatever the unit's size: every name is in the audit record (_went_in_full)."""
        if not self.went:
            return None
        files_went, files, _ = _partial_reason(self.error or "", self.went)
        return {
            "files_went": files_went,
            "files": files,
            "entries_went": len(self.went),
            "went": list(self.went[:SHOWN_MEMBERS]),
            "more": max(0, len(self.went) - SHOWN_MEMBERS),
        }

    def cause(self) -> Optional[str]:
        """Why the unit was not deleted, without the names of what went (partly_deleted has those)."""
        if not self.went or self.error is None:
            return self.error
        return _partial_reason(self.error, self.went)[2]


_PARTLY = re.compile(r"^partly deleted: (\d+) of (\d+) files went, the unit is no longer whole \(went: ")


def _partial_reason(error: str, went: Tuple[str, ...]) -> Tuple[int, Optional[int], str]:
    """(files that went, files of the unit or None, the cause) of the deleter's 'partly deleted: N of M
    files went, the unit is no longer whole (went: NAMES): CAUSE' (probe/delete_units.py)."""
    files_went = sum(1 for rel in went if not rel.endswith("/"))
    match = _PARTLY.match(error)
    if match is None:
        return files_went, None, error
    shown = delete_units.SHOWN_NAMES  # the names as the deleter wrote them (its _names)
    names = ", ".join(went[:shown]) + (" and %d more" % (len(went) - shown) if len(went) > shown else "")
    prefix = match.group(0) + names + "): "
    cause = error[len(prefix) :] if error.startswith(prefix) else error
    return int(match.group(1)), int(match.group(2)), cause


# What the audit record of a unit that failed part way names of what went: every entry, up to this
# many bytes of names as the record holds them (the Audit pane reads the log's last 512 KiB: one
# record must not fill it).
AUDIT_WENT_BYTES = 64 * 1024


def _written_bytes(name: str) -> int:
    """The bytes `name` takes in an audit record's JSON line: a control character is six there
    (\\u001b), an undecodable byte five, a non-ASCII character up to four; whichever way the record's
    detail is written (escaped whole when any of its text holds an undecodable byte: sanitize)."""
    plain = printable_json(name)
    if name.isascii() and len(plain) == len(name) + 2:
        return len(name)  # nothing escaped: the usual name
    return max(len(plain.encode("utf-8")), len(printable_json(escaped(name)).encode("utf-8"))) - 2


def _went_in_full(went: Tuple[str, ...]) -> str:
    """Every entry that went, for the audit record, when the reason names only the first few."""
    if len(went) <= delete_units.SHOWN_NAMES:
        return ""
    names: List[str] = []
    size = 0
    for rel in went:
        size += _written_bytes(rel) + 2
        if size > AUDIT_WENT_BYTES:
            break
        names.append(rel)
    more = len(went) - len(names)
    return "; every entry that went (%d): %s%s" % (
        len(went),
        ", ".join(names),
        " and %d more (over %d bytes of names)" % (more, AUDIT_WENT_BYTES) if more else "",
    )


@dataclass(frozen=True)
class CleanupResult:
    """Per-unit results of one executed plan; `refused` when nothing was attempted at all.

    `stopped` says why the cleanup stopped early (the audit log failed, the node went away),
    `remaining` the planned paths it did not reach.
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
        text = "deleted %d of %d (%s freed)" % (len(self.deleted), planned, format_bytes(self.bytes_freed))
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
            "units_deleted": len(self.deleted),
            "units_failed": len(self.failed),
            # Bounded whatever the units hold: a unit that failed part way gives counts and the first
            # names of what went (partly_deleted), its error the cause alone; the audit record has every name.
            # And whatever the directory holds: SHOWN_UNITS results, in the plan's order, and how many more
            # (the counts above are of them all), as the plan's units; every failure among them while
            # there is room (shown_results).
            "results": [
                {
                    "path": r.path,
                    "deleted": r.deleted,
                    "size_bytes": r.size_bytes,
                    "error": r.cause(),
                    "partly_deleted": r.partly_deleted(),
                }
                for r in shown_results(self.results)
            ],
            "results_more": max(0, len(self.results) - SHOWN_UNITS),
            # The planned units it stopped before (the audit log failed, the node went away): the first
            # SHOWN_MEMBERS and how many more, as partly_deleted names what went.
            "remaining": list(self.remaining[:SHOWN_MEMBERS]),
            "remaining_more": max(0, len(self.remaining) - SHOWN_MEMBERS),
        }


def shown_results(results: Tuple[FileResult, ...]) -> Tuple[FileResult, ...]:
    """The results --json names, in their order: all when SHOWN_UNITS or fewer, else the units not
    deleted first (up to SHOWN_UNITS: what went wrong is what a reader looks for) and the first deleted
    ones in the room left."""
    if len(results) <= SHOWN_UNITS:
        return results
    failed = [i for i, r in enumerate(results) if not r.deleted][:SHOWN_UNITS]
    room = SHOWN_UNITS - len(failed)
    deleted = [i for i, r in enumerate(results) if r.deleted][:room]
    return tuple(results[i] for i in sorted(failed + deleted))


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


# --- the pin: what the plan was made for ------------------------------------------------------------


@dataclass(frozen=True)
class UnitPin:
    """One doomed unit as it was when the plan was made: its members and the records of everything in them.

    A record is (path relative to the root, kind d/f/l/o, st_dev, st_ino, size, mtime_ns), a
    file's with its ctime_ns after them (-1: not known, not compared).
    """

    path: str
    members: Tuple[str, ...]
    records: Tuple[Tuple[Any, ...], ...]
    label: str = ""  # on a kept unit that vouches for the deletions: what it is, in words


@dataclass(frozen=True)
class RootPin:
    """The directory the plan was made for (st_dev, st_ino of its O_NOFOLLOW descriptor) and its pinned units.

    `kept`: the kept units that justify the deletions (PlanItem.vouches), as judged: if one of
    them changed or is gone when the plan runs, nothing is deleted.
    """

    root: str
    dev: int
    ino: int
    units: Tuple[UnitPin, ...] = ()
    kept: Tuple[UnitPin, ...] = ()


@dataclass(frozen=True)
class PinnedPlan(RetentionPlan):
    """A RetentionPlan with the identities execute_plan checks; `pin` None: nothing can be deleted."""

    pin: Optional[RootPin] = None


def unit_members(item: PlanItem) -> Tuple[str, ...]:
    """The unit's members, relative to the plan's root (PlanItem.members; the name in path as a default)."""
    members = tuple(getattr(item, "members", ()) or ())
    return members or (posixpath.basename(item.path.rstrip("/")),)


def _kept(item: PlanItem, why: str) -> PlanItem:
    return replace(item, delete=False, reasons=tuple(item.reasons) + ("not deleted: %s" % why,))


def _as_judged(
    records: Tuple[Tuple[Any, ...], ...], judged: Tuple[Tuple[Any, ...], ...]
) -> Tuple[Tuple[Any, ...], ...]:
    """The pinned records with every file's identity the one the listing judged (module docstring).

    A judged file is recorded as judged: (rel, "f", dev, ino, size, mtime_ns); one the pin did
    not find is recorded all the same (gone since it was judged, the deleter says). A file the
    pin found that the listing did not judge is left out (appeared since it was judged). Where
    the listing had no device and inode (SFTP: dev -1) the pin's record stands when its size and
    its mtime to the second are the judged ones, else the judged size and mtime are recorded,
    which the deleter then finds changed.
    """
    wanted = {file[0]: file for file in judged}
    out: List[Tuple[Any, ...]] = []
    for record in records:
        file = wanted.pop(record[0], None)
        if file is None:
            if record[1] != "f":
                out.append(record)  # a directory, a link or a FIFO inside the unit: as pinned
            continue
        rel, dev, ino, size, mtime_ns, ctime_ns = _judged_fields(file)
        if dev != -1:
            out.append((rel, "f", dev, ino, size, mtime_ns, ctime_ns))
        elif record[1] == "f" and record[4] == size and record[5] // NS_PER_S == mtime_ns // NS_PER_S:
            out.append(record)  # with the ctime the node gave at the pin, where it gave one
        else:
            out.append((rel, "f", record[2], record[3], size, mtime_ns, -1))
    out.extend(
        (rel, "f", dev, ino, size, mtime_ns, ctime_ns)
        for rel, dev, ino, size, mtime_ns, ctime_ns in map(_judged_fields, wanted.values())
    )
    return tuple(out)


def _judged_fields(file: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """(rel, dev, ino, size, mtime_ns, ctime_ns) of a judged file; ctime -1 where the listing had none."""
    return tuple(file[:5]) + ((file[5] if len(file) > 5 else -1),)


def _valid_records(value: Any) -> Optional[Tuple[Tuple[Any, ...], ...]]:
    """The records of a pin answer when each is [str, kind, int, int, int, int] (a file's with its ctime_ns
    after them); None otherwise (it may come from a node)."""
    if not isinstance(value, list) or not value:
        return None
    records = []
    for record in value:
        if (
            not isinstance(record, list)
            or len(record) not in (6, 7)
            or not isinstance(record[0], str)
            or record[1] not in ("d", "f", "l", "o")
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in record[2:])
        ):
            return None
        records.append(tuple(record))
    return tuple(records)


def pin_plan(plan: RetentionPlan, fs: FileSystem = LOCAL) -> PinnedPlan:
    """The plan with its directory and doomed units pinned; a unit that cannot be pinned is kept, with why."""
    base = {f.name: getattr(plan, f.name) for f in fields(RetentionPlan)}
    doomed = [item for item in plan.items if item.delete]
    warnings = list(plan.warnings)
    if not doomed:
        return PinnedPlan(**base)
    doomed_series = {item.series for item in doomed}
    # The newest kept of a series vouch for its deletions; a best copy outside any series (vouches set
    # only when the plan deletes the lowest-loss unit it stands for: retention.py) for the plan.
    vouchers = [
        item
        for item in plan.items
        if not item.delete and item.vouches and item.judged and (item.series in doomed_series or item.series is None)
    ]
    try:
        answer = fs.pin_units(plan.root, [list(unit_members(item)) for item in doomed + vouchers])
    except OSError as exc:
        answer = {"problem": "cannot pin the directory: %s" % (exc.strerror or exc)}
    root_id = answer.get("root_id") if isinstance(answer, dict) else None
    units = answer.get("units") if isinstance(answer, dict) else None
    if (
        not isinstance(root_id, list)
        or len(root_id) != 2
        or not all(isinstance(n, int) for n in root_id)
        or not isinstance(units, list)
        or len(units) != len(doomed) + len(vouchers)
    ):
        why = str(
            answer.get("problem")
            if isinstance(answer, dict) and answer.get("problem")
            else "the directory could not be pinned"
        )[:500]
        warnings.append("nothing will be deleted: %s" % why)
        items = tuple(_kept(item, why) if item.delete else item for item in plan.items)
        base.update(items=items, warnings=tuple(warnings))
        return PinnedPlan(**base)
    kept: List[UnitPin] = []
    for item, unit in zip(vouchers, units[len(doomed) :]):
        records = _valid_records(unit.get("tree")) if isinstance(unit, dict) else None
        if records is None:
            problem = unit.get("problem") if isinstance(unit, dict) else None
            why = "%s %s could not be pinned (%s): nothing deleted" % (
                item.vouches,
                item.name,
                str(problem or "no answer")[:300],
            )
            warnings.append(why)
            items = tuple(_kept(entry, why) if entry.delete else entry for entry in plan.items)
            base.update(items=items, warnings=tuple(warnings))
            return PinnedPlan(**base)
        kept.append(UnitPin(item.path, unit_members(item), _as_judged(records, item.judged), item.vouches))
    pins: List[UnitPin] = []
    verdicts: Dict[int, str] = {}
    for item, unit in zip(doomed, units):
        records = _valid_records(unit.get("tree")) if isinstance(unit, dict) else None
        if records is None:
            problem = unit.get("problem") if isinstance(unit, dict) else None
            verdicts[id(item)] = str(problem or "could not be pinned")[:500]
            continue
        judged = tuple(getattr(item, "judged", ()) or ())
        if not judged:
            verdicts[id(item)] = "the listing did not judge all of its files: never deleted"
            continue
        pins.append(UnitPin(item.path, unit_members(item), _as_judged(records, judged)))
    items = tuple(_kept(item, verdicts[id(item)]) if id(item) in verdicts else item for item in plan.items)
    base.update(items=items, warnings=tuple(warnings))
    return PinnedPlan(**base, pin=RootPin(plan.root, root_id[0], root_id[1], tuple(pins), tuple(kept)))


# --- execution ----------------------------------------------------------------------------------------


def _names(members: Tuple[str, ...]) -> str:
    text = ", ".join(members[:SHOWN_MEMBERS])
    return text + (" and %d more" % (len(members) - SHOWN_MEMBERS) if len(members) > SHOWN_MEMBERS else "")


def _describe(item: PlanItem, members: Tuple[str, ...], user_detail: str) -> str:
    text = "delete %s (%d bytes; %s)" % (item.path, item.size_bytes, item.reason)
    if len(members) > 1 or members[0] != posixpath.basename(item.path.rstrip("/")):
        text += " [unit of %d: %s]" % (len(members), _names(members))
    return text + user_detail


def execute_plan(
    plan: RetentionPlan,
    root: str,
    audit: Any,
    *,
    fs: FileSystem = LOCAL,
    read_only: bool = False,
    user_detail: str = "",
) -> CleanupResult:
    """Delete the plan's doomed units inside the directory it was made for; per-unit results (module docstring).

    `audit` is an AuditLog or a callable `(action, node, detail, outcome)`; `read_only`
    refuses before anything is touched (and audits the refusal). Only a plan from
    `plan_directory`/`pin_plan` can delete: one without the pin is refused.
    """
    write = audit_writer(audit)
    node = plan.node or fs.node
    targets = plan.to_delete

    def refuse(why: str, detail: str) -> CleanupResult:
        problem = write(ACTION_CLEANUP, node, detail, OUTCOME_REFUSED)
        return CleanupResult(root, node, refused=why + _unaudited(problem))

    if read_only:
        return refuse(
            "read-only console: deleting is off", "read-only: %d deletions in %s refused" % (len(targets), root)
        )
    if posixpath.normpath(plan.root or root) != posixpath.normpath(root):
        return refuse(
            "the plan is for %s, not %s" % (plan.root, root),
            "plan for %s executed against %s: refused" % (plan.root, root),
        )
    if not targets:
        return CleanupResult(root, node, warnings=plan.warnings)
    pin: Optional[RootPin] = getattr(plan, "pin", None)
    if pin is None:
        return refuse(
            "the plan was not pinned to its directory when it was made: nothing deleted",
            "unpinned plan for %s: %d deletions refused" % (root, len(targets)),
        )
    by_path = {unit.path: unit for unit in pin.units}
    planned: List[Tuple[PlanItem, Optional[int]]] = []
    pinned_units: List[UnitPin] = []
    for item in targets:
        unit = by_path.pop(item.path, None)  # popped: a path listed twice is pinned once
        if unit is None or unit.members != unit_members(item):
            planned.append((item, None))
        else:
            planned.append((item, len(pinned_units)))
            pinned_units.append(unit)
    try:
        session = fs.open_pinned(
            root,
            [pin.dev, pin.ino],
            [{"members": list(u.members), "tree": [list(r) for r in u.records]} for u in pinned_units]
            + [
                {"members": list(u.members), "tree": [list(r) for r in u.records], "kept": u.label or "a kept unit"}
                for u in getattr(pin, "kept", ())
            ],
        )
    except OSError as exc:
        return refuse(
            "cannot reach %s: %s" % (root, exc.strerror or exc),
            "%d deletions in %s refused: %s" % (len(targets), root, exc.strerror or exc),
        )
    if session.refused:
        return refuse(session.refused, "%d deletions in %s refused: %s" % (len(targets), root, session.refused))
    try:
        note = getattr(session, "note", None)
        warnings = plan.warnings + ((note,) if note and note not in plan.warnings else ())
        return _run_units(session, planned, warnings, root, node, write, user_detail)
    finally:
        session.close()


def _run_units(
    session: Any,
    planned: List[Tuple[PlanItem, Optional[int]]],
    warnings: Tuple[str, ...],
    root: str,
    node: str,
    write: AuditWriter,
    user_detail: str,
) -> CleanupResult:
    results: List[FileResult] = []

    def stopped(at: int, why: str) -> CleanupResult:
        remaining = tuple(item.path for item, _ in planned[at:])
        return CleanupResult(root, node, tuple(results), warnings=warnings, stopped=why, remaining=remaining)

    for position, (item, unit) in enumerate(planned):
        members = unit_members(item)
        detail = _describe(item, members, user_detail)
        if unit is None:
            why_not: Optional[str] = "not pinned when the plan was made: never deleted"
        else:
            try:
                why_not = session.check(unit)
            except OSError as exc:
                return stopped(position, "lost the directory before %s: %s" % (item.path, exc.strerror or exc))
        if why_not is not None:
            results.append(FileResult(item.path, False, item.size_bytes, why_not))
            problem = write(ACTION_DELETE, node, "%s: skipped: %s" % (detail, why_not), OUTCOME_REFUSED)
            if problem:
                return stopped(position + 1, problem)
            continue
        problem = write(ACTION_DELETE, node, detail, OUTCOME_CONFIRMED)
        if problem:  # no record, no deletion: and the next ones would fare no better
            return stopped(position, problem)
        lost: Optional[str] = None
        try:
            went, error = session.delete(unit)
        except OSError as exc:
            went, error = [], "no answer (whether it was deleted is unknown): %s" % (exc.strerror or exc)
            lost = error
        went_members = tuple(went)
        if error is None:
            results.append(FileResult(item.path, True, item.size_bytes))
            problem = write(ACTION_DELETE, node, "%s: deleted" % detail, OUTCOME_OK)
        else:
            results.append(FileResult(item.path, False, item.size_bytes, error, went_members))
            problem = write(
                ACTION_DELETE, node, "%s: %s%s" % (detail, error, _went_in_full(went_members)), OUTCOME_FAILED
            )
        if problem:
            return stopped(position + 1, "result of %s not recorded: %s" % (posixpath.basename(item.path), problem))
        if lost:
            return stopped(position + 1, lost)
    return CleanupResult(root, node, tuple(results), warnings=warnings)


def _unaudited(problem: Optional[str]) -> str:
    return "" if problem is None else " (and the refusal was not recorded: %s)" % problem


def plan_directory(listing: Any, fs: FileSystem = LOCAL, *, keep: int, min_age: float, now: float) -> PinnedPlan:
    """The retention plan of a scanned directory, with the open-file check done first and the result pinned."""
    from opsconsole.checkpoints.remote import open_files_for
    from opsconsole.checkpoints.retention import plan_retention

    warnings: List[str] = []
    if listing.problem:
        warnings.append(listing.problem)
    warnings.extend(getattr(listing, "warnings", ()))
    try:
        opened = open_files_for(fs, listing.root)
        open_paths = opened.paths
        if opened.note:
            warnings.append(opened.note)
    except Exception as exc:  # the node failing must not block the plan; it is shown
        open_paths = frozenset()
        warnings.append("open-file check failed: %s" % exc)
    plan = plan_retention(
        listing.entries,
        keep=keep,
        min_age=min_age,
        now=now,
        open_paths=open_paths,
        root=listing.root,
        node=listing.node,
        warnings=warnings,
    )
    return pin_plan(plan, fs)
