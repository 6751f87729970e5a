"""What issue 17's launch leaves out, and that leaving it out changes nothing: the frozen dataclasses'
methods compiled once, __init__ alone (model.frozen), the theme set before the stylesheet
is first parsed, the filter line mounted on the first `/`, and modules the console's first screen
does not need."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from textual.css.stylesheet import Stylesheet
from textual.widgets import Input
from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states, single_node_states

from opsconsole import model
from opsconsole.alerts.engine import AlertEvent
from opsconsole.config import DEFAULT_CONFIG, Config, ConsoleConfig, parse_config
from opsconsole.health.runner import evaluate_state
from opsconsole.tui.app import OpsConsole
from tests.console_pty import ROOT, SUBPROCESS_GUARD_S, run_until
from tests.waiting import wait_for

SIZE = (140, 40)

CONFIG_FILE = """
[console]
interval = 1.5
keys = { "app.filter" = "f" }

[[nodes]]
hosts = "gpu[01-02]"
user = "train"

[[alerts]]
metric = "gpu.temperature"
comparison = ">"
threshold = 80

[[sources]]
url = "http://prometheus:9090"
"""


def stdlib_twin(cls: type) -> type:
    """`cls` as @dataclass(frozen=True) makes it: same name, fields, defaults and flags."""
    specs = [
        (
            f.name,
            f.type,
            dataclasses.field(
                default=f.default, default_factory=f.default_factory, repr=f.repr, hash=f.hash, compare=f.compare
            ),
        )
        for f in dataclasses.fields(cls)
    ]
    twin = dataclasses.make_dataclass(cls.__name__, specs, frozen=True)
    twin.__qualname__ = cls.__qualname__
    return twin


def as_twin(obj, twins):
    cls = type(obj)
    if cls not in twins:
        twins[cls] = stdlib_twin(cls)
    return twins[cls](**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})


def real_objects():
    """Objects of the launch path's classes, from the captured readings and real configs."""
    states = single_node_states() + cluster_states()
    frames = [s.frame for s in states if s.frame is not None]
    objects = list(states) + frames
    for frame in frames:
        objects += [frame.host, *frame.gpus, *frame.processes, *frame.top_processes[:20]]
        objects += [*frame.host.disks, *frame.host.net]
    parsed = parse_config(CONFIG_FILE, "config.toml", home="/home/u")
    for config in (DEFAULT_CONFIG, parsed):
        objects += [config, *(getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "source")]
        objects += [*config.nodes, *config.alerts, *config.sources]
    objects += evaluate_state(states[0], DEFAULT_CONFIG, FROZEN_NOW)
    objects.append(FakeFleet(states).totals(FROZEN_NOW))
    objects.append(AlertEvent(time=1.0, rule="r", node="n", state="firing", severity="warning", message="m"))
    return [obj for obj in objects if dataclasses.is_dataclass(obj)]


def test_frozen_classes_compare_hash_and_print_as_stdlib_dataclasses_do():
    twins: dict = {}
    objects = real_objects()
    assert {type(obj).__name__ for obj in objects} >= {"NodeState", "NodeFrame", "GpuSample", "Config", "SshConfig"}
    for obj in objects:
        twin = as_twin(obj, twins)
        assert repr(obj) == repr(twin)
        assert hash(obj) == hash(twin)
        same = dataclasses.replace(obj)
        assert obj == same and not obj != same and hash(obj) == hash(same)
        assert obj != twin  # another class, as for two dataclasses
        first = dataclasses.fields(obj)[0]
        if first.type in (str, "str"):
            other = dataclasses.replace(obj, **{first.name: getattr(obj, first.name) + "x"})
            assert other != obj and (other == obj) == (as_twin(other, twins) == twin)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, first.name, None)


