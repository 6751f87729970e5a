"""An incident report: what the console knows, collected into one tar.gz a colleague can open.

The seed's troubleshooting flow starts with "collect information": this is that, in one
command or key. Contents:

    summary.md              nodes, states, failing checks, findings with excerpts and remedies
    snapshot.json           every node's state (the `snapshot --json` document)
    health.json             health results
    findings.json           the run's verdict (every log read together), then each log's findings
    logs/<node>/<file>      the last lines of each followed log
    nvidia-smi/<node>.txt   `nvidia-smi -q` of each node, where it ran
    config.toml             the config as written, secrets redacted
    errors.txt              what could not be collected, and why (never silently missing)

Every member goes through report.redact (secrets by key and by value: config argv arrays and
comments, process command lines and environment entries, log lines). The archive is private:
0600, written under a temporary name in its directory and linked into place, so a reader never
sees half a report and an existing file is never replaced. Without `--out` it goes into
$XDG_STATE_HOME/opsconsole/reports (0700).
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from opsconsole.diagnosis.finding import Finding
from opsconsole.model import NodeState, to_wire
from opsconsole.units import format_frame_age, format_percent, format_temperature

if TYPE_CHECKING:  # the knowledge base loads only where a report is diagnosed (report.gather)
    from opsconsole.diagnosis.run import RunDiagnosis

LOG_TAIL_LINES = 200


@dataclass
class ReportInputs:
    states: Mapping[str, NodeState]
    created: float = field(default_factory=time.time)
    config_text: Optional[str] = None  # the config file as written (None: the built-in default)
    config_source: Optional[str] = None
    health: Sequence = ()  # HealthResult
    # The logs' tails read as one run (diagnosis.run.diagnose_run_lines, the verdict `diagnose --run` gives):
    # one root cause for the run; each log's findings are listed under it, never a root cause of their own.
    run: Optional[RunDiagnosis] = None
    log_tails: Mapping[Tuple[str, str], Sequence[str]] = field(default_factory=dict)  # (node, path) -> lines
    smi: Mapping[str, str] = field(default_factory=dict)  # node -> nvidia-smi -q output
    problems: List[str] = field(default_factory=list)  # what could not be collected
    # A replay's report: the recording's file and the replay's clock, which the node states' ages are
    # measured against (the report's own time is minutes or days after them).
    replay_of: Optional[str] = None
    replay_at: Optional[float] = None


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _state_row(state: NodeState, now: float) -> str:
    frame = state.frame
    gpus = len(frame.gpus) if frame else 0
    hottest = max((g.temperature for g in frame.gpus if g.temperature is not None), default=None) if frame else None
    utils = [g.utilization_gpu for g in frame.gpus if g.utilization_gpu is not None] if frame else []
    age = state.age(now)
    return "| %s | %s | %s | %d | %s | %s | %s |" % (
        _md_escape(state.name),
        state.state,
        _md_escape(state.reason or ""),
        gpus,
        format_percent(sum(utils) / len(utils) if utils else None, missing="-"),
        format_temperature(hottest, missing="-"),
        format_frame_age(age) if age is not None else "-",
    )


def summary_markdown(inputs: ReportInputs) -> str:
    """The report's first page: what is wrong, where, and what to do."""
    now = inputs.created
    out: List[str] = []
    out.append("# opsconsole incident report")
    out.append("")
    out.append(
        "Created %s on %s; config: %s."
        % (
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
            os.uname().nodename,
            inputs.config_source or "built-in default (the local node)",
        )
    )
    out.append("")
    states_at = now
    if inputs.replay_of is not None:
        states_at = inputs.replay_at if inputs.replay_at is not None else now
        out.append(
            "**A replay** of the recording %s: the nodes, checks and findings below are the recording's, "
            "as they were at %s (the replay's clock); nothing was read from the nodes now."
            % (_md_escape(inputs.replay_of), time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(states_at)))
        )
        out.append("")
    out.append("## Nodes")
    out.append("")
    out.append("| node | state | reason | GPUs | mean util | hottest | frame age |")
    out.append("|---|---|---|---|---|---|---|")
    for state in inputs.states.values():
        out.append(_state_row(state, states_at))
    out.append("")
    failing = [r for r in inputs.health if r.status in ("fail", "error", "warn")]
    out.append("## Failing checks")
    out.append("")
    if not inputs.health:
        out.append("No health results were collected.")
    elif not failing:
        out.append(_passed_text(inputs.health))
    for result in sorted(failing, key=lambda r: ("fail", "error", "warn").index(r.status)):
        where = result.node + ("" if result.gpu is None else " GPU %d" % result.gpu)
        out.append("- **%s** %s on %s: %s" % (result.status.upper(), result.check, where, result.message))
        if result.remedy:
            out.append("  - remedy: %s" % result.remedy)
    out.append("")
    out.append("## Findings in the logs")
    out.append("")
    out.extend(_findings_markdown(inputs))
    if inputs.problems:
        out.append("## Not collected")
        out.append("")
        out.extend("- " + p for p in inputs.problems)
        out.append("")
    out.append("## Contents")
    out.append("")
    out.append(contents_text(inputs))
    return "\n".join(out) + "\n"


