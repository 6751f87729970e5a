"""Checkpoint listing, CRC check, open-file check and cleanup over SFTP against a real sshd on loopback."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from opsconsole.actions.audit import AuditLog
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.cleanup import execute_plan, plan_directory
from opsconsole.checkpoints.remote import SftpFileSystem
from opsconsole.checkpoints.scan import scan_directory
from opsconsole.checkpoints.verify import verify_checkpoint
from opsconsole.config import NodeConfig
from opsconsole.nodes.ssh import SshLink
from tests.checkpoint_writers import set_mtime, write_seed_layout
from tests.remote_fs import FAST, remote_fs
from tests.sshd import ssh_client, sshd_factory  # noqa: F401,F811 (pytest fixtures)

pytestmark = pytest.mark.sshd

# One series (step_N.pt behind one prefix) whose names a shell would split, quote or run.
ODD_PREFIX = """run 'q'; "hi" $(touch PWNED) """
ODD_NAMES = [ODD_PREFIX + "step_%d.pt" % step for step in (10, 11, 12)]


def scan(root, fs):
    return scan_directory(str(root), fs, cache=ResultCache(), crc_cache=ResultCache())


def comparable(listing):
    return [
        (
            e.name,
            e.format,
            e.size_bytes,
            e.meta.epoch,
            e.meta.loss,
            e.latest,
            e.best,
            e.integrity,
            e.problem,
            e.meta.state_dict,
            e.meta.tensor_bytes,
        )
        for e in listing.entries
    ]


@pytest.fixture
def odd_dir(tmp_path):
    root = tmp_path / "run 42; 'quoted' dir"
    write_seed_layout(root, losses=(0.8, 0.3, 0.5))
    for index, name in enumerate(ODD_NAMES):
        torch.save({"epoch": 10 + index, "loss": 1.0 + index}, root / name)
        set_mtime(root / name, time.time() - 7200 - index)
    torch.save({"epoch": 20, "model": {"w": torch.zeros(1024, 1024)}}, root / "big.pt")  # 4 MiB of weights
    set_mtime(root / "big.pt", time.time() - 9000)
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save({"epoch": 99}, outside / "other_run.pt")
    (root / "checkpoint_epoch_99.pt").symlink_to(outside / "other_run.pt")
    return root


async def test_remote_listing_matches_local_and_reads_only_ranges(sshd_factory, odd_dir):
    link, fs = remote_fs(sshd_factory)
    try:
        remote = await asyncio.to_thread(scan, odd_dir, fs)
        local = scan(odd_dir, __import__("opsconsole.checkpoints.access", fromlist=["LOCAL"]).LOCAL)
        assert remote.problem is None and remote.node == "n1"
        assert comparable(remote) == comparable(local)
        names = {e.name: e for e in remote.entries}
        assert set(ODD_NAMES) <= set(names)
        assert names[ODD_NAMES[1]].meta.epoch == 11
        assert names["checkpoint_epoch_2.pt"].latest and names["checkpoint_best.pt"].best
        assert names["checkpoint_epoch_99.pt"].format == "link" and "outside" in names["checkpoint_epoch_99.pt"].problem
        assert remote.free_bytes and remote.total_bytes == local.total_bytes
        assert not (odd_dir / "PWNED").exists() and not Path("PWNED").exists()
        # Only heads, zip directories and data.pkl crossed the wire: not the 4 MiB of weights.
        assert names["big.pt"].meta.state_dict.bytes == 4 * 2**20
        assert fs.bytes_read < 400 * 1024 < remote.total_bytes
        # The full CRC check reads the whole file, over SFTP too.
        seen = []
        result = await asyncio.to_thread(
            verify_checkpoint,
            names[ODD_NAMES[0]],
            fs,
            lambda done, total: seen.append(done),
            lambda: False,
            ResultCache(),
        )
        assert result.integrity == "ok" and seen and seen[-1] == result.checked_bytes
    finally:
        await fs.aclose()
        await link.close()
    assert link.channels_in_use == 0 and link.channels_peak >= 1


async def test_remote_cleanup_keeps_open_files_and_deletes_only_the_plan(sshd_factory, odd_dir, tmp_path):
    link, fs = remote_fs(sshd_factory)
    held = odd_dir / "checkpoint_epoch_0.pt"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nf=open(sys.argv[1],'rb')\nprint('open',flush=True)\nsys.stdin.readline()",
            str(held),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"open"
        listing = await asyncio.to_thread(scan, odd_dir, fs)
        plan = await asyncio.to_thread(plan_directory, listing, fs, keep=1, min_age=600, now=time.time())
        verdicts = {item.name: item for item in plan.items}
        assert verdicts["checkpoint_epoch_0.pt"].reasons == ("open by a process",)
        assert not verdicts["checkpoint_epoch_99.pt"].delete
        to_delete = sorted(item.name for item in plan.to_delete)
        assert len(set(ODD_NAMES) & set(to_delete)) == 2
        log = tmp_path / "audit.log"
        result = await asyncio.to_thread(execute_plan, plan, str(odd_dir), AuditLog(str(log)), fs=fs)
        assert result.ok, result.summary()
        assert sorted(Path(r.path).name for r in result.deleted) == to_delete
        left = {p.name for p in odd_dir.iterdir()}
        assert not left & set(to_delete)
        assert {"checkpoint_epoch_0.pt", "checkpoint_best.pt", "checkpoint_latest.pt", "checkpoint_epoch_99.pt"} <= left
        assert (tmp_path / "outside" / "other_run.pt").exists() and not (odd_dir / "PWNED").exists()
        assert log.read_text().count('"node": "n1"') == 2 * len(to_delete)
    finally:
        holder.stdin.close()
        holder.wait(10)
        await fs.aclose()
        await link.close()


async def test_an_unreachable_node_is_a_listing_problem_not_a_crash(sshd_factory, tmp_path):
    server = sshd_factory.start()
    port = server.port
    server.kill()
    link = SshLink(NodeConfig(name="gone", host="127.0.0.1", port=port), FAST, 1.0)
    fs = SftpFileSystem(link, asyncio.get_running_loop(), timeout=10)
    try:
        listing = await asyncio.to_thread(scan, tmp_path, fs)
        assert listing.problem and "gone" in listing.problem and not listing.entries
    finally:
        await fs.aclose()
        await link.close()


def test_cli_lists_and_cleans_up_a_node_directory(sshd_factory, odd_dir, tmp_path, capsys):
    import json

    from opsconsole import cli

    server = sshd_factory.start()
    config = tmp_path / "config.toml"
    config.write_text(
        '[[nodes]]\nname = "n1"\nhost = "%s"\nport = %d\n[actions]\naudit_log = "%s"\n'
        % (server.address, server.port, tmp_path / "audit.log")
    )
    assert cli.main(["checkpoints", str(odd_dir), "--node", "n1", "--config", str(config), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"] == "n1" and {Path(c["path"]).name for c in doc["checkpoints"]} >= set(ODD_NAMES)
    assert cli.main(["checkpoints", str(odd_dir), "--node", "n1", "--config", str(config)]) == 0
    # The same path often exists on every node: the listing and the plan say which machine's it is.
    assert " in n1:%s, " % odd_dir in capsys.readouterr().out
    assert cli.main(["checkpoints", str(odd_dir), "--node", "nope", "--config", str(config)]) == 2
    assert "no such node" in capsys.readouterr().err
    code = cli.main(["cleanup", str(odd_dir), "--node", "n1", "--config", str(config), "--keep", "1", "--yes"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(keep 1, min-age 600s) in n1:%s\n" % odd_dir in out
    assert len(set(ODD_NAMES) & {p.name for p in odd_dir.iterdir()}) == 1 and "deleted" in out
    assert (odd_dir / "checkpoint_latest.pt").is_symlink() and (odd_dir / "checkpoint_best.pt").exists()


def test_a_node_whose_sshd_has_no_sftp_says_so(sshd_factory, odd_dir, tmp_path, capsys):
    from opsconsole import cli

    server = sshd_factory.start(Subsystem="notsftp internal-sftp")  # sshd_config without `Subsystem sftp`
    config = tmp_path / "config.toml"
    config.write_text('[[nodes]]\nname = "n1"\nhost = "%s"\nport = %d\n' % (server.address, server.port))
    assert cli.main(["checkpoints", str(odd_dir), "--node", "n1", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    # Before: "opsconsole: n1:DIR: SSH: Session request failed".
    assert "the node's sshd offers no SFTP (no `Subsystem sftp` in its sshd_config)" in err, err
    assert err.startswith("opsconsole: n1:%s: " % odd_dir)


@pytest.mark.parametrize("node, place", [("n1", "n1:/data/run"), ("local", "/data/run")])
def test_the_cleanup_prompt_names_the_machine_whose_files_go(node, place):
    import io
    from types import SimpleNamespace

    from opsconsole.commands.cleanup import confirmed_at_prompt

    plan = SimpleNamespace(node=node, to_delete=("a", "b"), bytes_freed=2 * 2**30)
    asked = io.StringIO()
    assert confirmed_at_prompt(plan, "/data/run", stdin=io.StringIO("run\n"), stderr=asked)
    assert (
        asked.getvalue() == "delete 2 checkpoints (2.0 GiB) in %s? type the directory's name, run, to confirm: " % place
    )
    one = SimpleNamespace(node=node, to_delete=("a",), bytes_freed=2**20)
    asked = io.StringIO()
    assert not confirmed_at_prompt(one, "/data/run", stdin=io.StringIO("n\n"), stderr=asked)
    assert "delete 1 checkpoint (1.0 MiB) in %s? [y/N] " % place in asked.getvalue()


# --- deletion through the node-side helper: pinned root, whole units, in use by maps, audit first ----------


def _old_file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    set_mtime(path, time.time() - 7200)
    return path


def _unit_plan(root: Path, *names):
    from opsconsole.checkpoints.retention import PlanItem, RetentionPlan

    items = []
    for name in names:
        st = (root / name).stat()
        # What a listing over SFTP judges by: no device or inode, the mtime in whole seconds.
        files = [root / name] if not (root / name).is_dir() else sorted((root / name).rglob("*"))
        judged = tuple(
            (str(f.relative_to(root)), -1, -1, f.lstat().st_size, int(f.lstat().st_mtime) * 10**9)
            for f in files
            if f.is_file() and not f.is_symlink()
        )
        items.append(
            PlanItem(
                str(root / name),
                name,
                st.st_size,
                st.st_mtime,
                True,
                ("older",),
                (root / name).is_dir(),
                judged=judged,
            )
        )
    return RetentionPlan(str(root), "n1", 0, 0.0, tuple(items))


async def test_remote_root_swapped_for_a_symlink_is_refused_on_the_node(sshd_factory, tmp_path):
    from opsconsole.checkpoints.cleanup import pin_plan

    link, fs = remote_fs(sshd_factory)
    root = tmp_path / "ckpts"
    for step in (1, 2):
        _old_file(root / ("step_%d.pt" % step), b"w%d" % step)
    decoy = tmp_path / "decoy"
    for step in (1, 2):
        _old_file(decoy / ("step_%d.pt" % step), b"w%d" % step)
    try:
        plan = await asyncio.to_thread(pin_plan, _unit_plan(root, "step_1.pt", "step_2.pt"), fs)
        assert len(plan.to_delete) == 2 and plan.pin.ino == root.stat().st_ino
        root.rename(tmp_path / "ckpts.moved")
        root.symlink_to(decoy)
        log = tmp_path / "audit.log"
        result = await asyncio.to_thread(execute_plan, plan, str(root), AuditLog(str(log)), fs=fs)
        assert result.refused and "symlink" in result.refused and not result.results
        assert sorted(p.name for p in decoy.iterdir()) == ["step_1.pt", "step_2.pt"]
        assert len(list((tmp_path / "ckpts.moved").iterdir())) == 2
        assert '"outcome": "refused"' in log.read_text() and '"node": "n1"' in log.read_text()
    finally:
        await fs.aclose()
        await link.close()
    assert link.channels_in_use == 0


MMAP_THEN_CLOSE = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
assert libc.mmap(None, os.fstat(fd).st_size, 1, 2, fd, 0) not in (None, ctypes.c_void_p(-1).value)
os.close(fd)
print("mapped", flush=True)
sys.stdin.readline()"""


