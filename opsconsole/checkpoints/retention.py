"""The retention plan: which checkpoint units to keep and which to delete, each with its reason. Pure.

Only members of a recognised series are candidates (checkpoint_epoch_N.pt, Lightning's
ModelCheckpoint files where its callback state was read, checkpoint-N/, checkpoint_N/,
global_stepN/, iter_N/, step-N/, numbered files of a training loop); everything else (a final
model, a sharded model, a lone state dict without epoch or step, configs, legacy pickles,
unknown files, links) is "not managed" and never deleted. A unit goes whole or not at all: the
plan item is the unit, with its member paths.

Kept, whatever `keep` says: what the library recorded (best, top-k, latest, the current tag),
anything modified within `min_age` (it may be mid-write), anything a process holds open, and a
unit whose metadata could not be read (our limits are not damage). Of each series the newest
`keep` sound units stay, newest by the step (else epoch) the name or content records, then
mtime, then the name in natural order. A truncated or corrupt unit (proven damage) takes no
keep place: with keep=3 and a crashed save, three good checkpoints remain.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Collection, Dict, Iterable, List, Optional, Sequence, Tuple

from opsconsole.checkpoints.records import BROKEN, FORMAT_LINK, CheckpointEntry
from opsconsole.checkpoints.scan import natural_key, stands_as_best
from opsconsole.units import format_duration

DEFAULT_KEEP = 3
DEFAULT_MIN_AGE_S = 600.0
# Units a plan's (and a cleanup result's) --json names one by one, in order; the rest are counted. A
# directory the libraries keep (save_total_limit, top-k, a loop saving every N steps) holds tens to
# hundreds, listed whole; one of 100,000 units would make a document of tens of MB (about 430 bytes a
# unit), and every unit is in the audit log and the text plan.
SHOWN_UNITS = 1000


@dataclass(frozen=True)
class PlanItem:
    """One checkpoint in the plan: delete or keep, and why."""

    path: str
    name: str
    size_bytes: int
    mtime: float
    delete: bool
    reasons: Tuple[str, ...]
    is_dir: bool = False
    members: Tuple[str, ...] = ()  # the unit's paths relative to the plan's root (a directory whole): all or none
    layout: str = ""
    unit: str = ""
    series: Optional[str] = None  # None: not managed (never deleted)
    members: Tuple[str, ...] = ()  # the unit's files/dirs relative to the plan's root; default: path's name
    judged: Tuple[Tuple[Any, ...], ...] = ()  # CheckpointEntry.judged: what the verdict was made from
    # Non-empty on a kept unit that justifies deleting older ones of its series (one of the newest
    # `keep` good ones, or what the library recorded: best, top-k, latest), in words ("the newest
    # kept checkpoint"): the deleter re-checks it is still as judged before anything goes.
    vouches: str = ""

    def __post_init__(self) -> None:
        if not self.members:
            object.__setattr__(self, "members", (posixpath.basename(self.path.rstrip("/")),))

    @property
    def action(self) -> str:
        return "delete" if self.delete else "keep"

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class RetentionPlan:
    """Every checkpoint of one directory with its verdict; `bytes_freed` is what deleting frees."""

    root: str
    node: str
    keep: int
    min_age: float
    items: Tuple[PlanItem, ...]
    warnings: Tuple[str, ...] = ()

    @property
    def to_delete(self) -> List[PlanItem]:
        return [item for item in self.items if item.delete]

    @property
    def bytes_freed(self) -> int:
        return sum(item.size_bytes for item in self.items if item.delete)

    @property
    def bytes_kept(self) -> int:
        return sum(item.size_bytes for item in self.items if not item.delete)

    def to_json(self) -> dict:
        """The --json shape: the first SHOWN_UNITS units in `plan`, in the plan's order (newest first), how
        many more in `plan_more`, and the whole plan's counts (`units`, `units_to_delete`)."""
        return {
            "dir": self.root,
            "node": self.node,
            "keep": self.keep,
            "min_age_s": self.min_age,  # seconds: the unit in the key, as size_bytes and bytes_freed
            "bytes_freed": self.bytes_freed,
            "warnings": list(self.warnings),
            "units": len(self.items),
            "units_to_delete": len(self.to_delete),
            "plan": [
                {
                    "path": i.path,
                    "action": i.action,
                    "reasons": list(i.reasons),
                    "size_bytes": i.size_bytes,
                    "mtime": i.mtime,
                    "layout": i.layout,
                    "unit": i.unit,
                    "series": i.series,
                    "managed": i.series is not None,
                    "members": list(i.members),
                }
                for i in self.items[:SHOWN_UNITS]
            ],
            "plan_more": max(0, len(self.items) - SHOWN_UNITS),
        }


def newness_key(entry: CheckpointEntry) -> Tuple:
    """Sort key within a series, oldest first: the step (else epoch) recorded, then mtime, then the natural name order.

    The number a library writes into the name or the checkpoint orders a series as that library
    does (a copied or touched file keeps its place); mtime and the name break ties.
    """
    step = entry.meta.step if entry.meta.step is not None else -1
    epoch = entry.meta.epoch if entry.meta.epoch is not None else -1
    return (step, epoch, entry.mtime, natural_key(entry.name))


def age_text(seconds: float) -> str:
    """`45s`, `12m05s`, `3h00m`, `2d12h` (opsconsole.units.format_duration)."""
    return format_duration(seconds)


def _is_open(entry: CheckpointEntry, open_paths: Collection[str]) -> bool:
    for path in open_paths:
        if path == entry.path or (entry.is_dir and path.startswith(entry.path.rstrip("/") + "/")):
            return True
    return False


