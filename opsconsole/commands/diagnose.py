"""`opsconsole diagnose [FILE ... | -] [--json]`: recognise failures in log files and name the root cause.

`opsconsole diagnose --run FILE...|DIR [--json]` reads the files (directories walked for logs) as one
run, through the console's merge of ranks (opsconsole.diagnosis.run): one verdict naming the root
cause, the rank and the file and line it started in; with --json one object `{"root_cause", "rank",
"file", "line", "findings": [...]}`, each finding with its "file", "rank" and "time" too, and "watchdog"
where the ranks' NCCL watchdog lines were seen (the rank that never reached the collective, or a freeze),
and "failed_child" (rank, exitcode, signal, pid, host) when only peers' reports were seen and the
launcher's table shows the one child that failed of its own (a crash signal, sys.exit, a kill).

Each input is read as bytes, line by line (memory stays bounded however large the file), decoded
as UTF-8 with replacement characters, and fed to the same Diagnoser the console's Log pane uses.
Rotated logs compressed as .gz, .bz2 or .xz are read through the matching decompressor.
With --json: one object per input on its own line, `{"file", "root_cause", "findings": [{"line",
"category", "severity", "title", "cause", "remedy", "excerpt", "rank"}]}`, each finding's rank the one --run gives
it (the file's name or torchrun folder, the line's "[rank1]:" / "[default1]:" prefix; None where nothing names
one); without it, a readable report.
Exit 0 when every input was diagnosed (failures found or not), 2 for bad usage or when an input
could not be read (named on stderr, one line; the other inputs are still diagnosed). With --run a
directory holding no log file is such an input too, and when no file at all was read nothing is printed on
stdout (no verdict of an empty run).

Log lines and file names are outside text: the report prints them through sanitize.printable_line
(an OSC 52 clipboard write or a screen clear in a log line arrives as visible ␛ text), --json
through sanitize.printable_json (a file name with undecodable bytes is written escaped).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Iterator, List, Sequence, Tuple

from opsconsole.sanitize import printable_json, printable_line

STDIN = "-"
MAX_LINE_BYTES = 256 * 1024  # the diagnosis looks at a line's first 64 Ki characters; 4 bytes each at most
EXAMPLES_PER_CATEGORY = 3  # matching lines listed under each category in the readable report
FINDING_KEYS = ("line", "category", "severity", "title", "cause", "remedy", "excerpt")


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "diagnose",
        help="recognise failures (CUDA, NCCL, OOM, NaN, I/O, data) in log files and name the root cause",
        description="Read log files (or - for standard input), recognise the failure signatures the "
        "troubleshooting knowledge base lists, and name the root cause with its likely cause and "
        "remedy. Exit 0 when it ran, 2 for bad usage or an unreadable file.",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="log files to read; - reads standard input")
    parser.add_argument("--json", action="store_true", help="one JSON object per input file, one per line")
    parser.add_argument(
        "--run",
        action="store_true",
        help="read the FILEs and directories as one run (every rank, the launcher's output): "
        "one verdict naming the root cause and the rank and file it started in",
    )
    parser.set_defaults(handler=command_diagnose)


def command_diagnose(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import EXIT_BROKEN_PIPE, EXIT_OK, EXIT_USAGE, UsageError

    files: List[str] = list(args.files)
    if getattr(args, "run", False):
        if not files or STDIN in files:
            raise UsageError("diagnose --run: name the run's log FILEs or directories")
        return _command_run(args, files)
    if not files:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("diagnose: name the log FILE(s) to read, or - for standard input")
        files = [STDIN]
    failed = False
    unreadable = _read_errors()
    try:
        for name in files:
            try:
                result = diagnose_input(name)
            except unreadable as exc:
                failed = True
                reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
                print(printable_line("opsconsole: diagnose: %s: %s" % (name, reason)), file=sys.stderr)
                continue
            if args.json:
                sys.stdout.write(printable_json(json_document(name, result)) + "\n")
            else:
                sys.stdout.write(readable_report(name, result))
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader (`| head`) left early: say nothing, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return EXIT_USAGE if failed else EXIT_OK


def _command_run(args: argparse.Namespace, names: List[str]) -> int:
    from opsconsole.commands._arguments import EXIT_BROKEN_PIPE, EXIT_OK, EXIT_USAGE
    from opsconsole.diagnosis.run import diagnose_run, run_files

    missing = [name for name in names if not os.path.exists(name)]
    for name in missing:
        print(printable_line("opsconsole: diagnose: %s: No such file or directory" % name), file=sys.stderr)
    # Each directory walked on its own: one that holds no log (an empty one, a typo'd subdirectory, the
    # checkpoints directory) is an error, never a run with nothing found.
    files: List[str] = []
    empty: List[str] = []
    for name in names:
        if name in missing:
            continue
        found = run_files([name])
        if not found:
            empty.append(name)
            print(
                printable_line(
                    "opsconsole: diagnose: no log files found in %s (looked for %s)" % (name, _log_files_looked_for())
                ),
                file=sys.stderr,
            )
        files.extend(found)
    if not files:  # nothing was read: no verdict, not even "No failure signature found."
        return EXIT_USAGE
    result = diagnose_run(files, _decoded_lines, _read_errors())
    for path, reason in result.unreadable:
        print(printable_line("opsconsole: diagnose: %s: %s" % (path, reason)), file=sys.stderr)
    try:
        if args.json:
            sys.stdout.write(printable_json(run_json_document(result)) + "\n")
        else:
            sys.stdout.write(run_report(result))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return EXIT_USAGE if missing or empty or result.unreadable else EXIT_OK


def _log_files_looked_for() -> str:
    """What --run takes for a log in a directory, in words (from opsconsole.diagnosis.run's lists)."""
    from opsconsole.diagnosis.run import COMPRESSED_SUFFIXES, ERROR_FILE_SUFFIX, LOG_NAMES, LOG_SUFFIXES

    return "%s, files named %s or %s, those compressed as %s, and torchelastic's error files (*%s)" % (
        ", ".join("*" + suffix for suffix in LOG_SUFFIXES),
        ", ".join(LOG_NAMES[:-1]),
        LOG_NAMES[-1],
        ", ".join(COMPRESSED_SUFFIXES),
        ERROR_FILE_SUFFIX,
    )


def run_json_document(result) -> dict:
    """One run's verdict: root cause, rank, the file and line it started at, and every finding."""
    verdict = result.verdict
    findings = []
    for finding in result.diagnosis.findings:
        entry = {key: getattr(finding, key) for key in FINDING_KEYS}
        entry.update(file=result.file_of(finding), rank=finding.rank, time=finding.time)
        for key in ("exception", "frame", "evidence"):
            if getattr(finding, key) is not None:
                entry[key] = getattr(finding, key)
        findings.append(entry)
    document = {
        "root_cause": verdict.category if verdict else None,
        "rank": verdict.rank if verdict else None,
        "file": result.file_of(verdict.finding) if verdict else None,
        "line": verdict.finding.line if verdict else None,
        "findings": findings,
    }
    if verdict is not None and _own_title(verdict):  # the headline: "Rank 1 crashed (signal SIGSEGV)"
        document["title"] = verdict.finding.title
        document["remedy"] = verdict.finding.remedy
    if result.outcome is not None:  # only where the files say how the run ended ("finished", "failed")
        document["outcome"] = result.outcome
        document["outcome_evidence"] = result.outcome_evidence
    if result.handled:  # exceptions their ranks went on after: listed as seen, never the root cause
        document["handled"] = [
            {
                "file": result.file_of(finding),
                **_handled_json(finding),
            }
            for finding in result.handled
        ]
    if verdict is not None and verdict.watchdog is not None:  # only where the ranks' NCCL watchdog lines were seen
        document["watchdog"] = _watchdog_json(verdict.watchdog)
    if verdict is not None and verdict.failed_child is not None:  # only peers' reports: the launcher's row
        child = verdict.failed_child
        document["failed_child"] = {
            "rank": child.rank,
            "exitcode": child.exitcode,
            "signal": child.signal,
            "pid": child.pid,
            "host": child.host,
        }
    return document


def _seen_on_the_way(result, out: List[str]) -> str:
    """A run with findings but no root cause: it finished, or its only exceptions were handled."""
    handled = {id(finding) for finding in result.handled}
    if result.outcome == "finished":
        out.append(printable_line("The run finished (%s): no root cause." % result.outcome_evidence))
    else:
        out.append("No root cause: every exception seen was followed by its rank's further training steps.")
    out.append("Seen on the way:")
    for finding in sorted(result.diagnosis.findings + tuple(result.handled), key=lambda f: (f.time or 0.0, f.line)):
        rank = " on rank %d" % finding.rank if finding.rank is not None else ""
        what = finding.exception or finding.title
        note = " (handled? the rank went on after it)%s" % _handled_by(finding) if id(finding) in handled else ""
        out.append(
            "  %s%s, %s line %d: %s%s"
            % (
                printable_line(what),
                rank,
                printable_line(result.file_of(finding) or "?"),
                finding.line,
                _one_line(finding.excerpt),
                note,
            )
        )
    out.append("")
    return "\n".join(out) + "\n"


def _watchdog_json(watchdog) -> dict:
    """The NCCL watchdog lines of every rank together: who never reached collective N, or that all froze."""
    return {
        "kind": watchdog.kind,
        "group": watchdog.group,
        "seq": watchdog.seq,
        "op": watchdog.op,
        "culprit_ranks": list(watchdog.culprit_ranks),
        "culprit_enqueued": watchdog.culprit_enqueued,
        "others_enqueued": watchdog.others_enqueued,
        "reporting_ranks": list(watchdog.reporting_ranks),
        "text": watchdog.text,
    }


def run_report(result) -> str:
    """The run's verdict for people: the root cause, where and on which rank it started, then each category."""
    diagnosis = result.diagnosis
    files = len(result.files)
    out: List[str] = [
        "== run: %d file%s, %d line%s"
        % (files, "" if files == 1 else "s", diagnosis.lines, "" if diagnosis.lines == 1 else "s")
    ]
    verdict = result.verdict
    if verdict is None and (diagnosis.findings or result.handled):
        return _seen_on_the_way(result, out)
    if verdict is None:
        out.append("No failure signature found.")
        out.append("")
        return "\n".join(out) + "\n"
    start = verdict.finding
    out.append("Root cause: %s [%s, %s]" % (start.title, verdict.category, start.severity))
    rank = "rank %d" % verdict.rank if verdict.rank is not None else "an unknown rank"
    waited_for = verdict.watchdog is not None or verdict.category == "nccl_timeout"
    if waited_for and start.rank is not None and verdict.rank != start.rank:
        # The watchdog lines (or the launcher's table) name the rank that never got there; the first line is a
        # waiting rank's.
        out.append(
            "Started on %s (it never reached the collective the others waited in); first seen on rank %d, "
            "in %s line %d: %s"
            % (rank, start.rank, printable_line(result.file_of(start) or "?"), start.line, _one_line(start.excerpt))
        )
    else:
        out.append(
            "Started on %s, in %s line %d: %s"
            % (rank, printable_line(result.file_of(start) or "?"), start.line, _one_line(start.excerpt))
        )
    if verdict.watchdog is not None:
        out.append(printable_line(verdict.watchdog.text))
    child = verdict.failed_child
    if child is not None:  # only peers' reports: what the launcher knows of the rank that failed of its own
        how = "signal %s" % child.signal if child.signal else "exit code %d" % child.exitcode
        out.append(
            "Rank %d ended with %s and reported no lost connection of its own: the failure is its own%s; "
            "the other ranks' errors are consequences."
            % (
                child.rank,
                how,
                " (a crash in native code: its core dump, or a rerun with PYTHONFAULTHANDLER=1)"
                if child.signal in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
                else " (stopped from outside the launcher: a preemption, scancel, a time limit or a kill; "
                "sacct -j JOB or the scheduler's log says which)"
                if child.signal in ("SIGTERM", "SIGINT", "SIGHUP")
                else " (exit code 1 is an uncaught Python exception: its traceback is in that rank's own output, "
                "which these files do not hold)"
                if not child.signal and child.exitcode == 1
                else " (read its log: an exit without a traceback is sys.exit or os._exit in its code)"
                if not child.signal
                else "",
            )
        )
    if verdict.category == "rank_crashed" and start.weak:  # a SIGKILL, and no OOM-killer line in these logs
        out.append(
            "Killed by SIGKILL, and no OOM-killer line is in these logs: the kernel's OOM killer (dmesg on that node, "
            "the cgroup's memory.events oom_kill count), a scheduler's time or memory limit, or a user's kill -9 "
            "(see the remedy)."
        )
    launcher = verdict.launcher
    if launcher is not None:
        told = ["rank %s" % launcher.rank if launcher.rank is not None else "rank ?"]
        if launcher.local_rank is not None:
            told.append("local_rank %d" % launcher.local_rank)
        if launcher.exitcode is not None:
            told.append("exit code %d" % launcher.exitcode)
        if launcher.signal:
            told.append(launcher.signal)
        if launcher.host:
            told.append("on " + launcher.host)
        out.append(printable_line("Launcher's first observed failure: " + ", ".join(told)))
        note = _first_observed_note(verdict, diagnosis.findings)
        if note:
            out.append(note)
    by_category = _examples(diagnosis.findings, verdict)
    for row in diagnosis.summary:
        out.append("")
        marker = "* " if row.category == verdict.category else "  "
        ranks = ", rank%s %s" % ("" if len(row.ranks) == 1 else "s", _ranks_text(row.ranks)) if row.ranks else ""
        out.append(
            "%s%s [%s] %s, %d time%s%s"
            % (marker, row.title, row.category, row.severity, row.count, "" if row.count == 1 else "s", ranks)
        )
        out.append("    cause:  " + row.cause)
        out.append("    remedy: " + row.remedy)
        for finding in by_category.get(row.category, ()):
            rank_text = " rank %d" % finding.rank if finding.rank is not None else ""
            out.append(
                "    %s:%d%s: %s"
                % (printable_line(result.file_of(finding) or "?"), finding.line, rank_text, _one_line(finding.excerpt))
            )
    if diagnosis.dropped:
        out.append("")
        out.append("(%d further matching lines counted above but not listed)" % diagnosis.dropped)
    out.append("")
    return "\n".join(out) + "\n"


def _first_observed_note(verdict, findings) -> str:
    """When torchelastic's "first observed failure" is not the rank the verdict names: why both are true.

    The launcher notes the first child whose exit it noticed; a rank that lost its connection to the failing
    one, or timed out waiting for it, often exits before the failing rank's own end is noticed."""
    launcher = verdict.launcher
    if launcher is None or launcher.rank is None or verdict.rank is None or launcher.rank == verdict.rank:
        return ""
    seen = {finding.category for finding in findings if finding.rank == launcher.rank}
    first, failed = launcher.rank, verdict.rank
    if "nccl_timeout" in seen:
        what, why = "the rank the others waited for", "rank %d timed out waiting for rank %d" % (first, failed)
    elif first in verdict.peer_gone_ranks:
        what, why = "the one that failed", "rank %d only lost its connection to rank %d" % (first, failed)
    else:
        what, why = "the one that failed", "rank %d's exit was a consequence of rank %d's failure" % (first, failed)
    return (
        "torchelastic observed rank %d's exit first, but rank %d is %s: %s, and the launcher notes whichever "
        "exit it notices first." % (first, failed, what, why)
    )


def _read_errors() -> tuple:
    """What reading an input can raise: OS errors, a truncated or damaged compressed file."""
    import lzma
    import zlib

    return (OSError, EOFError, zlib.error, lzma.LZMAError)


def diagnose_input(name: str):
    """Diagnose one file (or standard input for '-'); one of _read_errors() when it cannot be read. A file's findings
    get the ranks --run gives them (its name or torchrun folder, the lines' prefixes)."""
    from opsconsole.diagnosis.engine import diagnose_lines
    from opsconsole.diagnosis.run import diagnose_file

    if name == STDIN:
        return diagnose_lines(_decoded_lines(name), source=name)
    return diagnose_file(name, _decoded_lines)


def _decoded_lines(name: str) -> Iterator[str]:
    if name == STDIN:
        yield from _lines_of(sys.stdin.buffer)
        return
    if os.path.isdir(name):
        raise IsADirectoryError(21, "Is a directory", name)
    with _open_log(name) as handle:
        yield from _lines_of(handle)


def _open_log(name: str) -> IO[bytes]:
    """The file as bytes; rotated logs (.gz, .bz2, .xz) through their decompressor."""
    lowered = name.lower()
    if lowered.endswith(".gz"):
        import gzip

        return gzip.open(name, "rb")
    if lowered.endswith(".bz2"):
        import bz2

        return bz2.open(name, "rb")
    if lowered.endswith(".xz"):
        import lzma

        return lzma.open(name, "rb")
    return open(name, "rb")


def _lines_of(handle: IO[bytes]) -> Iterator[str]:
    """Decoded lines; of a line longer than MAX_LINE_BYTES only the start is kept (memory stays bounded)."""
    while True:
        raw = handle.readline(MAX_LINE_BYTES)
        if not raw:
            return
        if not raw.endswith(b"\n") and len(raw) == MAX_LINE_BYTES:
            rest = raw
            while rest and not rest.endswith(b"\n"):
                rest = handle.readline(MAX_LINE_BYTES)  # the rest of the line, read and dropped
        yield raw.rstrip(b"\r\n").decode("utf-8", errors="replace")


def json_document(name: str, result) -> dict:
    """The issue's JSON shape for one input (and "handled" where a rank went on after an exception)."""
    document = {
        "file": name,
        "root_cause": result.root_cause,
        # Each with its rank, as --run's: None where neither the file nor the line names one.
        "findings": [
            {**{key: getattr(finding, key) for key in FINDING_KEYS}, "rank": finding.rank}
            for finding in result.findings
        ],
    }
    if result.handled:
        document["handled"] = [_handled_json(finding) for finding in result.handled]
    verdict = getattr(result, "verdict", None)
    if verdict is not None and _own_title(verdict):
        document["title"] = verdict.finding.title
    failures = getattr(result, "launcher_failures", ())
    if failures:  # torchelastic's failure table, row by row, and the rank the verdict names from it
        document["rank"] = verdict.rank if verdict is not None else None
        document["launcher_failures"] = [
            {
                "rank": failure.rank,
                "host": failure.host,
                "exitcode": failure.exitcode,
                "signal": failure.signal,
                "pid": failure.pid,
                "first": failure.first,
            }
            for failure in failures
        ]
    return document


def _handled_json(finding) -> dict:
    """A handled exception: where, what (its category, exception and line), and the line that showed it handled."""
    return {
        "line": finding.line,
        "rank": finding.rank,
        "category": finding.category,
        "exception": finding.exception,
        "excerpt": finding.excerpt,
        "handled_by": finding.handled_by,
    }


def _handled_by(finding) -> str:
    """'; then line 9: step 3 loss 2.1' (the step or recovery line after the exception), or nothing."""
    return "; then %s" % _one_line(finding.handled_by) if finding.handled_by else ""


def readable_report(name: str, result) -> str:
    """A report for people: the root cause first, then every category seen with its cause and remedy."""
    from opsconsole.diagnosis.knowledge import CATEGORIES

    out: List[str] = ["== %s (%d line%s)" % (printable_line(name), result.lines, "" if result.lines == 1 else "s")]
    handled = [
        "Handled? the rank went on after it: line %d%s: %s%s"
        % (
            finding.line,
            " rank %d" % finding.rank if finding.rank is not None else "",
            _one_line(finding.excerpt),
            _handled_by(finding),
        )
        for finding in result.handled[:EXAMPLES_PER_CATEGORY]
    ]
    if result.root_cause is None:
        out.append("No root cause found." if handled else "No failure signature found.")
        out.extend(handled)
        out.append("")
        return "\n".join(out) + "\n"
    root = CATEGORIES[result.root_cause]
    verdict = getattr(result, "verdict", None)
    title, severity = root.title, root.severity
    if verdict is not None and verdict.category == result.root_cause:
        title, severity = verdict.finding.title, verdict.finding.severity  # "Rank 1 crashed (signal SIGSEGV)"
    out.append("Root cause: %s [%s, %s]" % (title, root.id, severity))
    if verdict is not None and verdict.rank is not None:
        out.append(
            "Started on rank %d, line %d: %s" % (verdict.rank, verdict.finding.line, _one_line(verdict.finding.excerpt))
        )
    failures = getattr(result, "launcher_failures", ())
    if failures:
        out.append(printable_line("Launcher's failed ranks: " + "; ".join(_failure_text(f) for f in failures)))
        if verdict is not None and verdict.category == result.root_cause:
            note = _first_observed_note(verdict, result.findings)
            if note:
                out.append(note)
    by_category = _examples(result.findings, verdict)
    for row in result.summary:
        out.append("")
        marker = "* " if row.category == result.root_cause else "  "
        out.append("%s%s [%s] %s, %s" % (marker, row.title, row.category, row.severity, _seen(row)))
        out.append("    cause:  " + row.cause)
        out.append("    remedy: " + row.remedy)
        for finding in by_category.get(row.category, ()):
            rank = " rank %d" % finding.rank if finding.rank is not None else ""
            out.append("    line %d%s: %s" % (finding.line, rank, _one_line(finding.excerpt)))
    if result.dropped:
        out.append("")
        out.append("(%d further matching lines counted above but not listed)" % result.dropped)
    if handled:
        out.append("")
        out.extend(handled)
    out.append("")
    return "\n".join(out) + "\n"


def _own_title(verdict) -> bool:
    """Whether the verdict's headline says more than its category's title (a crashed rank, gloo's timeout)."""
    from opsconsole.diagnosis.knowledge import CATEGORIES

    entry = CATEGORIES.get(verdict.category)
    return entry is None or verdict.finding.title != entry.title


def _failure_text(failure) -> str:
    """One row of the launcher's failure table: rank, host, exit code or signal, pid, first observed."""
    told = ["rank %s" % failure.rank if failure.rank is not None else "rank ?"]
    if failure.host:
        told.append("on " + failure.host)
    if failure.signal:
        told.append("signal " + failure.signal)
    if failure.exitcode is not None:
        told.append("exit code %d" % failure.exitcode)
    if failure.pid is not None:
        told.append("pid %d" % failure.pid)
    if failure.first:
        told.append("first observed")
    return ", ".join(told)


def _seen(row) -> str:
    times = "%d time%s" % (row.count, "" if row.count == 1 else "s")
    lines = (
        "line %d" % row.first_line
        if row.first_line == row.last_line
        else "lines %d-%d" % (row.first_line, row.last_line)
    )
    ranks = ""
    if row.ranks:
        ranks = ", rank%s %s" % ("" if len(row.ranks) == 1 else "s", _ranks_text(row.ranks))
    return "%s, %s%s" % (times, lines, ranks)


def _ranks_text(ranks: Sequence[int]) -> str:
    """Sorted ranks as compact ranges: 0-3,7."""
    parts: List[Tuple[int, int]] = []
    for rank in sorted(set(ranks)):
        if parts and rank == parts[-1][1] + 1:
            parts[-1] = (parts[-1][0], rank)
        else:
            parts.append((rank, rank))
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in parts)


def _examples(findings, verdict=None) -> dict:
    """Up to EXAMPLES_PER_CATEGORY findings to list under each category's row.

    `findings` are as the verdict counts them (engine.attributed): a rank that crashed of its own (rank_crashed) has
    the launcher's lines about it under its own row, and its lines about the ranks it stopped after it under theirs
    (rank_stopped), not among the peers' lost connections; the crash's first line (the "Started on" line above) is
    not listed again."""
    from opsconsole.diagnosis.engine import CRASHED

    start = (verdict.finding.source, verdict.finding.line) if verdict is not None else None
    examples: dict = {}
    for finding in findings:
        if finding.category == CRASHED and (finding.source, finding.line) == start:
            continue  # the crash's first line: the "Started on" line shows it
        kept = examples.setdefault(finding.category, [])
        if len(kept) < EXAMPLES_PER_CATEGORY:
            kept.append(finding)
    return examples


def _one_line(text: str, width: int = 160) -> str:
    """An excerpt as one visible line of at most `width` characters (runs of blanks as one space)."""
    text = " ".join(text.split())
    return printable_line(text if len(text) <= width else text[: width - 1] + "…")