async def test_remote_units_go_whole_audited_first_and_a_mapped_file_stays(sshd_factory, tmp_path):
    from opsconsole.checkpoints.cleanup import pin_plan

    link, fs = remote_fs(sshd_factory)
    root = tmp_path / "run"
    mapped = _old_file(root / "step_1.pt", b"m" * 4096)
    _old_file(root / "checkpoint-2" / "model.safetensors", b"w" * 100)
    _old_file(root / "checkpoint-2" / "optimizer.pt", b"o" * 100)
    (root / "checkpoint-2" / "shared").symlink_to(tmp_path)  # unlinked, never followed
    _old_file(root / "step_3.pt", b"3")
    outside = _old_file(tmp_path / "keep.txt", b"k")
    seen = []

    def audit(action, node, detail, outcome):
        seen.append((outcome, detail.split(" ")[1], (root / "checkpoint-2").exists(), (root / "step_3.pt").exists()))
        return True

    try:
        plan = await asyncio.to_thread(pin_plan, _unit_plan(root, "step_1.pt", "checkpoint-2", "step_3.pt"), fs)
        holder = subprocess.Popen(
            [sys.executable, "-c", MMAP_THEN_CLOSE, str(mapped)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert holder.stdout.readline().strip() == b"mapped"
            result = await asyncio.to_thread(execute_plan, plan, str(root), audit, fs=fs)
        finally:
            holder.stdin.close()
            holder.wait(10)
        errors = {Path(r.path).name: r.error for r in result.failed}
        assert errors == {"step_1.pt": "in use: step_1.pt open or mapped by a process"}
        assert sorted(p.name for p in root.iterdir()) == ["step_1.pt"] and outside.exists()
        # Each unit's record was written while all of it was still there; the result after it went.
        assert seen == [
            ("refused", str(root / "step_1.pt"), True, True),
            ("confirmed", str(root / "checkpoint-2"), True, True),
            ("ok", str(root / "checkpoint-2"), False, True),
            ("confirmed", str(root / "step_3.pt"), False, True),
            ("ok", str(root / "step_3.pt"), False, False),
        ]
        assert not hasattr(fs, "remove") and not hasattr(fs, "rmtree")  # no deletion by SFTP path
    finally:
        await fs.aclose()
        await link.close()
    assert link.channels_in_use == 0


async def test_remote_reads_never_open_a_fifo(sshd_factory, tmp_path):
    import os

    link, fs = remote_fs(sshd_factory)
    root = tmp_path / "ckpts"
    _old_file(root / "checkpoint_epoch_1.pt", b"not a zip")
    fifo = root / "checkpoint_epoch_9.pt"
    os.mkfifo(fifo)
    try:
        for read in (lambda: fs.read_file(str(fifo), 100), lambda: fs.run_reader(str(fifo), lambda size: None)):
            with pytest.raises(OSError, match="FIFO, not a regular file"):
                await asyncio.wait_for(asyncio.to_thread(read), 60)
        listing = await asyncio.wait_for(asyncio.to_thread(scan, root, fs), 60)
        assert listing.problem is None and "checkpoint_epoch_9.pt" not in {
            e.name for e in listing.entries if e.format != "unknown"
        }
    finally:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a reader stuck in open() gets its writer
        except OSError:
            pass
        await fs.aclose()
        await link.close()


async def test_remote_directory_unit_failing_part_way_says_what_went(sshd_factory, tmp_path):
    """checkpoint-2/ with an immutable file (chattr +i: what the pre-checks cannot see) fails on the
    node after the files before it went: the answer over SSH names them and says so."""
    root = tmp_path / "run"
    _old_file(root / "checkpoint-2" / "a_config.json", b"{}")
    _old_file(root / "checkpoint-2" / "b_model.safetensors", b"w" * 100)
    stuck = _old_file(root / "checkpoint-2" / "c_optimizer.pt", b"o" * 100)
    _old_file(root / "checkpoint-2" / "d_scheduler.pt", b"s")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here (needs root and a file system that has the flag)")
    try:
        await _fail_part_way(sshd_factory, root, tmp_path / "audit.log")
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)  # else pytest cannot remove it


async def _fail_part_way(sshd_factory, root, log):
    from opsconsole.checkpoints.cleanup import pin_plan

    link, fs = remote_fs(sshd_factory)
    try:
        plan = await asyncio.to_thread(pin_plan, _unit_plan(root, "checkpoint-2"), fs)
        result = await asyncio.to_thread(execute_plan, plan, str(root), AuditLog(str(log)), fs=fs)
        (failed,) = result.failed
        assert failed.went == ("checkpoint-2/a_config.json", "checkpoint-2/b_model.safetensors")
        assert failed.error == (
            "partly deleted: 2 of 4 files went, the unit is no longer whole "
            "(went: checkpoint-2/a_config.json, checkpoint-2/b_model.safetensors): "
            "checkpoint-2/c_optimizer.pt: Operation not permitted"
        )
        answer = result.to_json()["results"][0]
        assert answer["partly_deleted"] == {
            "files_went": 2,
            "files": 4,
            "entries_went": 2,
            "went": list(failed.went),
            "more": 0,
        }
        assert answer["error"] == "checkpoint-2/c_optimizer.pt: Operation not permitted"
        assert "partly deleted: 2 of 4 files went" in log.read_text()
        assert sorted(p.name for p in (root / "checkpoint-2").iterdir()) == ["c_optimizer.pt", "d_scheduler.pt"]
    finally:
        await fs.aclose()
        await link.close()
    assert link.channels_in_use == 0
