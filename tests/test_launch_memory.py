"""What the console's first screen holds that it does not need (issue 17's RSS): msgspec is loaded
with the first config file, not by a console started without one; the Xid catalog with the first
Xid; and the argument parser is not kept for the console's life. The console runs in a real pty,
as a user starts it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tests.console_pty import run_until

# The console with every argparse parser it makes noted by a weak reference; once its first frame is
# on screen and the collection that follows it ran (the collector is on again), it writes what is
# loaded and how many of those parsers are still alive.
AT_FIRST_FRAME = """
import argparse, gc, json, sys, threading, time, weakref
made = []
init = argparse.ArgumentParser.__init__
def noted(self, *args, **kwargs):
    made.append(weakref.ref(self))
    init(self, *args, **kwargs)
argparse.ArgumentParser.__init__ = noted
from opsconsole import launch_trace
mark = launch_trace.mark
def report():
    while not gc.isenabled():  # launch_gc.resume: its collection, then the collector on
        time.sleep(0.01)
    found = {
        "modules": sorted(name for name in sys.modules if name.startswith(("msgspec", "opsconsole.config", "opsconsole.health"))),
        "parsers_made": len(made),
        "parsers_alive": sum(1 for ref in made if ref() is not None),
    }
    with open(sys.argv[1] + ".part", "w") as out:
        json.dump(found, out)
    import os
    os.replace(sys.argv[1] + ".part", sys.argv[1])
def at_mark(name):
    mark(name)
    if name == "first frame drawn":
        threading.Thread(target=report, daemon=True).start()
launch_trace.mark = at_mark
from opsconsole.cli import main
sys.exit(main(sys.argv[2:]))
"""


def first_screen(tmp_path: Path, *args: str) -> dict:
    found = tmp_path / "found.json"
    run_until(tmp_path, AT_FIRST_FRAME, [str(found), *args], found.exists)
    return json.loads(found.read_text())


def test_a_console_without_a_config_file_loads_no_msgspec_and_keeps_no_parser(tmp_path):
    found = first_screen(tmp_path, "--interval", "1")
    assert not [name for name in found["modules"] if name.startswith("msgspec")]
    assert "opsconsole.config.validate" not in found["modules"]
    assert "opsconsole.config.schema" in found["modules"]  # the defaults are read, not validated
    # The health rules run on every frame; the Xid catalog only once a GPU reports an Xid.
    assert "opsconsole.health.rules" in found["modules"] and "opsconsole.health.xid" not in found["modules"]
    assert found["parsers_made"] >= 1
    assert found["parsers_alive"] == 0


def test_a_console_with_a_config_file_validates_it_with_msgspec(tmp_path):
    config = tmp_path / "console.toml"
    config.write_text('[console]\ninterval = 1.5\ntheme = "opsconsole-light"\n')
    found = first_screen(tmp_path, "--config", str(config))
    assert {"msgspec", "opsconsole.config.validate"} <= set(found["modules"])
    assert found["parsers_alive"] == 0


def test_every_schema_limit_is_a_msgspec_constraint_once_a_file_is_validated():
    # msgspec ignores metadata it does not know in Annotated: a Limits left in a type (one inside a
    # generic that validate.msgspec_type does not rebuild) would be a range no longer checked.
    import msgspec

    from opsconsole.config import schema, validate

    classes = [kind for kind in vars(schema).values() if isinstance(kind, type) and dataclasses.is_dataclass(kind)]
    assert schema.Config in classes and schema.SshConfig in classes
    metas = 0
    for cls in classes:
        for name, kind in validate.hints(cls).items():
            assert "Limits" not in repr(kind), (cls.__name__, name, kind)
            metas += repr(kind).count("msgspec.Meta(")
    assert metas >= 25  # every Limits of the schema module
    port = validate.unwrapped(schema.NodeEntry, "port")
    assert port[0] is int and isinstance(port[1][0], msgspec.Meta) and (port[1][0].ge, port[1][0].le) == (1, 65535)
