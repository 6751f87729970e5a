"""One verdict for a run: every file of every rank (and the launcher's output) through one Diagnoser.

The console merges ranks by following every log of the run into one Diagnoser; `diagnose_run` does
the same over files: each file is a source labelled as the console's Logs pane labels it
(logs.names.label_source: host and rank from `train_{host}_rank{N}_{ts}.log`, the layout torchrun's --log-dir
writes, `.../attempt_0/{local_rank}/stderr.log` and `error.json` where a child recorded its exception, a
`rank{N}` in a file name), "[rank3]:" prefixes inside lines giving a line's rank. The verdict is the Diagnoser's: the
most fundamental category, started at its earliest finding in time, with that finding's rank or the
rank torchelastic's failure table names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from opsconsole.diagnosis.engine import Diagnoser, Diagnosis, RootCause, attributed, diagnosis_of
from opsconsole.diagnosis.finding import Finding
from opsconsole.diagnosis.launcher import error_file_lines, parse_error_file
from opsconsole.logs.names import TORCHRUN_RANK_DIR, label_source, ranked_source
from opsconsole.logs.records import LogSource

NODE = "local"
MAX_RUN_FILES = 100_000
# What a run directory's logs are called; explicitly named files are read whatever their name.
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr")
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
LOG_NAMES = ("stdout", "stderr", "output", "log")
ERROR_FILE_SUFFIX = ".json"
MAX_ERROR_FILE_BYTES = 4 * 1024 * 1024
# torch's own prefix on what a rank prints to stderr (its uncaught exception's lines): the global rank.
_TORCH_RANK_PREFIX = re.compile(r"^\[rank(\d{1,7})\]:")
# torchelastic's agent says so when every local child exited 0 (at INFO: LOGLEVEL=INFO or torchrun's own logging).
_LAUNCHER_SUCCESS = ("worker group successfully finished", "Local worker group finished (WorkerState.SUCCEEDED)")
# torchrun --tee's per-child prefix: a file with it is the launcher's own output, where a failed child's table goes.
_TEE_PREFIX = re.compile(r"^\[default\d{1,7}\]:")
OUTCOME_FINISHED = "finished"
OUTCOME_FAILED = "failed"


@dataclass
class RunDiagnosis:
    """What diagnose_run found in the files of one run."""

    verdict: Optional[RootCause]
    diagnosis: Diagnosis
    files: List[str]  # the files read, in order
    unreadable: List[Tuple[str, str]] = field(default_factory=list)  # (file, reason)
    paths: Dict[str, str] = field(default_factory=dict)  # source key -> file
    # source key -> the source as labelled once read (a torchrun folder's rank: the global one its lines name)
    sources: Dict[str, LogSource] = field(default_factory=dict)
    # How the run ended where its files say so: "finished", "failed", or None (not known); and why.
    outcome: Optional[str] = None
    outcome_evidence: str = ""
    # Exceptions (any traceback's, a CUDA OOM) after which the same rank logged further training steps, or that a
    # library said it recovered from: handled, not fatal (each with handled_by).
    handled: List[Finding] = field(default_factory=list)

    @property
    def root_cause(self) -> Optional[str]:
        return self.verdict.category if self.verdict else None

    def file_of(self, finding: Finding) -> Optional[str]:
        return self.paths.get(finding.source or "", finding.source)


def run_files(names: Sequence[str]) -> List[str]:
    """The files of a run: named files as given, directories walked (sorted) for log-like files."""
    files: List[str] = []
    for name in names:
        if os.path.isdir(name):
            for root, directories, entries in os.walk(name):
                directories.sort()
                for entry in sorted(entries):
                    # Regular files only (or links to them): a FIFO named like a log would be opened, and its
                    # open waits for a writer for ever. A FIFO named on the command line is read as given.
                    if _looks_like_a_log(entry) and os.path.isfile(os.path.join(root, entry)):
                        files.append(os.path.join(root, entry))
                        if len(files) >= MAX_RUN_FILES:
                            return files
        else:
            files.append(name)
    return files


def _looks_like_a_log(name: str) -> bool:
    lowered = name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        if lowered.endswith(suffix):
            lowered = lowered[: -len(suffix)]
            break
    stem = lowered.rsplit(".", 1)[0] if "." in lowered else lowered
    return lowered.endswith(LOG_SUFFIXES + (ERROR_FILE_SUFFIX,)) or stem in LOG_NAMES


def diagnose_run(
    names: Sequence[str], lines_of: Callable[[str], Iterable[str]], unreadable: Tuple[type, ...] = (OSError,)
) -> RunDiagnosis:
    """Diagnose the files (and directories) of one run together; `lines_of(file)` reads a file's lines.

    A file that raises one of `unreadable` is listed with its reason; the others are still read.
    """
    files = run_files(names)
    return _diagnose(files, {path: label_source(NODE, path) for path in files}, lines_of, unreadable, local_files=True)


def diagnose_file(path: str, lines_of: Callable[[str], Iterable[str]]) -> Diagnosis:
    """One file read alone (`opsconsole diagnose FILE`): its own verdict, its findings with the ranks diagnose_run
    gives them. The file is the source diagnose_run makes of it (label_source: the seed's name, torchrun's
    attempt_N/<rank>/ folder, a rank{N} in the name), "[rankN]:" and "[default1]:" prefixes give a line's rank, and a
    torchrun folder whose lines name one other global rank is that rank. Its lines are read as given (a .json file
    too); what `lines_of` raises is raised."""
    diagnoser = Diagnoser()
    result = RunDiagnosis(verdict=None, diagnosis=Diagnosis(root_cause=None, findings=()), files=[path])
    evidence = _OutcomeEvidence()
    lines = _feed_file(diagnoser, result, path, label_source(NODE, path), lines_of, (), evidence, local_files=False)
    if evidence.global_ranks:
        _global_ranks_of_folders(diagnoser, result, evidence.global_ranks)
    return diagnosis_of(diagnoser, lines)


def diagnose_run_lines(logs: Mapping[Tuple[str, str], Sequence[str]]) -> RunDiagnosis:
    """The same verdict over lines already read: {(node, path): lines}, e.g. the log tails an incident report took.

    Each log is named "node:path" in the result (its file_of); its source is labelled as the console labels
    it on that node. Nothing is read from disk: a torchelastic error file named in the launcher's table is
    not looked for, and a .json log is read as the lines given.
    """
    names = ["%s:%s" % key for key in logs]
    sources = {name: label_source(node, path) for name, (node, path) in zip(names, logs)}
    lines = dict(zip(names, logs.values()))
    return _diagnose(names, sources, lines.__getitem__, (), local_files=False)


def _diagnose(
    files: List[str],
    sources: Mapping[str, LogSource],
    lines_of: Callable[[str], Iterable[str]],
    unreadable: Tuple[type, ...],
    local_files: bool,
) -> RunDiagnosis:
    diagnoser = Diagnoser()
    result = RunDiagnosis(verdict=None, diagnosis=Diagnosis(root_cause=None, findings=()), files=files)
    evidence = _OutcomeEvidence()
    total = 0
    for name in list(files):
        total += _feed_file(diagnoser, result, name, sources[name], lines_of, unreadable, evidence, local_files)
    # The error files the launcher's table names, when they are still there and were not read yet.
    for failure in diagnoser.launcher_failures() if local_files else ():
        path = failure.error_file
        if path and path not in files and os.path.isfile(path):
            files.append(path)
            source = label_source(NODE, path)
            if failure.rank is not None:
                # The table's rank is the global one (the file's folder is the local rank on its node).
                source = ranked_source(LogSource(node=NODE, path=path, host=failure.host), failure.rank)
            total += _feed_file(diagnoser, result, path, source, lines_of, unreadable, evidence, local_files)
    if evidence.global_ranks:
        _global_ranks_of_folders(diagnoser, result, evidence.global_ranks)
    if evidence.tee_sources:
        _drop_tee_copies(diagnoser, evidence.tee_sources)
    result.handled = diagnoser.handled()  # exceptions their rank went on after: the diagnoser left them out
    verdict = diagnoser.verdict()
    result.outcome, result.outcome_evidence = _outcome(diagnoser, evidence)
    if result.outcome == OUTCOME_FINISHED:
        verdict = None  # a run that ended well has no root cause: its findings are what was seen on the way
    result.verdict = verdict
    result.diagnosis = Diagnosis(
        root_cause=verdict.category if verdict else None,
        findings=tuple(attributed(diagnoser.findings(), verdict)),  # the crashed rank's launcher lines as its own
        summary=tuple(diagnoser.summary()),
        lines=total,
        dropped=diagnoser.dropped,
        handled=tuple(result.handled),
    )
    return result


def _feed_file(
    diagnoser: Diagnoser,
    result: RunDiagnosis,
    path: str,
    source: LogSource,
    lines_of: Callable[[str], Iterable[str]],
    unreadable: Tuple[type, ...],
    evidence: "_OutcomeEvidence",
    local_files: bool = True,
) -> int:
    """Feed one file's lines; the number read (an unreadable file is listed in result.unreadable)."""
    result.paths[source.key] = path
    result.sources[source.key] = source
    number = 0
    try:
        lines = _source_lines(path, lines_of) if local_files else lines_of(path)
        for number, text in enumerate(lines, 1):
            diagnoser.feed_text(text, number, source)
            if text.startswith("[rank"):
                own = _TORCH_RANK_PREFIX.match(text)
                if own and len(evidence.global_ranks) < MAX_RUN_FILES:
                    evidence.global_ranks.setdefault(source.key, set()).add(int(own.group(1)))
            elif text.startswith("[default") and _TEE_PREFIX.match(text):
                evidence.tee_sources.add(source.key)
                if number == 1:
                    evidence.launcher_output = True
            if "finished" in text and any(marker in text for marker in _LAUNCHER_SUCCESS):
                evidence.success_lines += 1
            if local_files and path.lower().endswith(ERROR_FILE_SUFFIX) and number == 1:
                evidence.error_files += 1
    except unreadable as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        result.unreadable.append((path, reason))
    return number


