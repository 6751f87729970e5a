"""Tab labels that fit the terminal: full titles where there is room, shorter ones where there is not.

At 80 columns eleven "N Title" tabs do not fit, and the tab bar scrolled the first ones out of sight.
The labels step down (full titles, short titles, tiny ones, then the number key alone), with the
tabs' right padding dropped before the next step down, until the bar fits the width.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

# Short and tiny titles of the shipped panes; a pane may say its own (`short_title`, `tiny_title`).
SHORT_TITLES = {"Overview": "Over", "Processes": "Procs", "Cluster GPUs": "Cluster", "Checkpoints": "Ckpts"}
TINY_TITLES = {
    "Overview": "Over",
    "Processes": "Proc",
    "Cluster GPUs": "Clus",
    "Checkpoints": "Ckpt",
    "Health": "Hlth",
    "Alerts": "Alrt",
}
TAB_PADDING = 2  # Textual's Tab: one cell each side
COMPACT_PADDING = 1  # the compact bar: one cell on the left only


def short_title(pane) -> str:
    return getattr(pane, "short_title", None) or SHORT_TITLES.get(pane.title, pane.title)


def tiny_title(pane) -> str:
    return getattr(pane, "tiny_title", None) or TINY_TITLES.get(pane.title, short_title(pane)[:5])


def _label(pane, title: str) -> str:
    return "%s %s" % (pane.key, title) if pane.key else title


def label_forms(panes: Sequence) -> Sequence[Tuple[Dict[str, str], int]]:
    """(labels by pane id, padding per tab) from the widest bar to the narrowest."""
    full = {p.pane_id: _label(p, p.title) for p in panes}
    short = {p.pane_id: _label(p, short_title(p)) for p in panes}
    tiny = {p.pane_id: _label(p, tiny_title(p)) for p in panes}
    keys = {p.pane_id: p.key or tiny_title(p) for p in panes}
    return (
        (full, TAB_PADDING),
        (short, TAB_PADDING),
        (short, COMPACT_PADDING),
        (tiny, TAB_PADDING),
        (tiny, COMPACT_PADDING),
        (keys, TAB_PADDING),
        (keys, COMPACT_PADDING),
    )


def fit_tab_labels(panes: Sequence, width: int) -> Tuple[Dict[str, str], bool]:
    """The widest labels whose tabs fit `width` cells, and whether the tabs must be compact (less padding)."""
    forms = label_forms(panes)
    for labels, padding in forms:
        if sum(len(label) + padding for label in labels.values()) <= width:
            return labels, padding == COMPACT_PADDING
    return forms[-1][0], True
