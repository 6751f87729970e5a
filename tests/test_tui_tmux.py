"""The real console in a real terminal: `python -m opsconsole` inside tmux, on the local node."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

REPO = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 140, 45
WAIT_S = 30.0  # the upper bound of a wait (as tests/waiting.py): each returns as soon as the screen shows it
POLL_S = 0.05  # how often a wait reads the screen again (capture-pane takes a few ms)
ANSWER_AGAIN_S = 2.0  # a key a question still shows after this long was dropped: pressed again


class Tmux:
    """One tmux server on its own socket, so the test never touches a user's sessions."""

    def __init__(self) -> None:
        self.socket = "opsconsole-test-%s" % uuid.uuid4().hex[:8]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check)

    def start(self, command: str) -> None:
        self.run("new-session", "-d", "-s", "console", "-x", str(WIDTH), "-y", str(HEIGHT), command)

    def screen(self) -> str:
        result = self.run("capture-pane", "-p", "-t", "console", check=False)
        return result.stdout

    def alive(self) -> bool:
        return self.run("has-session", "-t", "console", check=False).returncode == 0

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "console", *keys)

    def wait_for(self, *needles: str, timeout: float = WAIT_S) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(needle in screen for needle in needles):
                return screen
            time.sleep(POLL_S)
        raise AssertionError("never saw %r on the screen; last screen:\n%s" % (needles, screen))

    def wait_gone(self, timeout: float = WAIT_S) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(POLL_S)
        return False

    def answer(self, key: str, question: str, timeout: float = WAIT_S) -> str:
        """Press `key` on the question showing `question` until it leaves the screen; the screen then.

        Keys in a question's first ConfirmScreen.ARM_DELAY_S are dropped, and on a loaded machine the
        timer that arms it can fire well after a fixed sleep: a key the question dropped is pressed
        again once the screen still shows it a while later."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.keys(key)
            pressed_again = min(deadline, time.monotonic() + ANSWER_AGAIN_S)
            while time.monotonic() < pressed_again:
                screen = self.screen()
                if question not in screen:
                    return screen
                time.sleep(POLL_S)
        raise AssertionError("the question never went after %s; last screen:\n%s" % (key, self.screen()))

    def kill(self) -> None:
        self.run("kill-server", check=False)


@pytest.fixture
def tmux():
    server = Tmux()
    yield server
    server.kill()


def console_command(home: Path, *args: str) -> str:
    # HOME and XDG_CONFIG_HOME in a temp dir: no user config, known_hosts or ssh config leaks in.
    # COLUMNS/LINES (set under pytest) would pin the size Textual reads, whatever tmux says.
    env = "HOME=%s XDG_CONFIG_HOME=%s XDG_STATE_HOME=%s" % tuple(
        shlex.quote(str(p)) for p in (home, home / ".config", home / ".state")
    )
    argv = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "opsconsole") + args)
    return "cd %s && exec env -u COLUMNS -u LINES %s %s" % (shlex.quote(str(REPO)), env, argv)


def test_console_shows_local_node_and_quits(tmux, tmp_path):
    config = tmp_path / "console.toml"
    config.write_text(
        '[console]\ninterval = 1.0\ntheme = "opsconsole-high-contrast"\n\n[console.keys]\n"pane.host" = "H"\n'
    )
    tmux.start(console_command(tmp_path, "--config", str(config)))
    screen = tmux.wait_for("opsconsole", "newest frame", "nodes 1  up 1")
    lines = screen.splitlines()
    assert len(lines) == HEIGHT and max(len(line) for line in lines) > 100  # the whole terminal is used
    header = lines[0]
    assert "local" in header and "[RW]" in header
    assert "1 GPUs" in screen and "5 Cluster GPUs" in screen  # the tab bar
    # The GPUs pane: a row per GPU where NVML is present, else the probe's reason.
    assert ("NVIDIA" in screen) or ("local:" in screen)

    tmux.keys("H")  # remapped in the config file (h is the Nodes pane's: refused)
    # The console itself runs on this host, so its own process is among the readings (from the
    # second frame: the first carries no host process list, to reach the first screen sooner).
    screen = tmux.wait_for("host local", "cpu ", "top processes by CPU", "python")
    hostname = socket.gethostname()
    assert hostname.split(".")[0] in screen or "host local" in screen

    tmux.keys("3")  # the old key of the Host pane no longer switches anything
    tmux.keys("2")
    screen = tmux.wait_for("GPU compute processes")

    tmux.keys("q")
    assert tmux.wait_gone(), "console still running after q:\n" + tmux.screen()


def test_too_small_terminal_in_tmux(tmux, tmp_path):
    tmux.start(console_command(tmp_path))
    tmux.wait_for("newest frame")
    tmux.run("resize-window", "-t", "console", "-x", "60", "-y", "15")
    screen = tmux.wait_for("terminal too small: need 80x20, have 60x15")
    assert "newest frame" not in screen
    tmux.keys("q")
    assert tmux.wait_gone()


def audit_lines(home: Path) -> list:
    path = home / ".state" / "opsconsole" / "audit.log"
    return path.read_text().splitlines() if path.exists() else []


CONFIRMATION = "Every run is written to the audit log first"  # the body of every action's question


def filter_text(screen: str) -> str:
    """What the open filter line holds ('' when it is closed or empty)."""
    lines = screen.splitlines()
    for above, line in zip(lines, lines[1:]):
        if above.startswith("▊▔") and line.startswith("▊"):
            text = line.strip("▊▎ ")
            return "" if text.startswith("filter (enter keeps it") else text
    return ""


def filter_closed(screen: str) -> bool:
    return not any(line.startswith("▊▔") for line in screen.splitlines())


def wait_for_filter(tmux: Tmux, wanted: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        screen = tmux.screen()
        if filter_text(screen) == wanted:
            return screen
        time.sleep(POLL_S)
    raise AssertionError("the filter never held %r; last screen:\n%s" % (wanted, tmux.screen()))


def show_host_processes_only(tmux: Tmux) -> None:
    """`v` until the Processes pane shows the host table alone, each press once the last one is seen:
    a key typed while a pane shown the first time is still being mounted is not the pane's."""

    def view() -> tuple:
        status = tmux.screen().splitlines()[4]
        return ("GPU process" in status, "host process" in status)  # "1 host process", "2 host processes"

    for _ in range(4):
        shown = view()
        if shown == (False, True):
            return
        tmux.keys("v")
        deadline = time.monotonic() + WAIT_S
        while view() == shown and time.monotonic() < deadline:
            time.sleep(POLL_S)
    raise AssertionError("the host view never showed; last screen:\n%s" % tmux.screen())