def _passed_text(health: Sequence) -> str:
    """`All 4 checks passed.` (on N nodes), or how many passed and were skipped when some were (a GPU
    suite on a node without GPUs): a skipped check did not pass."""
    nodes = len({r.node for r in health})
    on = "" if nodes == 1 else " on %d nodes" % nodes
    skipped = sum(1 for r in health if r.status == "skip")
    if not skipped:
        return "All %d checks%s passed." % (len(health), on)
    return "%d checks%s: %d passed, %d skipped." % (len(health), on, len(health) - skipped, skipped)


def contents_text(inputs: ReportInputs) -> str:
    """The report's members as report_files writes them: logs/ and nvidia-smi/ only when something
    was collected there (what was not is under "Not collected" and in errors.txt)."""
    parts = ["snapshot.json", "health.json", "findings.json"]
    logs = len(inputs.log_tails)
    if logs:
        parts.append("logs/ (the last %d lines of %d log%s)" % (LOG_TAIL_LINES, logs, "" if logs == 1 else "s"))
    nodes = len(inputs.smi)
    if nodes:
        parts.append("nvidia-smi/ (`nvidia-smi -q` of %d node%s)" % (nodes, "" if nodes == 1 else "s"))
    parts.append(
        "config.toml (secrets redacted)" if inputs.config_text is not None else "config.toml (a note: no config file)"
    )
    parts.append("errors.txt")
    return ", ".join(parts) + "."


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _verdict_markdown(run: RunDiagnosis) -> List[str]:
    """The run's one verdict, worded as `diagnose --run` words it: root cause, rank, file and line."""
    verdict = run.verdict
    logs = len(run.files)
    read = "The %d log%s read together as one run (line numbers count within each log's tail, as in logs/):" % (
        logs,
        "" if logs == 1 else "s",
    )
    if verdict is None:
        if run.outcome == "finished":
            said = "the run finished (%s): no root cause." % run.outcome_evidence
        elif run.handled and not run.diagnosis.findings:
            said = "no root cause: every exception seen was followed by its rank's further training steps."
        elif run.diagnosis.findings:
            said = "no root cause determined."
        else:
            said = "no failure signature found."
        return ["%s %s" % (read, said), ""]
    start = verdict.finding
    rank = "rank %d" % verdict.rank if verdict.rank is not None else "an unknown rank"
    out = [
        read,
        "",
        "Root cause: **%s** [%s, %s], started on %s, in %s line %d:"
        % (start.title, verdict.category, start.severity, rank, _md_escape(run.file_of(start) or "?"), start.line),
        "",
        "  ```",
        "  " + _one_line(start.excerpt),
        "  ```",
        "",
        "- cause: %s" % start.cause,
        "- remedy: %s" % start.remedy,
    ]
    if verdict.watchdog is not None:
        out.append("- %s" % verdict.watchdog.text)
    if verdict.peer_gone_ranks:
        out.append(
            "- rank%s %s said a peer closed its connection: consequences, not the cause"
            % ("" if len(verdict.peer_gone_ranks) == 1 else "s", ", ".join(map(str, verdict.peer_gone_ranks)))
        )
    out.append("")
    return out