class _OutcomeEvidence:
    """What the files say of how the run ended, gathered while they are read."""

    def __init__(self) -> None:
        self.success_lines = 0  # the launcher's "worker group successfully finished"
        self.launcher_output = False  # a file of torchrun --tee output was read (a failed child's table goes there)
        self.error_files = 0  # torchelastic error files holding a recorded exception
        self.tee_sources: Set[str] = set()  # files holding torchrun --tee's "[defaultN]:" copies of the ranks' output
        self.global_ranks: Dict[str, Set[int]] = {}  # source key -> the ranks torch's "[rankN]:" prefixes named


def _global_ranks_of_folders(diagnoser: Diagnoser, result: RunDiagnosis, named: Mapping[str, Set[int]]) -> None:
    """torchrun's --log-dir keeps each node's ranks under attempt_N/<local_rank>/: on a second node folder 1 holds
    global rank 3, whose own lines say "[rank3]:". A folder whose files name one global rank other than the folder's
    is that rank: its files' sources are relabelled ("rank3:attempt_0/1/stderr.log") and the findings the folder's
    rank was given (lines without the prefix: a crash's, an error file's) take the global rank."""
    folders: Dict[str, List[LogSource]] = {}
    for source in result.sources.values():
        layout = TORCHRUN_RANK_DIR.search(source.path.replace(os.sep, "/"))
        if layout is not None and source.rank == int(layout.group(2)):
            folders.setdefault(os.path.dirname(source.path), []).append(source)
    moved: Dict[str, Tuple[int, int]] = {}  # source key -> (the folder's rank, the global rank)
    for sources in folders.values():
        ranks = set().union(*(named.get(source.key, ()) for source in sources))
        if len(ranks) != 1:
            continue  # none named, or several (not one rank's folder): the folder's rank stays
        rank = ranks.pop()
        for source in sources:
            if source.rank != rank and source.rank is not None:
                moved[source.key] = (source.rank, rank)
                result.sources[source.key] = ranked_source(source, rank)
    if moved:
        diagnoser.rerank(
            lambda finding: (
                moved[finding.source][1]
                if finding.source in moved and finding.rank == moved[finding.source][0]
                else None
            )
        )


