"""Proofs kept per machine: a home directory shared between machines (NFS home) never shares them.

Every machine calls itself "local", and a file's identity (device, inode, size, mtime, ctime) is
only its own machine's: two machines listing the same path under one shared cache directory
must each keep and read their own store. Real HF units (tests/checkpoint_writers.py) listed by
the real scanner; the machines are two fake machine ids given to the store, and this_machine
is read from real files made here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.proofs import ProofStore, this_machine
from opsconsole.checkpoints.scan import scan_directory
from tests.checkpoint_writers import write_hf_layout
from tests.waiting import wait_for_sync

RACY_S = 0.05  # the files are seconds old; a user's are minutes old and meet the default 3 s


def age_tree(root: Path, hours: float = 2.0) -> None:
    for path in root.rglob("*"):
        st = path.lstat()
        os.utime(path, (st.st_atime - hours * 3600, st.st_mtime - hours * 3600), follow_symlinks=False)


def ctimes_older_than(root: Path, seconds: float) -> bool:
    now = time.time_ns()
    return all(now - p.lstat().st_ctime_ns > seconds * 1e9 for p in root.rglob("*"))


def listed(root: Path, store: ProofStore):
    listing = scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache(), proofs=store, keep_proofs=False)
    store.flush()
    return listing


def kept_uses(store: ProofStore) -> int:
    """How much of what was kept a listing used: files, units, and the whole listing where the store keeps one."""
    return store.hits + store.unit_hits + getattr(store, "listing_hits", 0)


def test_two_machines_sharing_a_home_keep_and_read_their_own_proofs(tmp_path):
    root = tmp_path / "run"
    write_hf_layout(root, steps=(500, 1000), best=500)
    age_tree(root)
    wait_for_sync(lambda: ctimes_older_than(root, RACY_S), "the files' ctimes past the racy margin", timeout=10)
    shared = tmp_path / "home" / ".cache" / "opsconsole" / "proofs"  # one NFS home seen by both machines

    node_a = ProofStore("local", str(root), str(shared), racy_s=RACY_S, machine="aaaa0001@gpu01")
    listed(root, node_a)
    assert node_a.units_stored == 2 and Path(node_a.path).exists()

    node_b = ProofStore("local", str(root), str(shared), racy_s=RACY_S, machine="bbbb0002@gpu02")
    assert node_b.path != node_a.path
    entries = listed(root, node_b).entries
    assert kept_uses(node_b) == 0  # machine A's proofs are not machine B's: every file read again
    assert all(entry.integrity == "ok" for entry in entries)

    again_a = ProofStore("local", str(root), str(shared), racy_s=RACY_S, machine="aaaa0001@gpu01")
    listed(root, again_a)
    assert kept_uses(again_a) > 0  # each machine still finds its own
    assert sorted(os.listdir(shared)) == sorted(os.path.basename(p) for p in (node_a.path, node_b.path))


def test_this_machine_is_its_machine_id_else_its_boot_id_with_its_hostname(tmp_path):
    host = os.uname().nodename
    first, second, boot = tmp_path / "machine-id", tmp_path / "dbus-machine-id", tmp_path / "boot_id"
    first.write_text("0123456789abcdef0123456789abcdef\n")
    second.write_text("fedcba9876543210fedcba9876543210\n")
    boot.write_text("6c0c41c5-6a2b-4a35-9b2e-6d0f6d9e2c11\n")
    missing = str(tmp_path / "none")
    assert this_machine((str(first), str(second)), str(boot)) == "0123456789abcdef0123456789abcdef@" + host
    assert this_machine((missing, str(second)), str(boot)) == "fedcba9876543210fedcba9876543210@" + host
    first.write_text("")  # an image whose machine id was emptied for first boot
    assert this_machine((str(first), missing), str(boot)) == "6c0c41c5-6a2b-4a35-9b2e-6d0f6d9e2c11@" + host
    assert this_machine((missing,), missing) == "@" + host  # the hostname alone
    # This machine's own: the same every time it is asked, and not the hostname alone where /etc has an id.
    assert this_machine() == this_machine()
    if Path("/etc/machine-id").is_file() and Path("/etc/machine-id").read_text().strip():
        assert this_machine().startswith(Path("/etc/machine-id").read_text().strip() + "@")