def _findings_markdown(inputs: ReportInputs) -> List[str]:
    """The run's verdict first, then what each log showed (a log's findings are evidence, not its own verdict)."""
    run = inputs.run
    if run is None or not (run.diagnosis.findings or run.handled):
        return ["No failure signatures found in %d log tail(s)." % len(inputs.log_tails), ""]
    out = _verdict_markdown(run)
    verdict_finding = run.verdict.finding if run.verdict is not None else None
    handled = {id(f) for f in run.handled}
    by_file: Dict[str, List[Finding]] = {}
    for finding in run.diagnosis.findings + tuple(run.handled):
        by_file.setdefault(run.file_of(finding) or "?", []).append(finding)
    for log, findings in by_file.items():
        ranks = sorted({f.rank for f in findings if f.rank is not None})
        out.append("### %s%s" % (log, " (rank %s)" % ", ".join(map(str, ranks)) if ranks else ""))
        out.append("")
        shown = set()
        for finding in sorted(findings, key=lambda f: f.line):
            key = (finding.category, id(finding) in handled)
            if key in shown:
                continue
            shown.add(key)
            same = [f for f in findings if (f.category, id(f) in handled) == key]
            notes = []
            if any(f is verdict_finding for f in same):
                notes.append("where the run's root cause started")
            if id(finding) in handled:
                notes.append("handled? the rank went on training after it")
            out.append(
                "- **%s** (%s, %s; %d line%s, first at line %d)%s"
                % (
                    finding.title,
                    finding.category,
                    finding.severity,
                    len(same),
                    "" if len(same) == 1 else "s",
                    finding.line,
                    "".join(": " + note for note in notes),
                )
            )
            out.append("  - cause: %s" % finding.cause)
            out.append("  - remedy: %s" % finding.remedy)
            out.append("")
            out.append("  ```")
            out.extend("  " + line for line in finding.excerpt.splitlines()[:12])
            out.append("  ```")
        out.append("")
    return out


def findings_document(run: Optional[RunDiagnosis]) -> dict:
    """findings.json: the run's verdict (as `diagnose --run --json` names it), then each log's findings."""
    if run is None:
        return {"run": None, "files": []}
    verdict = run.verdict
    handled = {id(f) for f in run.handled}
    files: Dict[str, list] = {}
    for finding in run.diagnosis.findings + tuple(run.handled):
        entry = to_wire(finding)
        entry["handled"] = id(finding) in handled
        files.setdefault(run.file_of(finding) or "?", []).append(entry)
    return {
        "run": {
            "root_cause": verdict.category if verdict else None,
            "rank": verdict.rank if verdict else None,
            "file": run.file_of(verdict.finding) if verdict else None,
            "line": verdict.finding.line if verdict else None,
            "title": verdict.finding.title if verdict else None,
            "outcome": run.outcome,
            "outcome_evidence": run.outcome_evidence or None,
            "logs": list(run.files),
        },
        "files": [{"file": log, "findings": entries} for log, entries in files.items()],
    }


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip("._") or "_"


def _utf8(text: str) -> bytes:
    """Text as UTF-8; a lone surrogate (an undecodable name from a node) as a backslash escape, not an error."""
    return text.encode("utf-8", "backslashreplace")


def _json_member(document) -> bytes:
    from opsconsole.report.redact import redact_json

    return _utf8(json.dumps(redact_json(document), indent=2) + "\n")


def report_files(inputs: ReportInputs) -> Dict[str, bytes]:
    """Every member of the report, by path inside the archive, with secrets redacted."""
    from opsconsole.report.redact import redact_config_text, redact_text
    from opsconsole.sanitize import printable
    from opsconsole.snapshot_format import snapshot_document

    files: Dict[str, bytes] = {}
    files["summary.md"] = _utf8(printable(redact_text(summary_markdown(inputs))))
    files["snapshot.json"] = _json_member(snapshot_document(list(inputs.states.values()), now=inputs.created))
    files["health.json"] = _json_member({"results": [to_wire(r) for r in inputs.health]})
    files["findings.json"] = _json_member(findings_document(inputs.run))
    for (node, path), lines in inputs.log_tails.items():
        files["logs/%s/%s" % (_safe_name(node), _safe_name(path.strip("/").replace("/", "__")))] = _utf8(
            redact_text("\n".join(lines)) + "\n"
        )
    for node, text in inputs.smi.items():
        files["nvidia-smi/%s.txt" % _safe_name(node)] = _utf8(redact_text(text))
    if inputs.config_text is not None:
        files["config.toml"] = _utf8(redact_config_text(inputs.config_text))
    else:
        files["config.toml"] = b"# no config file: the built-in default (the local node)\n"
    errors = redact_text("\n".join(inputs.problems)) + "\n" if inputs.problems else "nothing failed\n"
    files["errors.txt"] = _utf8(errors)
    return files


