"""Cleanup pinned to the directory the plan was made for: root swaps, changed units, whole units, files in use.

Every test deletes only inside its own tmp_path. Processes that hold files open or mapped are real
child processes; the node-side helper runs here in-process and, for the Python 3.8 check, as a
real `python3.8 -I -u -c SOURCE` process speaking its line protocol.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opsconsole.actions.audit import AuditLog
from opsconsole.checkpoints.access import LOCAL
from opsconsole.checkpoints.cleanup import execute_plan, pin_plan, plan_directory
from opsconsole.checkpoints.retention import PlanItem, RetentionPlan
from opsconsole.probe import delete_units

HOUR = 3600.0
PYTHON38 = Path.home() / ".pyenv" / "versions" / "3.8.18" / "bin" / "python"


def write(path: Path, data: bytes, age: float = 2 * HOUR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    when = time.time() - age
    os.utime(path, (when, when))
    return path


def judged_now(root: Path, members) -> tuple:
    """Each regular file of the members as a local listing records it when judging (CheckpointEntry.judged)."""
    judged = []
    for member in members:
        path = root / member
        files = (
            [path] if not path.is_dir() else sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
        )
        for file in files:
            if file.is_symlink() or not file.is_file():
                continue
            st = file.lstat()
            judged.append((str(file.relative_to(root)), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(judged)


def item_for(root: Path, name: str, members=None) -> PlanItem:
    """A doomed unit named `name` (a file or directory of root), with what a listing would show and judge by."""
    path = root / name
    st = path.stat()
    members = tuple(members or (name,))
    return PlanItem(
        str(path),
        name,
        st.st_size,
        st.st_mtime,
        True,
        ("older than the newest 0",),
        path.is_dir(),
        members=members,
        judged=judged_now(root, members),
    )


def plan_of(root: Path, *items: PlanItem) -> RetentionPlan:
    return RetentionPlan(root=str(root), node="local", keep=0, min_age=0.0, items=tuple(items))


def records(log: Path):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run_audited(plan, root: Path, log: Path, **kwargs):
    return execute_plan(plan, str(root), AuditLog(str(log)), **kwargs)


# --- the reported defect: the root swapped while the confirmation waited ------------------------------


def test_a_root_swapped_for_a_symlink_after_the_plan_deletes_nothing_anywhere(tmp_path):
    root = tmp_path / "ckpts"
    for epoch in range(3):
        write(root / ("checkpoint_epoch_%d.pt" % epoch), b"weights %d" % epoch)
    plan = pin_plan(plan_of(root, *(item_for(root, "checkpoint_epoch_%d.pt" % e) for e in range(2))))
    assert [i.name for i in plan.to_delete] == ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt"]
    # While the prompt waits: the directory is moved away and its name made a link to another run
    # holding files of the same names.
    other = tmp_path / "other_run"
    for epoch in range(3):
        write(other / ("checkpoint_epoch_%d.pt" % epoch), b"weights %d" % epoch)
    root.rename(tmp_path / "ckpts.moved")
    root.symlink_to(other)
    log = tmp_path / "audit.log"
    result = run_audited(plan, root, log)
    assert result.refused and "symlink" in result.refused and not result.results
    assert sorted(p.name for p in other.iterdir()) == ["checkpoint_epoch_%d.pt" % e for e in range(3)]
    assert len(list((tmp_path / "ckpts.moved").iterdir())) == 3
    assert [(r["action"], r["outcome"]) for r in records(log)] == [("checkpoint_cleanup", "refused")]


def test_a_root_swapped_for_another_directory_is_refused_by_its_identity(tmp_path):
    root = tmp_path / "ckpts"
    write(root / "step_1.pt", b"one")
    plan = pin_plan(plan_of(root, item_for(root, "step_1.pt")))
    root.rename(tmp_path / "ckpts.old")
    write(root / "step_1.pt", b"one")  # a new directory of the same name, a same-named file, same size
    os.utime(root / "step_1.pt", ((tmp_path / "ckpts.old" / "step_1.pt").stat().st_mtime,) * 2)
    result = run_audited(plan, root, tmp_path / "audit.log")
    assert result.refused and "not the directory the plan was made for" in result.refused
    assert (root / "step_1.pt").exists() and (tmp_path / "ckpts.old" / "step_1.pt").exists()


def test_the_real_flow_scan_plan_swap_execute(tmp_path):
    """plan_directory (scan, open-file check, pin), then the swap, then execute_plan: the regression end to end."""
    from opsconsole.checkpoints.scan import scan_directory

    torch = pytest.importorskip("torch")
    root = tmp_path / "run"
    root.mkdir()
    for step in (1, 2, 3):
        torch.save({"step": step}, root / ("step_%d.pt" % step))
        os.utime(root / ("step_%d.pt" % step), (time.time() - 10 * HOUR + step,) * 2)
    plan = plan_directory(scan_directory(str(root)), LOCAL, keep=1, min_age=600, now=time.time())
    doomed = sorted(i.name for i in plan.to_delete)
    assert doomed == ["step_1.pt", "step_2.pt"]
    decoy = tmp_path / "decoy"
    shutil.copytree(root, decoy)
    root.rename(tmp_path / "run.moved")
    root.symlink_to(decoy)
    result = run_audited(plan, root, tmp_path / "audit.log")
    assert result.refused and sorted(p.name for p in decoy.iterdir()) == ["step_1.pt", "step_2.pt", "step_3.pt"]


# --- units: checked whole, deleted whole, partial failures told -----------------------------------------


def test_a_unit_goes_whole_and_a_changed_member_keeps_all_of_it(tmp_path):
    root = tmp_path / "hf_out"
    for name in ("model.safetensors", "config.json", "training_args.bin"):
        write(root / name, name.encode() * 10)
    write(root / "checkpoint-7" / "model.safetensors", b"w" * 50)
    write(root / "checkpoint-7" / "trainer_state.json", b"{}")
    top = item_for(root, "model.safetensors", ("model.safetensors", "config.json", "training_args.bin"))
    step = item_for(root, "checkpoint-7")
    plan = pin_plan(plan_of(root, top, step))
    assert len(plan.to_delete) == 2 and len(plan.pin.units[0].records) == 3
    assert [r[0] for r in plan.pin.units[1].records] == [
        "checkpoint-7",
        "checkpoint-7/model.safetensors",
        "checkpoint-7/trainer_state.json",
    ]
    with open(root / "config.json", "ab") as f:
        f.write(b"!")  # one member of the top-level unit changed after the plan
    write(root / "checkpoint-7" / "optimizer.pt", b"new")  # a file appeared inside the directory unit
    log = tmp_path / "audit.log"
    result = run_audited(plan, root, log)
    errors = {r.path: r.error for r in result.failed}
    assert errors[top.path] == "config.json changed since it was judged (size or mtime)"
    assert "checkpoint-7/optimizer.pt appeared since it was judged" in errors[step.path]
    assert sorted(p.name for p in root.iterdir()) == [
        "checkpoint-7",
        "config.json",
        "model.safetensors",
        "training_args.bin",
    ]
    assert [r["outcome"] for r in records(log)] == ["refused", "refused"]
    # Pinned again as they are now, both go whole.
    plan = pin_plan(plan_of(root, item_for(root, "model.safetensors", top.members), item_for(root, "checkpoint-7")))
    result = run_audited(plan, root, log)
    assert result.ok, result.summary()
    assert list(root.iterdir()) == []
    assert "[unit of 3: model.safetensors, config.json, training_args.bin]" in records(log)[-4]["detail"]


def test_a_failure_midway_names_the_members_that_went(tmp_path, monkeypatch):
    root = tmp_path / "out"
    for name in ("a.safetensors", "b.json", "c.bin"):
        write(root / name, b"x")
    plan = pin_plan(plan_of(root, item_for(root, "a.safetensors", ("a.safetensors", "b.json", "c.bin"))))
    real_unlink = delete_units.unlink_at

    def unlink_at(name, dir_fd):
        if name == "b.json":
            raise PermissionError(13, "Permission denied")  # as on a read-only mount: root ignores modes
        real_unlink(name, dir_fd)

    monkeypatch.setattr(delete_units, "unlink_at", unlink_at)
    log = tmp_path / "audit.log"
    result = run_audited(plan, root, log)
    (failed,) = result.failed
    assert failed.went == ("a.safetensors",)
    assert failed.error == (
        "partly deleted: 1 of 3 files went, the unit is no longer whole (went: a.safetensors): "
        "b.json: Permission denied"
    )
    assert sorted(p.name for p in root.iterdir()) == ["b.json", "c.bin"]
    assert [r["outcome"] for r in records(log)] == ["confirmed", "failed"]
    assert "went: a.safetensors" in records(log)[-1]["detail"]
    answer = result.to_json()["results"][0]
    assert answer["partly_deleted"] == {
        "files_went": 1,
        "files": 3,
        "entries_went": 1,
        "went": ["a.safetensors"],
        "more": 0,
    }
    assert answer["error"] == "b.json: Permission denied"


def test_each_unit_is_audited_before_any_of_it_goes(tmp_path):
    root = tmp_path / "ckpts"
    write(root / "u1" / "model.pt", b"1")
    write(root / "u2.pt", b"2")
    plan = pin_plan(plan_of(root, item_for(root, "u1"), item_for(root, "u2.pt")))
    seen = []

    def audit(action, node, detail, outcome):
        seen.append((outcome, detail.split(" ")[1], (root / "u1").exists(), (root / "u2.pt").exists()))
        return True

    assert execute_plan(plan, str(root), audit).ok
    assert seen == [
        ("confirmed", str(root / "u1"), True, True),
        ("ok", str(root / "u1"), False, True),
        ("confirmed", str(root / "u2.pt"), False, True),
        ("ok", str(root / "u2.pt"), False, False),
    ]


def test_links_inside_a_unit_are_unlinked_never_followed_and_unplanned_plans_are_refused(tmp_path):
    outside = write(tmp_path / "shared" / "vocab.txt", b"a b c")
    root = tmp_path / "ckpts"
    write(root / "checkpoint-1" / "model.safetensors", b"w")
    (root / "checkpoint-1" / "tokenizer").symlink_to(outside.parent)
    (root / "checkpoint-1" / "vocab.txt").symlink_to(outside)
    bare = plan_of(root, item_for(root, "checkpoint-1"))
    result = run_audited(bare, root, tmp_path / "audit.log")  # never pinned: refused, nothing touched
    assert result.refused and "not pinned" in result.refused and (root / "checkpoint-1").exists()
    assert run_audited(pin_plan(bare), root, tmp_path / "audit.log").ok
    assert not (root / "checkpoint-1").exists() and outside.read_bytes() == b"a b c"


def test_members_that_leave_the_root_or_cross_links_are_never_pinned(tmp_path):
    root = tmp_path / "ckpts"
    write(root / "a.pt", b"a")
    write(tmp_path / "outside.pt", b"o")
    (root / "sub").symlink_to(tmp_path)
    bad = [("../outside.pt",), ("/etc/passwd",), ("sub/outside.pt",), ("a.pt", "a.pt"), ("",), ("./a.pt",)]
    items = [replace(item_for(root, "a.pt"), path=str(root / ("x%d" % i)), members=m) for i, m in enumerate(bad)]
    plan = pin_plan(plan_of(root, *items))
    assert not plan.to_delete
    reasons = [i.reasons[-1] for i in plan.items]
    assert "not a plain path" in reasons[0] and "not a plain path" in reasons[1]
    assert "sub is a symlink: never followed" in reasons[2] and "overlaps" in reasons[3]
    assert (tmp_path / "outside.pt").exists() and (root / "a.pt").exists()


# --- in use: open descriptors and memory maps --------------------------------------------------------


def hold(path: Path, code: str):
    """A child process that runs `code` on argv[1], prints `ready` and waits for a line on stdin."""
    child = subprocess.Popen(
        [sys.executable, "-c", code + "\nprint('ready', flush=True)\nsys.stdin.readline()", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout.readline().strip() == b"ready"
    return child


def release(child) -> None:
    child.stdin.close()
    child.wait(30)


# mmap(2) through ctypes, then close(2): Python's mmap module would keep a dup of the descriptor.
MMAP_ONLY = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
address = libc.mmap(None, os.fstat(fd).st_size, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)  # mapped, no descriptor left"""


