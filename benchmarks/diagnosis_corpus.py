"""Root-cause accuracy over the real-failure corpus (tests/data/diagnosis_real/), per split.

For each split: excerpts, repositories, healthy share, accuracy, healthy excerpts flagged, and the
misses counted by expected -> got category. Tune misses are listed by file (they are what signatures
are tuned on); test misses only as counts, so nobody tunes to them.

    .venv/bin/python benchmarks/diagnosis_corpus.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opsconsole.diagnosis.engine import diagnose_lines  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "diagnosis_real"


def split_of(repo: str) -> str:
    """The split a repository's excerpts belong to (the same rule as tests/test_diagnosis_real_corpus.py)."""
    return "test" if int(hashlib.sha1(repo.lower().encode()).hexdigest(), 16) % 10 < 3 else "tune"


def load_labels() -> Dict[str, dict]:
    labels: Dict[str, dict] = {}
    for path in sorted(CORPUS.glob("labels-*.json")):
        labels.update(json.loads(path.read_text(encoding="utf-8")))
    return labels


def report(split: str, names: List[str], labels: Dict[str, dict]) -> None:
    misses: Counter = Counter()
    missed_files: List[str] = []
    correct = flagged = 0
    for name in names:
        lines = (CORPUS / name).read_bytes().decode("utf-8", errors="replace").splitlines()
        expected = labels[name]["root_cause"]
        got = diagnose_lines(lines, source=name).root_cause
        if expected == got:
            correct += 1
            continue
        if expected is None:
            flagged += 1
        misses["%s -> %s" % (expected, got)] += 1
        missed_files.append("%s (%s -> %s)" % (name, expected, got))
    repos = {labels[name]["repo"] for name in names}
    healthy = sum(1 for name in names if labels[name]["root_cause"] is None)
    total = len(names) or 1
    print(
        "%s: %d excerpts from %d repositories, %.0f%% healthy" % (split, len(names), len(repos), 100 * healthy / total)
    )
    print("  accuracy %.1f%% (%d/%d), healthy flagged: %d" % (100 * correct / total, correct, len(names), flagged))
    for kind, count in misses.most_common():
        print("  miss %-40s %d" % (kind, count))
    if split == "tune":
        for missed in missed_files:
            print("    " + missed)


def main() -> None:
    labels = load_labels()
    for split in ("tune", "test"):
        report(split, sorted(name for name, label in labels.items() if split_of(label["repo"]) == split), labels)


if __name__ == "__main__":
    main()
