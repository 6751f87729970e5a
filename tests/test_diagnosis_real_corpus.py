"""The real-failure corpus in tests/data/diagnosis_real/: excerpts copied from public issue threads.

Every labels-*.json there (one per corpus engineer) maps an excerpt file to its root cause (a category,
or null for a healthy log), the repository and the URL it was copied from, and the failing rank when
the excerpt shows it. The corpus is split by repository, never by choice: a repository whose SHA-1
falls in the lowest three tenths is held out as the test split. Signatures are tuned on the tune split
only, so this file diagnoses tune excerpts only; benchmarks/diagnosis_corpus.py reports the test split
as counts.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from opsconsole.diagnosis.engine import diagnose_lines
from opsconsole.diagnosis.knowledge import CATEGORIES
from opsconsole.diagnosis.signatures import SIGNATURES, candidates

CORPUS = Path(__file__).parent / "data" / "diagnosis_real"
REPO = re.compile(r"^[\w.-]+/[\w.-]+$")
SOURCE = re.compile(r"^https://\S+$")
FIELDS = {"root_cause", "repo", "source", "rank"}


def split_of(repo: str) -> str:
    """The split a repository's excerpts belong to, fixed by its name."""
    return "test" if int(hashlib.sha1(repo.lower().encode()).hexdigest(), 16) % 10 < 3 else "tune"


def load_labels() -> Dict[str, dict]:
    labels: Dict[str, dict] = {}
    for path in sorted(CORPUS.glob("labels-*.json")):
        for name, label in json.loads(path.read_text(encoding="utf-8")).items():
            assert name not in labels, "%s labelled twice" % name
            labels[name] = dict(label, labels_file=path.name)
    return labels


LABELS = load_labels()
TUNE = sorted(name for name, label in LABELS.items() if split_of(label["repo"]) == "tune")


def read_lines(name: str) -> List[str]:
    """An excerpt as the diagnose command reads it: bytes, decoded with replacement."""
    return (CORPUS / name).read_bytes().decode("utf-8", errors="replace").splitlines()


def diagnose_tune() -> List[Tuple[str, Optional[str], Optional[str]]]:
    return [
        (name, LABELS[name]["root_cause"], diagnose_lines(read_lines(name), source=name).root_cause) for name in TUNE
    ]


def test_every_entry_names_its_source_and_a_known_category():
    assert LABELS, "no labels-*.json in %s" % CORPUS
    for name, label in LABELS.items():
        assert FIELDS <= set(label), "%s lacks %s" % (name, FIELDS - set(label))
        assert (CORPUS / name).is_file(), "%s has no excerpt file" % name
        assert label["root_cause"] is None or label["root_cause"] in CATEGORIES, name
        assert REPO.match(label["repo"]), "%s: repo %r is not owner/name" % (name, label["repo"])
        assert SOURCE.match(label["source"]), "%s: source %r is not a URL" % (name, label["source"])
        assert label["rank"] is None or (isinstance(label["rank"], int) and label["rank"] >= 0), name


def test_every_excerpt_file_is_labelled():
    files = {path.name for path in CORPUS.glob("*.log")}
    assert files <= set(LABELS), "unlabelled: %s" % sorted(files - set(LABELS))


def test_both_splits_hold_excerpts_and_healthy_logs():
    for split in ("tune", "test"):
        in_split = [label for label in LABELS.values() if split_of(label["repo"]) == split]
        assert in_split, "no %s excerpts" % split
    healthy = sum(1 for label in LABELS.values() if label["root_cause"] is None)
    assert healthy >= 0.2 * len(LABELS), "healthy share %d/%d" % (healthy, len(LABELS))


# The test split as frozen on 2026-12-03: 193 excerpts, the SHA-256 of their sorted names. Excerpts added later come
# from repositories whose hash puts them in the tune split, so this never changes; a new repository that falls in the
# test split would silently grow the frozen part with excerpts chosen after its figure was known.
FROZEN_TEST_COUNT = 193
FROZEN_TEST_DIGEST = "a7d9d486891a7eed59cd91d4e34edc407e20c5c1ee9827658e7898e06f55dca2"


def test_the_frozen_test_split_is_unchanged():
    names = sorted(name for name, label in LABELS.items() if split_of(label["repo"]) == "test")
    assert len(names) == FROZEN_TEST_COUNT, (
        "the test split changed size: add excerpts from tune-split repositories only"
    )
    assert hashlib.sha256("\n".join(names).encode()).hexdigest() == FROZEN_TEST_DIGEST


@pytest.fixture(scope="module")
def tune_results():
    return diagnose_tune()


def test_every_tune_excerpt_gets_its_root_cause(tune_results):
    misses = [
        "%s: expected %s, got %s" % (name, expected, got) for name, expected, got in tune_results if expected != got
    ]
    assert not misses, "%d/%d tune excerpts misdiagnosed:\n%s" % (len(misses), len(tune_results), "\n".join(misses))


@pytest.mark.parametrize("name", [name for name in TUNE if LABELS[name]["root_cause"] is None])
def test_healthy_tune_excerpt_has_no_finding(name):
    findings = diagnose_lines(read_lines(name), source=name).findings
    assert findings == (), "\n".join("%d %s: %s" % (f.line, f.category, f.excerpt) for f in findings)


def test_prefilter_never_hides_a_signature_match_in_tune_excerpts():
    """Every tune line a signature's regex matches passes the needle prefilter and holds one of its needles."""
    for name in TUNE:
        for line in read_lines(name):
            lowered = line.lower()
            for sig in SIGNATURES:
                if sig.pattern.search(line):
                    assert candidates(lowered), "prefilter rejects %s line in %s: %s" % (sig.category, name, line)
                    assert any(needle in lowered for needle in sig.needles), "no %s needle in %s: %s" % (
                        sig.category,
                        name,
                        line,
                    )
