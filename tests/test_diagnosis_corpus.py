"""Root-cause accuracy over the labelled corpus in tests/data/diagnosis/.

Each file is an excerpt in the formats PyTorch, NCCL, the CUDA runtime, torchelastic, the kernel
and the data libraries print, inside the noise real logs carry; labels.json gives its expected root
cause (null: a healthy log, no finding allowed) and the public report it is modelled on.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from opsconsole.diagnosis.engine import diagnose_lines
from opsconsole.diagnosis.knowledge import CATEGORIES
from opsconsole.diagnosis.signatures import SIGNATURES, candidates

CORPUS = Path(__file__).parent / "data" / "diagnosis"
LABELS: Dict[str, dict] = json.loads((CORPUS / "labels.json").read_text(encoding="utf-8"))
TARGET_ACCURACY = 0.95
# A public report: a GitHub issue/PR URL, or owner/repo#number.
REPORT = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+|[\w.-]+/[\w.-]+#\d+")


def read_lines(name: str) -> List[str]:
    """A corpus file as the diagnose command reads it: bytes, decoded with replacement."""
    return (CORPUS / name).read_bytes().decode("utf-8", errors="replace").splitlines()


def diagnose_all() -> List[Tuple[str, Optional[str], Optional[str]]]:
    return [
        (name, label["root_cause"], diagnose_lines(read_lines(name), source=name).root_cause)
        for name, label in sorted(LABELS.items())
    ]


RESULTS = diagnose_all()


def confusion_report(results) -> str:
    """Per expected category: how often each root cause was given, with the files that missed."""
    table: Dict[str, Counter] = defaultdict(Counter)
    misses: Dict[str, List[str]] = defaultdict(list)
    for name, expected, got in results:
        table[str(expected)][str(got)] += 1
        if expected != got:
            misses[str(expected)].append("%s -> %s" % (name, got))
    rows = []
    for expected in sorted(table):
        counts = ", ".join("%s: %d" % item for item in table[expected].most_common())
        rows.append("%-22s %s" % (expected, counts))
        rows.extend("    miss: " + miss for miss in misses[expected])
    return "\n".join(rows)


def test_every_file_is_labelled_with_the_report_it_copies():
    files = {path.name for path in CORPUS.iterdir() if path.name != "labels.json"}
    assert files == set(LABELS), "unlabelled: %s; missing: %s" % (
        sorted(files - set(LABELS)),
        sorted(set(LABELS) - files),
    )
    for name, label in LABELS.items():
        assert label["root_cause"] is None or label["root_cause"] in CATEGORIES, name
        assert REPORT.search(label.get("modelled_on", "")), "%s names no public report" % name


def test_corpus_covers_every_category_several_times_and_healthy_logs():
    counts = Counter(label["root_cause"] for label in LABELS.values())
    healthy = counts.pop(None, 0)
    assert sum(counts.values()) >= 60
    assert healthy >= 20
    thin = {category: counts.get(category, 0) for category in CATEGORIES if counts.get(category, 0) < 3}
    assert not thin, "categories with fewer than 3 excerpts: %s" % thin


def test_root_cause_accuracy_and_no_healthy_log_flagged():
    correct = sum(1 for _, expected, got in RESULTS if expected == got)
    accuracy = correct / len(RESULTS)
    flagged = [(name, got) for name, expected, got in RESULTS if expected is None and got is not None]
    report = "accuracy %.1f%% (%d/%d)\n%s" % (100 * accuracy, correct, len(RESULTS), confusion_report(RESULTS))
    print(report)
    assert not flagged, "healthy logs flagged:\n" + report
    assert accuracy >= TARGET_ACCURACY, report


@pytest.mark.parametrize("name", sorted(name for name, label in LABELS.items() if label["root_cause"] is None))
def test_healthy_log_has_no_finding_at_all(name):
    findings = diagnose_lines(read_lines(name), source=name).findings
    assert findings == (), "\n".join("%d %s: %s" % (f.line, f.category, f.excerpt) for f in findings)


def test_prefilter_never_hides_a_signature_match():
    """The needle prefilter is an optimisation: every corpus line a signature's regex matches passes it."""
    checked = 0
    for name in LABELS:
        for line in read_lines(name):
            lowered = line.lower()
            for sig in SIGNATURES:
                if sig.pattern.search(line):
                    checked += 1
                    assert candidates(lowered), "prefilter rejects %s line in %s: %s" % (sig.category, name, line)
                    assert any(needle in lowered for needle in sig.needles), "no %s needle in %s: %s" % (
                        sig.category,
                        name,
                        line,
                    )
    assert checked >= 60
