"""Best and latest of a Hugging Face Trainer output directory, from what each trainer_state.json records. Pure.

Every `checkpoint-N/` holds the trainer_state.json of the run that wrote it, and that state names
the run's best so far (`best_model_checkpoint`, with its `best_metric`). When one run wrote the
directory the states agree. When another run wrote into it later (a new run from step 0 into the
same output_dir, or a resume that writes checkpoint-N again) they do not: a `checkpoint-N/` may
now hold the later run's step N while an older run's state still names it best.

What the Trainer writes decides which word holds: when it saves a new best it names that
checkpoint in the checkpoint's own trainer_state.json (`_save_checkpoint` sets
best_model_checkpoint before save_to_json), with the same best_metric every later state of that
run records. So a claim by checkpoint C that X is best stands only when X's own state agrees:
it names X and records C's best_metric. When X's own state names another, records another
best_metric or none, X was written again since C's claim (or before it by another run): X is
kept, since a recorded best is never deleted, but not called best on that word, and says why.
When X's own state was not read (a directory that cannot be listed, a save without its state)
nothing says otherwise: X is best as claimed, and the reason says it was not confirmed.

The claims that count are those of the newest state by step and of the state written last
(each run keeps its best, as before). The unit whose trainer_state.json was written last is the
newest save of whichever run wrote last: latest too, beside the highest N that
`get_last_checkpoint` resumes from, when they differ.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from opsconsole.checkpoints.records import BROKEN, FORMAT_HF, CheckpointEntry
from opsconsole.units import format_metric


@dataclass(frozen=True)
class BestClaim:
    """One unit named best by a trainer_state.json: called best when its own state agrees, else only kept."""

    name: str
    why: str
    best: bool


def _base(path: str) -> str:
    return posixpath.basename(path.replace("\\", "/").rstrip("/"))


def state_time(entry: CheckpointEntry) -> float:
    """When the unit's trainer_state.json was written (its mtime as the listing judged it), else the
    unit's newest file's: a file added to a checkpoint later (a copy of a shard, a note) is no save."""
    wanted = entry.name + "/trainer_state.json"
    for judged in entry.judged:
        if judged[0] == wanted:
            return judged[4] / 1e9
    return entry.mtime


def _newest(entry: CheckpointEntry) -> tuple:
    return (entry.meta.step or 0, state_time(entry))


def _written_last(entry: CheckpointEntry) -> tuple:
    return (state_time(entry), entry.meta.step or 0)


def recorded_bests(entries: Mapping[str, CheckpointEntry]) -> List[BestClaim]:
    """Each unit named best_model_checkpoint by the newest trainer_state.json (by step) and by the one
    written last, with whether its own trainer_state.json confirms it (see the module docstring)."""
    hf = [e for e in entries.values() if e.format == FORMAT_HF and e.meta.best_checkpoint]
    if not hf:
        return []
    newest = max(hf, key=_newest)
    written_last = max(hf, key=_written_last)
    claims = [(newest, "the newest trainer_state.json")]
    if written_last is not newest:
        claims.append((written_last, "the trainer_state.json written last, %s's: another run" % written_last.name))
    confirmed: List[BestClaim] = []
    doubted: List[BestClaim] = []
    for claimant, whose in claims:
        name = _base(claimant.meta.best_checkpoint or "")
        named = entries.get(name)
        if named is None:
            continue
        doubt = _doubt(claimant, named)
        if doubt is None:
            unread = " (its own trainer_state.json could not be read to confirm it)" if _unread(named) else ""
            confirmed.append(BestClaim(name, "best (best_model_checkpoint of %s)%s" % (whose, unread), True))
        else:
            doubted.append(
                BestClaim(
                    name,
                    "recorded best, in doubt: %s's trainer_state.json names it best_model_checkpoint, but %s: "
                    "kept, not called best on that word" % (claimant.name, doubt),
                    False,
                )
            )
    best_names = {claim.name for claim in confirmed}
    out: List[BestClaim] = []
    for claim in confirmed + [c for c in doubted if c.name not in best_names]:
        if all(claim.name != seen.name for seen in out):  # (both states naming one unit: one reason, as before)
            out.append(claim)
    return out


def _doubt(claimant: CheckpointEntry, named: CheckpointEntry) -> Optional[str]:
    """None when `named`'s own trainer_state.json agrees with `claimant`'s claim that it is best, or was
    not read (nothing says otherwise: the claim stands, see _unread); else how it disagrees."""
    if named is claimant or _unread(named):
        return None
    when = "written after it" if state_time(named) > state_time(claimant) else "written before it"
    own = named.meta
    if own.best_checkpoint is None:
        return "its own trainer_state.json (%s) records no best_model_checkpoint" % when
    if _base(own.best_checkpoint) != _base(named.name):
        return "its own trainer_state.json (%s) names %s" % (when, _base(own.best_checkpoint))
    claimed = claimant.meta.best_loss
    if claimed is not None and own.best_loss != claimed:
        return "its own trainer_state.json (%s) records best_metric %s, not the %s %s records" % (
            when,
            format_metric(own.best_loss, "none"),
            format_metric(claimed),
            claimant.name,
        )
    return None


def _unread(entry: CheckpointEntry) -> bool:
    """Whether a unit's own trainer_state.json was not read (a directory that cannot be listed, no or
    an unparseable trainer_state.json): its keys are the listing's only sign of a read state."""
    return entry.format != FORMAT_HF or not entry.meta.top_keys


