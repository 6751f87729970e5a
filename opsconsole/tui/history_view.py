"""The history detail view: plots of the last minutes of one GPU or one node (textual-plotext)."""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, Tuple

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Static
from textual_plotext import PlotextPlot

from opsconsole.history import History, Ring
from opsconsole.tui.formatting import format_percent, format_power, format_temperature, printable

REFRESH_S = 1.0

# (metric, title, how its latest value is spelled (opsconsole.units), fixed y range or None)
GPU_PLOTS = (
    ("utilization", "utilisation", format_percent, (0, 100)),
    ("memory_percent", "memory", format_percent, (0, 100)),
    ("temperature", "temperature", format_temperature, None),
    ("power_w", "power", format_power, None),
)
NODE_PLOTS = (
    ("gpu_utilization", "mean GPU utilisation", format_percent, (0, 100)),
    ("gpu_memory_percent", "mean GPU memory", format_percent, (0, 100)),
    ("cpu_percent", "CPU", format_percent, (0, 100)),
    ("power_w", "GPU power", format_power, None),
)


def plot_points(ring: Optional[Ring], now: float) -> Tuple[List[float], List[float]]:
    """Seconds before `now` (negative) and values, the samples without a reading left out."""
    if ring is None:
        return [], []
    xs, ys = [], []
    for t, value in ring.points():
        if value is not None:
            xs.append(t - now)
            ys.append(value)
    return xs, ys


class MetricPlot(PlotextPlot):
    def __init__(
        self, title: str, spell: Callable[[Optional[float]], str], y_range: Optional[Tuple[float, float]]
    ) -> None:
        super().__init__()
        self.title = title
        self.spell = spell
        self.y_range = y_range

    def draw(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        latest = self.spell(ys[-1]) if ys else "no data"
        plt.title("%s: %s" % (self.title, latest))
        plt.xlabel("seconds ago")
        if self.y_range is not None:
            plt.ylim(*self.y_range)
        if xs:
            plt.plot(list(xs), list(ys), marker="braille")
        self.refresh()


class HistoryScreen(ModalScreen[None]):
    """Four plots of the last minutes; `esc` closes. Redrawn every second from the console's History."""

    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > Vertical { width: 95%; height: 90%; border: round $accent; background: $surface; }
    HistoryScreen .history-title { height: 1; padding: 0 1; text-style: bold; }
    HistoryScreen Grid { grid-size: 2 2; height: 1fr; }
    """
    BINDINGS = [Binding("escape,q,h", "dismiss", "Close", id="history.close")]

    def __init__(self, history: History, node: str, gpu: Optional[int], now=None) -> None:
        super().__init__()
        self.history = history
        self.node = node
        self.gpu = gpu
        self.now = now
        specs = GPU_PLOTS if gpu is not None else NODE_PLOTS
        self.specs = specs
        self.plots = [MetricPlot(title, spell, y_range) for _, title, spell, y_range in specs]

    def compose(self) -> ComposeResult:
        with Vertical():
            what = "%s GPU %d" % (self.node, self.gpu) if self.gpu is not None else "node %s" % self.node
            yield Static(
                printable("History of %s: last %d samples (esc closes)" % (what, self.history.size)),
                classes="history-title",
                markup=False,
            )
            with Grid():
                yield from self.plots

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(REFRESH_S, self.redraw)

    def ring(self, metric: str) -> Optional[Ring]:
        if self.gpu is not None:
            return self.history.gpu(self.node, self.gpu, metric)
        return self.history.node(self.node, metric)

    def clock(self) -> float:
        """Now as the console sees it: a replay's is the recording's (the wall clock put its samples
        "-104574 seconds ago")."""
        return (self.now or getattr(self.app, "now", time.time))()

    def redraw(self) -> None:
        now = self.clock()
        for (metric, _, _, _), plot in zip(self.specs, self.plots):
            plot.draw(*plot_points(self.ring(metric), now))

    def action_dismiss(self) -> None:
        self.dismiss(None)
