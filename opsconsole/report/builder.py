"""An incident report: what the console knows, collected into one tar.gz a colleague can open.

The seed's troubleshooting flow starts with "collect information": this is that, in one
command or key. Contents:

    summary.md              nodes, states, failing checks, findings with excerpts and remedies
    snapshot.json           every node's state (the `snapshot --json` document)
    health.json             health results
    findings.json           log findings and the root cause per log
    logs/<node>/<file>      the last lines of each followed log
    nvidia-smi/<node>.txt   `nvidia-smi -q` of each node, where it ran
    config.toml             the config as written, secrets redacted
    errors.txt              what could not be collected, and why (never silently missing)
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from opsconsole.model import NodeState

LOG_TAIL_LINES = 200


@dataclass
class ReportInputs:
    states: Mapping[str, NodeState]
    created: float = field(default_factory=time.time)
    config_text: Optional[str] = None  # the config file as written (None: the built-in default)
    config_source: Optional[str] = None
    health: Sequence = ()  # HealthResult
    findings: Mapping[str, Tuple[Optional[str], Sequence]] = field(default_factory=dict)  # log -> (root, [Finding])
    log_tails: Mapping[Tuple[str, str], Sequence[str]] = field(default_factory=dict)  # (node, path) -> lines
    smi: Mapping[str, str] = field(default_factory=dict)  # node -> nvidia-smi -q output
    problems: List[str] = field(default_factory=list)  # what could not be collected


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _state_row(state: NodeState, now: float) -> str:
    frame = state.frame
    gpus = len(frame.gpus) if frame else 0
    hottest = max((g.temperature for g in frame.gpus if g.temperature is not None), default=None) if frame else None
    utils = [g.utilization_gpu for g in frame.gpus if g.utilization_gpu is not None] if frame else []
    age = state.age(now)
    return "| %s | %s | %s | %d | %s | %s | %s |" % (
        _md_escape(state.name), state.state, _md_escape(state.reason or ""), gpus,
        "%.0f %%" % (sum(utils) / len(utils)) if utils else "-",
        "%.0f °C" % hottest if hottest is not None else "-",
        "%.1f s" % age if age is not None else "-",
    )


def summary_markdown(inputs: ReportInputs) -> str:
    """The report's first page: what is wrong, where, and what to do."""
    now = inputs.created
    out: List[str] = []
    out.append("# opsconsole incident report")
    out.append("")
    out.append("Created %s on %s; config: %s." % (
        time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)), os.uname().nodename,
        inputs.config_source or "built-in default (the local node)"))
    out.append("")
    out.append("## Nodes")
    out.append("")
    out.append("| node | state | reason | GPUs | mean util | hottest | frame age |")
    out.append("|---|---|---|---|---|---|---|")
    for state in inputs.states.values():
        out.append(_state_row(state, now))
    out.append("")
    failing = [r for r in inputs.health if r.status in ("fail", "error", "warn")]
    out.append("## Failing checks")
    out.append("")
    if not inputs.health:
        out.append("No health results were collected.")
    elif not failing:
        out.append("All %d checks passed." % len(inputs.health))
    for result in sorted(failing, key=lambda r: ("fail", "error", "warn").index(r.status)):
        where = result.node + ("" if result.gpu is None else " GPU %d" % result.gpu)
        out.append("- **%s** %s on %s: %s" % (result.status.upper(), result.check, where, result.message))
        if result.remedy:
            out.append("  - remedy: %s" % result.remedy)
    out.append("")
    out.append("## Findings in the logs")
    out.append("")
    any_finding = False
    for log, (root, findings) in inputs.findings.items():
        if not findings:
            continue
        any_finding = True
        out.append("### %s" % log)
        out.append("")
        out.append("Root cause: **%s**" % (root or "undetermined"))
        out.append("")
        shown = set()
        for finding in findings:
            if finding.category in shown:
                continue
            shown.add(finding.category)
            count = sum(1 for f in findings if f.category == finding.category)
            out.append("- **%s** (%s, %s; %d line%s, first at line %d)" % (
                finding.title, finding.category, finding.severity, count, "" if count == 1 else "s", finding.line))
            out.append("  - cause: %s" % finding.cause)
            out.append("  - remedy: %s" % finding.remedy)
            out.append("")
            out.append("  ```")
            out.extend("  " + line for line in finding.excerpt.splitlines()[:12])
            out.append("  ```")
        out.append("")
    if not any_finding:
        out.append("No failure signatures found in %d log tail(s)." % len(inputs.log_tails))
        out.append("")
    if inputs.problems:
        out.append("## Not collected")
        out.append("")
        out.extend("- " + p for p in inputs.problems)
        out.append("")
    out.append("## Contents")
    out.append("")
    out.append("snapshot.json, health.json, findings.json, logs/ (last %d lines of each log), nvidia-smi/, "
               "config.toml (secrets redacted), errors.txt." % LOG_TAIL_LINES)
    return "\n".join(out) + "\n"


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip("._") or "_"


def report_files(inputs: ReportInputs) -> Dict[str, bytes]:
    """Every member of the report, by path inside the archive."""
    from opsconsole.model import to_wire
    from opsconsole.report.redact import redact_config_text
    from opsconsole.snapshot_format import snapshot_document

    files: Dict[str, bytes] = {}
    files["summary.md"] = summary_markdown(inputs).encode()
    files["snapshot.json"] = (json.dumps(snapshot_document(list(inputs.states.values())), indent=2) + "\n").encode()
    files["health.json"] = (json.dumps({"results": [to_wire(r) for r in inputs.health]}, indent=2) + "\n").encode()
    files["findings.json"] = (json.dumps(
        [{"file": log, "root_cause": root, "findings": [to_wire(f) for f in findings]}
         for log, (root, findings) in inputs.findings.items()], indent=2) + "\n").encode()
    for (node, path), lines in inputs.log_tails.items():
        files["logs/%s/%s" % (_safe_name(node), _safe_name(path.strip("/").replace("/", "__")))] = \
            ("\n".join(lines) + "\n").encode()
    for node, text in inputs.smi.items():
        files["nvidia-smi/%s.txt" % _safe_name(node)] = text.encode()
    if inputs.config_text is not None:
        files["config.toml"] = redact_config_text(inputs.config_text).encode()
    else:
        files["config.toml"] = b"# no config file: the built-in default (the local node)\n"
    files["errors.txt"] = ("\n".join(inputs.problems) + "\n" if inputs.problems else "nothing failed\n").encode()
    return files


def write_report(inputs: ReportInputs, out_dir: str) -> str:
    """Write the tar.gz into `out_dir` (created if needed); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(inputs.created))
    base = "opsconsole-report-%s" % stamp
    path = os.path.join(out_dir, base + ".tar.gz")
    partial = path + ".partial"
    with tarfile.open(partial, "w:gz") as tar:
        for name, data in report_files(inputs).items():
            info = tarfile.TarInfo("%s/%s" % (base, name))
            info.size = len(data)
            info.mtime = int(inputs.created)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(partial, path)  # never a half-written report under the real name
    return path