def test_a_file_mapped_by_another_process_is_in_use_at_plan_and_at_execution(tmp_path):
    root = tmp_path / "ckpts"
    mapped = write(root / "checkpoint_epoch_1.pt", b"m" * 8192)
    write(root / "checkpoint_epoch_2.pt", b"n" * 8192)
    plan = pin_plan(plan_of(root, item_for(root, "checkpoint_epoch_1.pt"), item_for(root, "checkpoint_epoch_2.pt")))
    child = hold(mapped, MMAP_ONLY)
    try:
        fds = [os.readlink("/proc/%d/fd/%s" % (child.pid, fd)) for fd in os.listdir("/proc/%d/fd" % child.pid)]
        assert str(mapped) not in fds  # only the mapping holds it: /proc/PID/fd alone would miss it
        assert str(mapped) in (Path("/proc/%d/maps" % child.pid).read_text())
        from opsconsole.checkpoints.open_files import open_files_local

        assert str(mapped) in open_files_local(str(root)).paths
        # The plan was made before the mapping: the execution sees it and keeps the unit.
        log = tmp_path / "audit.log"
        result = run_audited(plan, root, log)
        errors = {Path(r.path).name: r.error for r in result.failed}
        assert errors == {"checkpoint_epoch_1.pt": "in use: checkpoint_epoch_1.pt open or mapped by a process"}
        assert mapped.exists() and not (root / "checkpoint_epoch_2.pt").exists()
        assert [r["outcome"] for r in records(log)] == ["refused", "confirmed", "ok"]
    finally:
        release(child)