def written_last(entries: Iterable[CheckpointEntry]) -> Optional[CheckpointEntry]:
    """The sound Trainer checkpoint whose trainer_state.json was written last (the newest save of the
    run that wrote last), or None when no state was read."""
    read = [
        e
        for e in entries
        if e.format == FORMAT_HF and e.meta.step is not None and not e.unreadable and e.integrity not in BROKEN
    ]
    return max(read, key=_written_last) if read else None


# transformers.trainer_utils._re_checkpoint: what get_last_checkpoint(output_dir) takes, searched as it
# searches (every directory of the output_dir so named, sound or not; the highest number wins).
_RESUMED = re.compile(r"^checkpoint\-(\d+)$")


def _resumed_number(entry: CheckpointEntry) -> Optional[int]:
    match = _RESUMED.search(entry.name) if (entry.is_dir or entry.is_link) else None
    return int(match.group(1)) if match else None


def resume_warnings(entries: Sequence[CheckpointEntry]) -> Tuple[str, ...]:
    """What `Trainer.train(resume_from_checkpoint=True)` would resume, said plainly when it is not
    the save the listing marks latest: get_last_checkpoint takes the highest checkpoint-N whatever its
    state, so when another run saved into the same output_dir after the one that reached the highest
    step (the listing then marks both runs' newest saves latest), the earlier run's; and in one run,
    a damaged (truncated or corrupt) highest one. () when there is no such doubt."""
    numbered = [(number, e) for e in entries for number in (_resumed_number(e),) if number is not None]
    sound = [(number, e) for number, e in numbered if e.is_dir and not e.is_link and e.integrity not in BROKEN]
    if not sound:
        return ()
    newest = max(sound, key=lambda item: (item[0], item[1].mtime))[1]
    number = max(n for n, _ in numbered)
    top = [e for n, e in numbered if n == number]
    picked = top[0]
    last = written_last(e for _, e in sound)
    if last is None or last.name == newest.name:
        # One run: the listing marks the newest sound save latest, but get_last_checkpoint takes the
        # highest checkpoint-N whatever its state: a damaged one there is what a resume would load.
        if len(top) == 1 and picked.is_dir and not picked.is_link and picked.integrity in BROKEN:
            return (
                "resume_from_checkpoint=True resumes %s, the highest step (%d), which is %s: loading it "
                "would fail; %s (step %s) is the newest sound checkpoint: resume_from_checkpoint=<its "
                "path> resumes it, or move %s out of the directory"
                % (picked.name, number, picked.integrity, newest.name, newest.meta.step, picked.name),
            )
        return ()
    if len(top) > 1:  # checkpoint-5 and checkpoint-05: the one os.listdir gives first
        what = "one of %s (all step %d: whichever the directory lists first)" % (
            ", ".join(sorted(e.name for e in top)),
            number,
        )
    elif picked is newest:
        what = "%s, the highest step (%d), saved by the earlier run" % (picked.name, number)
    else:
        state = "a link" if picked.is_link else picked.integrity
        what = "%s, the highest step (%d), which is %s" % (picked.name, number, state)
    return (
        "two runs saved checkpoints here: resume_from_checkpoint=True resumes %s; the run that saved "
        "last stopped at %s (step %s): resume_from_checkpoint=<its path> continues that one (earlier "
        "and last by the times of their trainer_state.json)" % (what, last.name, last.meta.step),
    )