def test_keys_typed_in_a_burst_never_signal_a_process(tmux, tmp_path):
    """`/eyes` (the `e` of a filter word is Escalate, `y` confirms) and pasted bursts in the Processes
    pane, with a process of ours highlighted: no signal is sent and nothing is audited."""
    marker = "burst-target-%s" % uuid.uuid4().hex[:8]
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass", marker])  # tops the host list by CPU
    try:
        tmux.start(console_command(tmp_path, "--interval", "0.5"))
        tmux.wait_for("newest frame", "nodes 1  up 1")
        tmux.keys("2")
        tmux.wait_for("GPU compute processes")
        show_host_processes_only(tmux)  # the cursor is on a row of the host table
        pid = str(burner.pid)

        def only_ours() -> None:
            """Filter the host table down to our process, so the highlighted row is one we started.

            The filter opens with its text selected: what is typed replaces it."""
            deadline = time.monotonic() + WAIT_S
            while not filter_closed(tmux.screen()) and time.monotonic() < deadline:
                time.sleep(POLL_S)  # keys typed before the filter closed are the filter's: wait
            tmux.keys("/")
            while filter_closed(tmux.screen()) and time.monotonic() < deadline + WAIT_S:
                time.sleep(POLL_S)
            tmux.keys(marker, "Enter")
            deadline = time.monotonic() + WAIT_S
            # The count line can be drawn a frame before the table's row: wait for both.
            while not ("1 host process" in tmux.screen() and pid in tmux.screen()) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            assert "1 host process" in tmux.screen() and pid in tmux.screen(), tmux.screen()

        # Filtered first: on a loaded machine other processes can outdo the burner's CPU and push it
        # below the rows on screen, so waiting for its pid unfiltered could fail.
        only_ours()
        tmux.keys("/eyes")  # one burst: every key after `/` belongs to the filter
        screen = wait_for_filter(tmux, "eyes")  # all four reached the filter: none reached the table
        assert CONFIRMATION not in screen
        tmux.keys("Enter")
        only_ours()
        tmux.run("send-keys", "-t", "console", "-l", "/xyKiey")  # a burst typed as literal keys
        assert CONFIRMATION not in wait_for_filter(tmux, "xyKiey")
        tmux.keys("Enter")
        only_ours()
        tmux.run("set-buffer", "-b", "burst", "xyKieyy")
        tmux.run("paste-buffer", "-p", "-b", "burst", "-t", "console")  # a bracketed paste into the table
        time.sleep(1.5)
        assert CONFIRMATION not in tmux.screen()
        assert burner.poll() is None, "the highlighted process was signalled"
        assert audit_lines(tmp_path) == [], "something was audited: %s" % audit_lines(tmp_path)

        show_host_processes_only(tmux)  # so the highlighted row is our process's
        assert "1 host process" in tmux.screen().splitlines()[4], tmux.screen()
        tmux.keys("x", "y")  # `x` opens the SIGTERM question for our process; `y` in the same burst is dropped
        tmux.wait_for(CONFIRMATION, "kill -s TERM -- " + pid)
        time.sleep(1.0)
        assert burner.poll() is None and CONFIRMATION in tmux.screen()
        tmux.answer("Escape", CONFIRMATION)
        assert burner.poll() is None
        assert [line for line in audit_lines(tmp_path) if '"cancelled"' not in line] == []
        tmux.keys("q")
        assert tmux.wait_gone()
    finally:
        burner.kill()
        burner.wait()


