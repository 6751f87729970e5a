"""The retention plan: which checkpoints to keep and which to delete, each with its reason. Pure.

Kept, whatever `keep` says: the best, the target of `latest`, anything modified within
`min_age` (it may be mid-write), anything a process holds open, symlinks (cleanup deletes
checkpoints, never links) and anything whose format was not recognised. Of the rest the
newest `keep` stay: newest by mtime, ties broken by step, epoch, then the name in natural
order (epoch_10 after epoch_9). A truncated or corrupt checkpoint takes no `keep` place:
with keep=3 and a crashed save, three good checkpoints remain.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Collection, Iterable, List, Sequence, Tuple

from opsconsole.checkpoints.records import BROKEN, FORMAT_LINK, FORMAT_UNKNOWN, CheckpointEntry
from opsconsole.checkpoints.scan import is_best_name, natural_key

DEFAULT_KEEP = 3
DEFAULT_MIN_AGE_S = 600.0


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
    members: Tuple[str, ...] = ()  # the unit's files/dirs relative to the plan's root; default: path's name

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
        return {
            "dir": self.root,
            "node": self.node,
            "keep": self.keep,
            "min_age": self.min_age,
            "bytes_freed": self.bytes_freed,
            "warnings": list(self.warnings),
            "plan": [
                {"path": i.path, "action": i.action, "reasons": list(i.reasons), "size_bytes": i.size_bytes, "mtime": i.mtime}
                for i in self.items
            ],
        }


def newness_key(entry: CheckpointEntry) -> Tuple:
    """Sort key, oldest first: mtime, then step, epoch and the natural order of the name."""
    step = entry.meta.step if entry.meta.step is not None else -1
    epoch = entry.meta.epoch if entry.meta.epoch is not None else -1
    return (entry.mtime, step, epoch, natural_key(entry.name))


def age_text(seconds: float) -> str:
    """`45 s`, `12 min`, `3.0 h`, `2.5 d`."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return "%d s" % seconds
    if seconds < 7200:
        return "%d min" % (seconds // 60)
    if seconds < 172800:
        return "%.1f h" % (seconds / 3600)
    return "%.1f d" % (seconds / 86400)


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
    """Decide, for every entry, keep or delete (see the module docstring). Pure: no I/O, no clock."""
    if keep < 0:
        raise ValueError("keep must be 0 or more, got %d" % keep)
    if min_age < 0:
        raise ValueError("min_age must be 0 or more, got %g" % min_age)
    protected: dict = {}
    for entry in entries:
        reasons: List[str] = []
        if entry.format == FORMAT_LINK or entry.is_link:
            reasons.append("symlink: never deleted, never followed")
        if entry.format == FORMAT_UNKNOWN:
            reasons.append("format not recognised")
        if entry.best:
            reasons.append("best")
        if entry.latest:
            reasons.append("latest")
        age = now - entry.mtime
        if age < 0:
            reasons.append("modified in the future (clock skew?)")
        elif age < min_age:
            reasons.append("modified %s ago, under min_age %s: may be mid-write" % (age_text(age), age_text(min_age)))
        if _is_open(entry, open_paths):
            reasons.append("open by a process")
        protected[entry.path] = reasons

    ranked = sorted(
        (e for e in entries if not (e.format == FORMAT_LINK or e.is_link or e.format == FORMAT_UNKNOWN)),
        key=newness_key,
        reverse=True,
    )
    newest: dict = {}
    broken: dict = {}
    places = 0
    for entry in ranked:
        if entry.integrity in BROKEN:
            broken[entry.path] = "%s: takes no keep place" % entry.integrity
            continue
        if is_best_name(entry.name):
            continue  # a best copy is kept as best; it takes no place of the newest
        if places < keep:
            places += 1
            newest[entry.path] = "newest %d (#%d)" % (keep, places)

    items: List[PlanItem] = []
    for entry in sorted(entries, key=newness_key, reverse=True):
        reasons = list(protected[entry.path])
        if entry.path in newest:
            reasons.insert(0, newest[entry.path])
        if reasons:
            if entry.path in broken:
                reasons.append(broken[entry.path])
            items.append(PlanItem(entry.path, entry.name, entry.size_bytes, entry.mtime, False, tuple(reasons), entry.is_dir))
            continue
        if entry.path in broken:
            why = "%s and older than min_age" % broken[entry.path].split(":")[0]
        else:
            why = "older than the newest %d" % keep
        items.append(PlanItem(entry.path, entry.name, entry.size_bytes, entry.mtime, True, (why,), entry.is_dir))
    return RetentionPlan(root=root, node=node, keep=keep, min_age=min_age, items=tuple(items), warnings=tuple(warnings))


def entry_in_root(path: str, root: str) -> bool:
    """Whether `path` names a direct child of `root` (no `..`, no deeper path)."""
    parent, name = posixpath.split(path.rstrip("/"))
    return parent.rstrip("/") == root.rstrip("/") and name not in ("", ".", "..")
