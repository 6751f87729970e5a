"""What Textual alone costs to show what the console's overview shows and changes each second.

A stock Textual app (tabs, a header, Static blocks, a DataTable, a footer; no opsconsole code, no
GPU reads) that draws one GPU's block (name, temperature, power, clocks; utilisation and memory
bars with their history sparklines; a PCIe line), a host strip (CPU, memory, load, disk, network)
and one GPU process row, and every interval changes the same rows the console changes on a
one-GPU node (the header's clock, the GPU block, the host strip, the process's cells). Its launch
to the first screen, CPU and RSS are the floor under any Textual console of that screen:
benchmarks/vs_nvitop.py runs it beside opsconsole and nvitop.

With a third argument `clock`, only the header's clock line changes: what a live Textual screen
costs at the least.

    python benchmarks/textual_floor_app.py NAME INTERVAL [clock]    (q quits)
"""

from __future__ import annotations

import math
import sys
import time

from textual.app import App, ComposeResult
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

NAME = sys.argv[1] if len(sys.argv) > 1 else "GPU"
INTERVAL = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
CLOCK_ONLY = sys.argv[3:4] == ["clock"]
SPARK = " ▁▂▃▄▅▆▇█"
BAR_WIDTH = 30
HISTORY = 40


def bar(fraction: float, colour: str, width: int = BAR_WIDTH) -> str:
    filled = int(round(fraction * width))
    return "[%s]%s[/][dim]%s[/]" % (colour, "█" * filled, "·" * (width - filled))


def spark(values: list) -> str:
    return "".join(SPARK[min(8, max(0, int(v * 8)))] for v in values)


class Floor(App):
    CSS = """
    Static { height: auto; }
    #procs { height: auto; }
    """
    BINDINGS = [("q", "quit", "Quit"), ("question_mark", "help", "Help"), ("slash", "filter", "Filter")]

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        with TabbedContent():
            with TabPane("Overview"):
                yield Static(id="gpu")
                yield Static(id="host")
                yield DataTable(id="procs", cursor_type="row")
            for title in ("GPUs", "Processes", "Host", "Nodes", "Logs", "Checkpoints", "Health", "Alerts"):
                with TabPane(title):
                    yield Static(title)
        yield Footer()

    def on_mount(self) -> None:
        self.tick = 0
        self.util = [0.0] * HISTORY
        self.mem = [0.0] * HISTORY
        self.pcie = [0.0] * HISTORY
        table = self.query_one(DataTable)
        table.add_columns("pid", "user", "GPU", "GPU mem", "SM%", "CPU%", "host mem", "S", "time", "command")
        table.add_row(
            "4242", "root", "0", "11 GiB", "99", "99.6", "1.4 GiB", "R", "20s",
            "/opt/torch/.venv/bin/python examples/h200_training_load.py --steps 100000", key="p",
        )  # fmt: skip
        self.draw()
        self.set_interval(INTERVAL, self.draw_clock if CLOCK_ONLY else self.draw)

    def put(self, selector: str, text: str) -> None:
        # No relayout: the sizes never change (the cheapest refresh a stock Static offers).
        self.query_one(selector, Static).update(text, layout=False)

    def draw_clock(self) -> None:
        self.put(
            "#header",
            " [b]floor[/b]   local  [RW]   %s   newest frame 0.0s ago\n nodes 1  up 1  down 0   GPUs 1   "
            "mean util 99  alerts 0" % time.strftime("%Y-%m-%d %H:%M:%S"),
        )

    def draw(self) -> None:
        self.tick += 1
        t = self.tick
        wave = 0.5 + 0.5 * math.sin(t / 3.0)
        self.util = self.util[1:] + [0.9 + 0.1 * wave]
        self.mem = self.mem[1:] + [0.07 + 0.01 * wave]
        self.pcie = self.pcie[1:] + [wave]
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        self.put(
            "#header",
            " [b]floor[/b]   local  [RW]   %s   newest frame 0.%ds ago\n nodes 1  up 1  down 0   GPUs 1   "
            "mean util %d  alerts 0" % (now, t % 10, 90 + t % 10),
        )
        self.put(
            "#gpu",
            " GPU 0 %s   %d°C  %dW/700W  SM %dMHz  mem 3201MHz  P0  [green]ok[/]  throttle SwPowerCap\n"
            " util %s %3d%%   %s\n"
            " mem  %s %3d%% %.1f/140.4 GiB   %s\n"
            "      pcie gen5 x16  ecc 0/0  fan N/A  persist on   %s"
            % (
                NAME,
                55 + t % 5,
                680 + t % 20,
                1900 + t % 50,
                bar(self.util[-1], "green"),
                int(self.util[-1] * 100),
                spark(self.util),
                bar(self.mem[-1], "yellow"),
                int(self.mem[-1] * 100),
                self.mem[-1] * 140.4,
                spark(self.mem),
                spark(self.pcie),
            ),
        )
        self.put(
            "#host",
            " host local   cpu %s %3d%% 16 cores   mem %s %3d%% 1.7 GiB/126 GiB   load %.2f 0.32 0.11\n"
            " net eth0 ↓%d KiB/s ↑%d KiB/s   disk / 64 GiB free   up %d"
            % (bar(0.06 + 0.05 * wave, "green", 10), 6 + t % 3, bar(0.01, "green", 10), 1, 1 + wave, t % 97, t % 13, t),
        )
        table = self.query_one(DataTable)
        table.update_cell("p", table.ordered_columns[5].key, "%.1f" % (99.0 + wave))
        table.update_cell("p", table.ordered_columns[8].key, "%ds" % (20 + t))


if __name__ == "__main__":
    Floor().run()