def test_pick_a_sleeping_host_process_by_keyboard_after_a_filter(tmux, tmp_path):
    """The default Processes view, a filter for a process that sleeps (no CPU: a top-N list would
    drop it), `enter` on it: its details, read on the node, name its rank variables; `x` asks
    to signal that very pid."""
    marker = "pick-me-%s" % uuid.uuid4().hex[:8]
    env = dict(os.environ, RANK="5", LOCAL_RANK="1", WORLD_SIZE="16", MASTER_ADDR="127.0.0.1")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker], env=env)
    try:
        tmux.start(console_command(tmp_path, "--interval", "0.5"))
        tmux.wait_for("newest frame", "nodes 1  up 1")
        tmux.keys("2")
        tmux.wait_for("GPU compute processes", "Host processes", "sort: ")
        tmux.keys("/")
        deadline = time.monotonic() + WAIT_S
        while filter_closed(tmux.screen()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        tmux.keys(marker, "Enter")
        tmux.wait_for("1 host process", str(sleeper.pid))  # the filter applies as it is typed
        deadline = time.monotonic() + WAIT_S
        while not filter_closed(tmux.screen()) and time.monotonic() < deadline:
            time.sleep(POLL_S)  # enter closes it: the keys are the pane's again
        assert filter_closed(tmux.screen()), tmux.screen()
        for _ in range(10):  # a few frames: the sleeping process stays listed
            time.sleep(0.3)
            assert str(sleeper.pid) in tmux.screen() and "1 host process" in tmux.screen(), tmux.screen()
        tmux.keys("Enter")
        screen = tmux.wait_for("Process %d on local" % sleeper.pid, "RANK=5", "WORLD_SIZE=16", "MASTER_ADDR=127.0.0.1")
        assert marker in screen
        tmux.keys("Escape")
        deadline = time.monotonic() + WAIT_S
        while "RANK=5" in tmux.screen() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        tmux.keys("x")  # SIGTERM's question names the highlighted pid: ours
        tmux.wait_for(CONFIRMATION, "kill -s TERM -- %d" % sleeper.pid)
        tmux.answer("Escape", CONFIRMATION)  # again while the question drops it (ConfirmScreen.ARM_DELAY_S)
        assert sleeper.poll() is None and CONFIRMATION not in tmux.screen()
        tmux.keys("q")
        assert tmux.wait_gone()
    finally:
        sleeper.kill()
        sleeper.wait()