def test_torch_load_mmap_keeps_the_checkpoint_as_open_by_a_process(tmp_path):
    torch = pytest.importorskip("torch")
    from opsconsole.checkpoints.retention import plan_retention
    from opsconsole.checkpoints.scan import scan_directory

    root = tmp_path / "ckpts"
    root.mkdir()
    for step in (1, 2):
        torch.save({"step": step, "w": torch.zeros(256, 256)}, root / ("step_%d.pt" % step))
        os.utime(root / ("step_%d.pt" % step), (time.time() - 5 * HOUR + step,) * 2)
    child = hold(
        root / "step_1.pt",
        "import sys, torch\n"
        "state = torch.load(sys.argv[1], mmap=True, weights_only=True)\nassert state['w'].sum() == 0",
    )
    try:
        plan = plan_directory(scan_directory(str(root)), LOCAL, keep=0, min_age=600, now=time.time())
        verdicts = {i.name: i for i in plan.items}
        assert not verdicts["step_1.pt"].delete and "open by a process" in verdicts["step_1.pt"].reasons
        assert verdicts["step_2.pt"].delete
        assert plan_retention  # the plan's verdict comes from the retention rules, fed by the maps check
    finally:
        release(child)


def test_an_open_descriptor_is_in_use_too(tmp_path):
    root = tmp_path / "ckpts"
    held = write(root / "model" / "weights.bin", b"w" * 100)
    plan = pin_plan(plan_of(root, item_for(root, "model")))
    child = hold(held, "import sys\nf = open(sys.argv[1], 'rb')")
    try:
        result = run_audited(plan, root, tmp_path / "audit.log")
        assert result.failed[0].error == "in use: model/weights.bin open or mapped by a process"
        assert held.exists()
    finally:
        release(child)