def plan_retention(
    entries: Sequence[CheckpointEntry],
    *,
    keep: int = DEFAULT_KEEP,
    min_age: float = DEFAULT_MIN_AGE_S,
    now: float,
    open_paths: Collection[str] = (),
    root: str = "",
    node: str = "local",
    warnings: Iterable[str] = (),
) -> RetentionPlan:
    """Decide, for every unit, keep or delete (see the module docstring). Pure: no I/O, no clock."""
    if keep < 0:
        raise ValueError("keep must be 0 or more, got %d" % keep)
    if min_age < 0:
        raise ValueError("min_age must be 0 or more, got %g" % min_age)
    protected: Dict[str, List[str]] = {}
    for entry in entries:
        reasons: List[str] = []
        if entry.format == FORMAT_LINK or entry.is_link:
            reasons.append("symlink: never deleted, never followed")
        elif entry.series is None:
            reasons.append("not managed: %s" % (entry.unmanaged or "not a member of a recognised checkpoint series"))
        elif entry.unmanaged:
            reasons.append("not managed here: %s" % entry.unmanaged)
        reasons.extend(_recorded(entry))
        if entry.unreadable and entry.integrity not in BROKEN:
            reasons.append(
                entry.unreadable
                if entry.unreadable.startswith("could not read")
                else "could not read: %s" % entry.unreadable
            )
        age = now - entry.mtime
        if age < 0:
            reasons.append("modified in the future (clock skew?)")
        elif age < min_age:
            reasons.append("modified %s ago, under min_age %s: may be mid-write" % (age_text(age), age_text(min_age)))
        if _is_open(entry, open_paths):
            reasons.append("open by a process")
        protected[entry.path] = reasons

    series: Dict[str, List[CheckpointEntry]] = {}
    for entry in entries:
        if _candidate(entry):
            series.setdefault(entry.series or "", []).append(entry)
    newest: Dict[str, str] = {}
    broken: Dict[str, str] = {}
    for name, members in series.items():
        places = 0
        for entry in sorted(members, key=newness_key, reverse=True):
            if entry.integrity in BROKEN:
                broken[entry.path] = "%s: takes no keep place" % entry.integrity
                continue
            if entry.unreadable:
                continue  # kept for that reason; it vouches for nothing
            if places < keep:
                places += 1
                newest[entry.path] = "newest %d of %s (#%d)" % (keep, name, places)

    # CheckpointManager's checkpoint_best.pt (any sound best copy outside the series): the listing marks
    # no epoch best while it is sound, so the lowest-loss epoch may go, its weights then only in the
    # copy. When the plan deletes that epoch the copy vouches too: re-checked before anything goes.
    lowest_doomed = any(
        entry.lowest_loss and _candidate(entry) and not protected[entry.path] and entry.path not in newest
        for entry in entries
    )
    items: List[PlanItem] = []
    for entry in sorted(entries, key=lambda e: (e.mtime,) + newness_key(e), reverse=True):
        reasons = list(protected[entry.path])
        if entry.path in newest:
            reasons.insert(0, newest[entry.path])
        delete = False
        if not reasons:
            delete = True
            if entry.path in broken:
                reasons = ["%s and older than min_age" % broken[entry.path].split(":")[0]]
            else:
                reasons = ["older than the newest %d of %s" % (keep, entry.series)]
        elif entry.path in broken:
            reasons.append(broken[entry.path])
        vouches = ""
        if not delete and _candidate(entry) and entry.judged and entry.path not in broken and not entry.unreadable:
            if entry.path in newest:
                vouches = "the newest kept checkpoint"
            elif _recorded(entry):
                words = [reason.split()[0].rstrip(":;,") for reason in _recorded(entry) if reason.split()]
                vouches = "the kept %s checkpoint" % "/".join(dict.fromkeys(words))
        elif (
            lowest_doomed
            and entry.best
            and not _candidate(entry)
            and not entry.is_link
            and entry.format != FORMAT_LINK
            and entry.judged
            and stands_as_best(entry)
        ):
            vouches = "the best copy"
        items.append(
            PlanItem(
                entry.path,
                entry.name,
                entry.size_bytes,
                entry.mtime,
                delete,
                tuple(reasons),
                entry.is_dir,
                members=entry.members or (posixpath.basename(entry.path),),
                layout=entry.layout,
                unit=entry.unit,
                series=entry.series,
                judged=entry.judged,
                vouches=vouches,
            )
        )
    return RetentionPlan(root=root, node=node, keep=keep, min_age=min_age, items=tuple(items), warnings=tuple(warnings))


def _candidate(entry: CheckpointEntry) -> bool:
    """A member of a recognised series that this plan may delete: not a link, not marked unmanaged."""
    return entry.series is not None and not entry.unmanaged and not entry.is_link and entry.format != FORMAT_LINK


def _recorded(entry: CheckpointEntry) -> List[str]:
    """What the library recorded that keeps this unit (best, top-k, latest, current tag)."""
    reasons = list(entry.protections)
    words = " ".join(reasons)
    if entry.best and "best" not in words:
        reasons.append("best")
    if entry.latest and "latest" not in words and "current" not in words:
        reasons.append("latest")
    return reasons


def entry_in_root(path: str, root: str) -> bool:
    """Whether `path` names a direct child of `root` (no `..`, no deeper path)."""
    parent, name = posixpath.split(path.rstrip("/"))
    return parent.rstrip("/") == root.rstrip("/") and name not in ("", ".", "..")