class ReportDestinationError(Exception):
    """Where the report was to go cannot take it; the message is one line for the user."""


def default_report_dir(env: Mapping[str, str] = os.environ) -> str:
    """`$XDG_STATE_HOME/opsconsole/reports`, `~/.local/state/opsconsole/reports` without it."""
    state_home = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state_home, "opsconsole", "reports")


def private_dir(path: str) -> str:
    """`path` as a directory only we can enter: made 0700 when missing, tightened when it is ours and looser."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ReportDestinationError("%s: not a directory" % path)
    if info.st_uid != os.getuid():
        raise ReportDestinationError("%s: belongs to uid %d, not to us" % (path, info.st_uid))
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _archive(inputs: ReportInputs, base: str, fileobj) -> None:
    with tarfile.open(fileobj=fileobj, mode="w:gz") as tar:
        for name, data in report_files(inputs).items():
            info = tarfile.TarInfo("%s/%s" % (base, name))
            info.size = len(data)
            info.mtime = int(inputs.created)
            info.mode = 0o600  # extracted, the members are as private as the archive
            tar.addfile(info, io.BytesIO(data))


def _link_into_place(temporary: str, path: str) -> None:
    """Give the finished file its name, failing with FileExistsError rather than replacing a file."""
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise
    except OSError as exc:  # a file system without hard links: rename, after a last look
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path) from None
        os.rename(temporary, path)


def report_destination(out: Optional[str]) -> Tuple[str, Optional[str]]:
    """(directory, file name or None for a name of our own) for `--out`; ReportDestinationError when unusable.

    Cheap, so the command checks it before spending time collecting.
    """
    if out is None:
        return private_dir(default_report_dir()), None
    if out == "":
        raise ReportDestinationError("--out: an empty path")
    if os.path.isdir(out):
        return out, None
    if not out.endswith((".tar.gz", ".tgz")):
        raise ReportDestinationError(
            "--out %s: no such directory (it is not created; a file name ends in .tar.gz)" % out
        )
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise ReportDestinationError("--out %s: directory %s does not exist (it is not created)" % (out, directory))
    if os.path.lexists(out):
        raise ReportDestinationError("--out %s: exists; not overwritten" % out)
    return directory, out


def write_report(inputs: ReportInputs, out: Optional[str] = None) -> str:
    """Write the tar.gz (0600) and return its path; an error says why in one line, nothing is half written.

    `out`: None for the private reports directory (made 0700 when missing); an existing directory
    to put it in; or a new `*.tar.gz` file, whose directory must exist (it is never made) and
    which must not exist (it is never replaced).
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(inputs.created))
    base = "opsconsole-report-%s" % stamp
    directory, named = report_destination(out)
    names = (
        [named]
        if named
        else [  # our own name: the next free one, so two reports in one second both stay
            os.path.join(directory, "%s%s.tar.gz" % (base, "" if n == 0 else "-%d" % (n + 1))) for n in range(100)
        ]
    )
    descriptor, temporary = tempfile.mkstemp(prefix=".%s." % base, suffix=".partial", dir=directory)  # 0600 from birth
    try:
        with os.fdopen(descriptor, "wb") as f:
            _archive(inputs, base, f)
            f.flush()
            os.fsync(f.fileno())
        for path in names:
            try:
                _link_into_place(temporary, path)
                return path
            except FileExistsError:
                continue
        if named:
            raise ReportDestinationError("--out %s: exists; not overwritten" % named)
        raise ReportDestinationError("%s: 100 reports of this second already there" % directory)
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