# --- FIFOs named like checkpoints are never opened -------------------------------------------------------


def finishes(target, *args):
    """Run target(*args) in a thread; (finished, result or exception). A stuck FIFO open is released after."""
    box = {}

    def run():
        try:
            box["value"] = target(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    return not thread.is_alive(), box.get("value")


def unblock(fifo: Path) -> None:
    """Give a reader stuck in open() its writer (O_NONBLOCK: fails harmlessly when nobody reads)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_named_like_a_checkpoint_is_never_opened(tmp_path):
    from opsconsole.checkpoints.scan import scan_directory

    root = tmp_path / "ckpts"
    write(root / "checkpoint_epoch_1.pt", b"not a zip")
    fifo = root / "checkpoint_epoch_9.pt"
    os.mkfifo(fifo)
    try:
        done, listing = finishes(scan_directory, str(root))
        assert done, "the listing blocked on the FIFO"
        assert not isinstance(listing, BaseException), listing
        assert listing.problem is None
        assert "checkpoint_epoch_9.pt" not in {e.name for e in listing.entries if e.format not in ("unknown",)}
        shown = {e.name: e for e in listing.entries}
        if "checkpoint_epoch_9.pt" in shown:  # listed at all: as what it is, not as a checkpoint
            assert shown["checkpoint_epoch_9.pt"].problem
        else:
            assert listing.other_files >= 1
        for read in (lambda: LOCAL.read_file(str(fifo), 1024), lambda: LOCAL.run_reader(str(fifo), lambda size: None)):
            done, value = finishes(read)
            assert done and isinstance(value, OSError) and "FIFO, not a regular file" in str(value)
        # Deleting a unit with a FIFO inside unlinks it without opening it.
        os.mkfifo(root / "checkpoint-3.d")  # not a checkpoint: stays
        write(root / "checkpoint-3" / "model.pt", b"w")
        os.mkfifo(root / "checkpoint-3" / "pipe")
        done, result = finishes(
            execute_plan, pin_plan(plan_of(root, item_for(root, "checkpoint-3"))), str(root), lambda *record: True
        )
        assert done and result.ok and not (root / "checkpoint-3").exists() and fifo.exists()
    finally:
        unblock(fifo)


# --- the helper as a node runs it: Python 3.8, isolated, line protocol ------------------------------


@pytest.mark.skipif(not PYTHON38.exists(), reason="no Python 3.8 under pyenv")
def test_the_helper_runs_under_python_38_and_answers_line_by_line(tmp_path):
    root = tmp_path / "node dir; 'quoted'"
    write(root / "a.pt", b"a")
    write(root / "b" / "w.bin", b"b")
    odd = "c-\udcff.pt"  # a name that is not UTF-8 on disk
    write(Path(os.fsdecode(os.path.join(os.fsencode(str(root)), b"c-\xff.pt"))), b"c")
    source = inspect.getsource(delete_units)
    helper = subprocess.Popen(
        [str(PYTHON38), "-I", "-u", "-c", source],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def ask(request):
        helper.stdin.write((json.dumps(request) + "\n").encode())
        helper.stdin.flush()
        return json.loads(helper.stdout.readline())

    try:
        pinned = ask({"op": "pin", "root": str(root), "units": [["a.pt"], ["b"], [odd], ["../x"]]})
        assert pinned["root_id"] == [os.stat(root).st_dev, os.stat(root).st_ino]
        trees = [u.get("tree") for u in pinned["units"]]
        assert trees[0][0][:2] == ["a.pt", "f"] and [r[0] for r in trees[1]] == ["b", "b/w.bin"]
        assert trees[2][0][0] == odd and "not a plain path" in pinned["units"][3]["problem"]
        assert ask({"op": "in_use", "root": str(root)})["paths"] == []
        units = [{"members": [m], "tree": t} for m, t in zip(["a.pt", "b", odd], trees)]
        assert ask({"op": "open", "root": str(root), "root_id": [0, 0], "units": units})["ok"] is False
        assert ask({"op": "open", "root": str(root), "root_id": pinned["root_id"], "units": units})["ok"] is True
        assert ask({"op": "check", "unit": 1}) == {"unit": 1, "why": None}
        assert ask({"op": "delete", "unit": 1}) == {"unit": 1, "went": ["b"], "why": None}
        assert ask({"op": "delete", "unit": 2}) == {"unit": 2, "went": [odd], "why": None}
        assert ask({"op": "delete", "unit": 7})["why"].startswith("no unit 7")
        assert "error" in ask({"op": "nonsense"})
        helper.stdin.write(b"not json\n")
        helper.stdin.flush()
        assert "not a JSON request" in json.loads(helper.stdout.readline())["error"]
    finally:
        helper.stdin.close()
        assert helper.wait(30) == 0
    assert sorted(os.listdir(root)) == ["a.pt"]


def test_a_configured_root_that_is_a_symlink_is_named_and_nothing_is_planned_for_deletion(tmp_path):
    real = tmp_path / "real"
    write(real / "step_1.pt", b"1")
    link = tmp_path / "link"
    link.symlink_to(real)
    plan = pin_plan(plan_of(link, item_for(link, "step_1.pt")))
    assert not plan.to_delete and plan.pin is None
    assert any("is a symlink: never followed (name the directory itself)" in w for w in plan.warnings)
    assert "not deleted:" in plan.items[0].reasons[-1]
    assert run_audited(plan, link, tmp_path / "audit.log").ok and (real / "step_1.pt").exists()