def _drop_tee_copies(diagnoser: Diagnoser, tee_sources: Set[str]) -> None:
    """torchrun --tee with --log-dir writes each rank's output twice: to the launcher's output ("[default1]:...")
    and to attempt_N/1/stderr.log. A finding of a --tee file that a rank's own file of the run has too (the same
    category, rank and text) is that copy: counted and listed once, from the rank's own file."""
    own = {
        (finding.category, finding.rank, finding.excerpt)
        for finding in diagnoser.findings()
        if finding.source not in tee_sources and finding.rank is not None
    }
    if own:
        diagnoser.drop_copies(
            lambda finding: (
                finding.source in tee_sources
                and finding.rank is not None
                and (finding.category, finding.rank, finding.excerpt) in own
            )
        )


def _outcome(diagnoser: Diagnoser, evidence: _OutcomeEvidence) -> Tuple[Optional[str], str]:
    """("finished" | "failed" | None, the evidence in words) from the launcher's lines and error files."""
    failures = diagnoser.launcher_failures()
    if failures:
        return OUTCOME_FAILED, "the launcher listed %d failed rank%s" % (
            len(failures),
            "" if len(failures) == 1 else "s",
        )
    if evidence.error_files:
        return OUTCOME_FAILED, "a rank recorded its exception in torchelastic's error file"
    if evidence.success_lines:
        return OUTCOME_FINISHED, "the launcher said the worker group finished successfully (every rank exited 0)"
    if evidence.launcher_output and diagnoser.handled() and not diagnoser.findings() and not diagnoser.dropped:
        return (
            OUTCOME_FINISHED,
            "the launcher's output lists no failed rank, and every rank went on training after what it logged",
        )
    return None, ""


def _source_lines(path: str, lines_of: Callable[[str], Iterable[str]]) -> Iterator[str]:
    """A log's lines; of a torchelastic error file (JSON) the traceback it recorded; other JSON nothing."""
    if not path.lower().endswith(ERROR_FILE_SUFFIX):
        yield from lines_of(path)
        return
    with open(path, "rb") as handle:
        error = parse_error_file(handle.read(MAX_ERROR_FILE_BYTES))
    if error is not None:
        yield from error_file_lines(error)