def test_frozen_keeps_what_a_class_defines_and_the_field_flags():
    @model.frozen
    class Row:
        """A row."""

        key: str
        note: str = dataclasses.field(default="", compare=False, repr=False)
        weight: float = dataclasses.field(default=0.0, hash=False)

        def __repr__(self) -> str:
            return "Row<%s>" % self.key

    twin = stdlib_twin(Row)
    a, b = Row("k", "one", 1.0), Row("k", "two", 1.0)
    assert a == b and hash(a) == hash(b) == hash(twin("k", "x", 2.0))  # note not compared, weight not hashed
    assert a != Row("k", "one", 2.0)
    assert repr(a) == "Row<k>"  # its own
    assert Row.__doc__ == "A row."


def test_frozen_init_defaults_factories_and_post_init_as_stdlib_dataclasses_do():
    made: list = []

    @model.frozen
    class Run:
        """A run."""

        name: str
        steps: int = 0
        tags: tuple = dataclasses.field(default_factory=lambda: ("new",))
        seen: list = dataclasses.field(default_factory=list, compare=False)
        label: str = dataclasses.field(default="unset", init=False)

        def __post_init__(self) -> None:
            made.append(self.name)

    twin = stdlib_twin(Run)
    for args, kwargs in (((), {"name": "a"}), (("b", 3), {}), (("c",), {"tags": ("x",), "steps": 2})):
        ours, theirs = Run(*args, **kwargs), twin(*args, **kwargs)
        assert [getattr(ours, f.name) for f in dataclasses.fields(Run)] == [
            getattr(theirs, f.name) for f in dataclasses.fields(twin)
        ]
    assert made == ["a", "b", "c"]  # __post_init__ ran once each
    assert Run("a").seen is not Run("a").seen  # a fresh value from the factory each time
    with pytest.raises(TypeError):
        Run()  # name is required
    with pytest.raises(TypeError):
        Run("a", label="x")  # not a parameter
    run = Run("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.steps = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        del run.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.other = 1  # frozen dataclasses refuse any attribute on their own class

    @model.frozen
    class LongRun(Run):
        """A subclass, frozen too."""

        hours: float = 0.0

    assert LongRun("d", 1, hours=2.5).hours == 2.5 and LongRun("d").tags == ("new",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LongRun("d").hours = 1.0


def test_the_launch_paths_classes_compile_only_init():
    # dataclasses compiles each method it writes (an exec each): frozen compiles __init__ alone, from a
    # shorter text, and makes the guards, __eq__, __hash__ and __repr__ without exec.
    for obj in real_objects():
        cls = type(obj)
        for name in ("__setattr__", "__delattr__", "__eq__", "__hash__", "__repr__"):
            assert getattr(cls, name).__code__.co_filename == model.__file__, (cls, name)
        assert "__frozen_self__" in cls.__init__.__code__.co_varnames, cls
        # A docstring each: without one, dataclasses writes the signature as __doc__ (inspect.signature).
        assert not cls.__doc__.startswith(cls.__name__ + "("), cls


def cells(app: OpsConsole) -> list:
    """Every cell of the screen as (character, style): what is drawn, not how the repaints cut the
    lines into segments (an SVG export differs in that between two launches of the same screen)."""
    return [
        [(ch, str(seg.style)) for seg in strip for ch in seg.text] for strip in app.screen._compositor.render_strips()
    ]


async def settled(app: OpsConsole, pilot) -> list:
    """The screen's cells once two looks 0.1 s apart agree: the footer and the tab bar's underline are
    drawn a moment after the first frame."""
    before = cells(app)
    for _ in range(50):
        await pilot.pause(0.1)
        now = cells(app)
        if now == before:
            return now
        before = now
    return before


def console(states=None, **options) -> OpsConsole:
    config = Config(console=ConsoleConfig(**options)) if options else Config()
    return OpsConsole(config, FakeFleet(states or single_node_states()), now=lambda: FROZEN_NOW)


# The console on this machine in a real pty, counting Textual's stylesheet refreshes (a reparse of
# every rule and a restyle of every widget) until its first frame with data: a headless test app
# never ran the one that the theme's watcher queued.
COUNT_REFRESHES = """
import sys
import textual.app
calls = []
refresh_css = textual.app.App.refresh_css
def counted(self, animate=True):
    calls.append(1)
    return refresh_css(self, animate)
textual.app.App.refresh_css = counted
from opsconsole import launch_trace
mark = launch_trace.mark
def at_mark(name):
    mark(name)
    if name == "first frame drawn":
        with open(sys.argv[1], "w") as out:
            out.write(str(len(calls)))
launch_trace.mark = at_mark
from opsconsole.cli import main
sys.exit(main(["--interval", "1", "--theme", sys.argv[2]]))
"""


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_the_console_in_a_terminal_refreshes_no_css_before_its_first_frame(theme, tmp_path):
    counted = tmp_path / "refreshes"
    run_until(tmp_path, COUNT_REFRESHES, [str(counted), theme], lambda: counted.exists() and bool(counted.read_text()))
    assert counted.read_text() == "0"


@pytest.mark.parametrize("theme", ["opsconsole-dark", "opsconsole-light"])
async def test_the_theme_is_in_the_first_parse_of_the_stylesheet(theme, monkeypatch):
    reparsed: list = []
    original = Stylesheet.reparse
    monkeypatch.setattr(Stylesheet, "reparse", lambda self: (reparsed.append(self), original(self))[1])
    app = console(theme=theme)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app._first_frame_drawn, "the first frame", pilot=pilot)
        await pilot.pause()
        assert reparsed == []  # Textual's theme watcher parsed the whole stylesheet a second time
        dark = theme.endswith("dark")
        assert app.theme == theme and "-theme-" + theme in app.classes
        assert ("-dark-mode" in app.classes) == dark and ("-light-mode" in app.classes) != dark
        assert app.stylesheet._variables == app.get_css_variables()
        screen = await settled(app, pilot)
    monkeypatch.setattr(Stylesheet, "reparse", original)

    # The same screen as the watcher's way (self.theme = name) draws it.
    monkeypatch.setattr(OpsConsole, "_start_with_theme", lambda self, name: setattr(self, "theme", name))
    watched = console(theme=theme)
    async with watched.run_test(size=SIZE) as pilot:
        await wait_for(lambda: watched._first_frame_drawn, "the first frame", pilot=pilot)
        assert await settled(watched, pilot) == screen


async def test_the_filter_line_is_mounted_by_the_first_slash_and_takes_the_keys_typed_with_it():
    app = console(cluster_states())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app._first_frame_drawn, "the first frame", pilot=pilot)
        assert not app.query(Input)  # not on the first screen
        await pilot.press("slash", "g", "p", "u", "0", "2")  # one burst: the keys after / are the filter's
        filter_input = app.query_one("#filter", Input)
        # has_focus is set by the input's Focus event, a message after the focus moves: waited for.
        await wait_for(lambda: filter_input.has_focus, "the filter's focus", pilot=pilot)
        assert filter_input.has_class("-open")
        assert filter_input.value == "gpu02"
        await pilot.press("escape", "slash")
        assert app.query_one("#filter", Input) is filter_input and filter_input.value == ""


def test_the_consoles_modules_leave_out_what_its_first_screen_does_not_use():
    code = (
        "import sys\n"
        "import opsconsole.cli, opsconsole.sources, opsconsole.nodes.local, opsconsole.probe.agent\n"
        "import opsconsole.tui.app, opsconsole.tui.overview\n"
        "print(sorted(m for m in ('opsconsole.health.remote', 'opsconsole.nodes.bundle', 'opsconsole.probe.wire_delta',"
        " 'opsconsole.tui.help')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=SUBPROCESS_GUARD_S, check=True
    ).stdout
    assert out.strip() == "[]"
