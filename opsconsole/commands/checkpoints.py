"""`opsconsole checkpoints DIR [--json]`: list a checkpoint directory as the Checkpoints pane shows it.

File and zip member names, link targets and problems come from the disk: the table prints each
cell through sanitize.printable_line (an escape sequence or a newline in a name stays one visible
line and cannot forge a row), and --json goes through sanitize.printable_json.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import shlex
import sys
import time
from typing import Any, Callable, List, Optional, Tuple

from opsconsole.sanitize import printable_json, printable_line
from opsconsole.units import format_metric

EXIT_OK = 0
EXIT_FAILED = 1


def register(commands: Any, add_node_options: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = commands.add_parser(
        "checkpoints",
        help="list a checkpoint directory: format, epoch/step, loss, size, integrity",
        description="List the checkpoints of DIR with their metadata, read without loading tensors.",
    )
    parser.add_argument("dir", metavar="DIR", help="the checkpoint directory")
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.add_argument("--node", metavar="NAME", help="a configured SSH node that holds DIR (read over SFTP)")
    parser.add_argument("--verify", action="store_true", help="also check every CRC (reads the whole files)")
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="config file (TOML)")
    parser.set_defaults(handler=command_checkpoints)


# --- reaching the directory (shared with `cleanup`) ------------------------------------------


class DirAccess:
    """The FileSystem for DIR: local, or a node's SFTP over an event loop in a thread (closed by close())."""

    def __init__(self, fs: Any, root: str, loop_thread: Any = None, link: Any = None) -> None:
        self.fs = fs
        self.root = root
        self._loop_thread = loop_thread
        self._link = link

    def close(self) -> None:
        if self._loop_thread is None:
            return
        try:
            self._loop_thread.run(self.fs.aclose(), 10.0)
            self._loop_thread.run(self._link.close(), 10.0)
        finally:
            self._loop_thread.stop()


def open_dir_access(args: argparse.Namespace) -> DirAccess:
    """Check DIR (and --node) and return how to reach it; UsageError for a bad one."""
    from opsconsole.commands._arguments import UsageError, config_from_args

    root = args.dir
    if not root or not root.strip():
        raise UsageError("DIR is empty")
    from opsconsole.checkpoints.access import LOCAL

    node_name = getattr(args, "node", None)
    node = None
    if node_name:
        config = config_from_args(args)
        node = next((n for n in config.nodes if n.name == node_name), None)
        if node is None:
            names = ", ".join(n.name for n in config.nodes)
            raise UsageError(
                printable_line(
                    "--node %s: no such node in %s (nodes: %s)" % (node_name, config.source or "the config", names)
                )
            )
    if node is None or node.local:
        if not os.path.isdir(root):
            raise UsageError(
                "%s: %s"
                % (printable_line(root), "no such directory" if not os.path.exists(root) else "not a directory")
            )
        return DirAccess(LOCAL, os.path.abspath(root))
    if not root.startswith("/"):
        raise UsageError("DIR on a node must be an absolute path, got %r" % root)
    from opsconsole.checkpoints.remote import LoopThread, SftpFileSystem
    from opsconsole.nodes.ssh import SshLink

    loop_thread = LoopThread()

    async def make() -> Any:
        return SshLink(node, config.ssh, config.console.interval)

    link = loop_thread.run(make(), 10.0)
    fs = SftpFileSystem(link, loop_thread.loop, timeout=config.ssh.connect_timeout + 30.0)
    access = DirAccess(fs, root.rstrip("/") or "/", loop_thread, link)
    try:
        st = fs.stat(access.root)
    except OSError as exc:
        access.close()
        raise UsageError(printable_line("%s:%s: %s" % (node_name, root, exc.strerror or exc))) from None
    if not st.is_dir:
        access.close()
        raise UsageError(printable_line("%s:%s: not a directory" % (node_name, root)))
    return access


# --- text output ----------------------------------------------------------------------------


def size_text(value: Optional[float]) -> str:
    """`537 KiB`, `1.5 GiB`; `-` when unknown (see opsconsole.units)."""
    from opsconsole.units import format_bytes

    return format_bytes(value, missing="-")


def age_text(seconds: float) -> str:
    """`3s`, `12m`, `5h`: the AGE column as the Checkpoints pane's Age column says it (opsconsole.units)."""
    from opsconsole.units import format_age

    return format_age(seconds)


def marks(entry: Any) -> str:
    """What the library recorded, as the Checkpoints pane says it: the tag DeepSpeed's `latest` (or
    Megatron's tracker file) names is the `current tag`, not `latest` (a newer tag may exist)."""
    from opsconsole.checkpoints.records import CURRENT_TAG

    out = []
    if entry.current_tag:
        out.append(CURRENT_TAG)
    elif entry.latest:
        out.append("latest")
    if entry.best:
        out.append("best")
    if any(p.startswith("top-k") for p in getattr(entry, "protections", ())):
        out.append("top-k")
    if entry.is_link:
        out.append("-> " + (entry.link_target or "?"))
    return ",".join(out)


def loss_text(entry: Any) -> str:
    if entry.meta.loss is None:
        return "-"
    return format_metric(entry.meta.loss) + ("*" if entry.lowest_loss else "")


def format_table(rows: List[Tuple[str, ...]]) -> str:
    """Aligned columns; every cell through printable_line (same length, so the widths hold)."""
    rows = [tuple(printable_line(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def listing_table(listing: Any, now: float) -> str:
    """The listing as a text table with a totals line (what the pane shows)."""
    if listing.problem:
        return printable_line("%s: %s" % (listing.root, listing.problem)) + "\n"
    rows = [
        (
            "NAME",
            "LAYOUT",
            "UNIT",
            "FORMAT",
            "EPOCH",
            "STEP",
            "LOSS",
            "SIZE",
            "AGE",
            "INTEGRITY",
            "MARKS",
            "SERIES",
            "PROBLEM",
        )
    ]
    for e in listing.entries:
        rows.append(
            (
                e.name,
                e.layout,
                e.unit,
                e.format,
                epoch_text(e),
                "-" if e.meta.step is None else str(e.meta.step),
                loss_text(e),
                size_text(e.size_bytes),
                age_text(now - e.mtime),
                e.integrity + (" (crc)" if e.crc_checked else ""),
                marks(e),
                e.series or "not managed",
                "; ".join(p for p in (e.problem, e.unreadable if e.unreadable != e.problem else None) if p),
            )
        )
    place = place_text(listing.node, listing.root)
    text = format_table(rows) if listing.entries else "no checkpoints in %s\n" % place
    free = (
        ""
        if listing.free_bytes is None
        else ", %s free of %s" % (size_text(listing.free_bytes), size_text(listing.fs_bytes))
    )
    text += totals_text(listing) + " in %s%s\n" % (place, free)
    text += "".join(printable_line("warning: " + warning) + "\n" for warning in listing.warnings)
    return text


SUBDIRS_LOOKED_AT = 64  # a directory of many runs: the first names, in order, are enough for a hint
NAMES_LOOKED_AT = 2000


def checkpoint_dirs_below(root: str, fs: Any) -> List[str]:
    """The subdirectories of `root` (up to SUBDIRS_LOOKED_AT) whose own names include a checkpoint's
    (checkpoint-N/, global_stepN/, *.ckpt, *.safetensors ...): where a user pointed one level too high.
    Names only, no file read; a directory that cannot be listed is passed over."""
    from opsconsole.checkpoints.layouts import dir_series, is_checkpoint_file_name

    try:
        subdirs = sorted(item.name for item in fs.listdir(root) if item.stat.is_dir and not item.stat.is_link)
    except OSError:
        return []
    found = []
    for name in subdirs[:SUBDIRS_LOOKED_AT]:
        try:
            items = fs.listdir(posixpath.join(root, name))[:NAMES_LOOKED_AT]
        except OSError:
            continue
        if any(dir_series(i.name) if i.stat.is_dir else is_checkpoint_file_name(i.name) for i in items):
            found.append(name)
    return found


def place_text(node: Optional[str], root: str) -> str:
    """Where a listing or plan is: the directory, as NODE:DIR when it is on another machine (a plan to
    delete must say which machine's files go; the same path often exists on every node)."""
    if node and node != "local":
        return printable_line("%s:%s" % (node, root))
    return printable_line(root)


def totals_text(listing: Any) -> str:
    """`3 checkpoints managed (1.2 MiB); 2 not managed (130 KiB)`, `; 4 other files` when some are:
    the managed units apart from the rest the listing shows (a final model, last.ckpt, lone files)."""
    text = "%d checkpoint%s managed (%s); %d not managed (%s)" % (
        listing.managed_count,
        "" if listing.managed_count == 1 else "s",
        size_text(listing.managed_bytes),
        listing.unmanaged_count,
        size_text(listing.unmanaged_bytes),
    )
    if listing.other_files:
        text += "; %d other file%s" % (listing.other_files, "" if listing.other_files == 1 else "s")
    return text


def epoch_text(entry: Any) -> str:
    """The epoch as the library recorded it: HF's fractional epoch (1.5), else the whole one."""
    exact = entry.meta.epoch_float
    if exact is not None and exact != int(exact):
        return "%.2f" % exact
    return "-" if entry.meta.epoch is None else str(entry.meta.epoch)


def listing_document(listing: Any) -> dict:
    """The --json document: {"dir", "checkpoints": [...]} plus totals (all listed, managed, not managed) and warnings."""
    return {
        "dir": listing.root,
        "node": listing.node,
        "checkpoints": [e.to_json() for e in listing.entries],
        "total_bytes": listing.total_bytes,  # every unit listed: managed and not
        "managed": {"count": listing.managed_count, "bytes": listing.managed_bytes},
        "not_managed": {"count": listing.unmanaged_count, "bytes": listing.unmanaged_bytes},
        "other_files": listing.other_files,
        "free_bytes": listing.free_bytes,
        "problem": listing.problem,
        "warnings": list(listing.warnings),
    }


def write_out(text: str) -> int:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return EXIT_OK


def command_checkpoints(args: argparse.Namespace) -> int:
    """List DIR; exit 0 when listed, 1 when the directory could not be read."""
    from dataclasses import replace

    from opsconsole.checkpoints.scan import scan_directory
    from opsconsole.checkpoints.verify import can_verify, verify_checkpoint

    access = open_dir_access(args)
    try:
        listing = scan_directory(access.root, access.fs)
        if args.verify and not listing.problem:
            checked = []
            for entry in listing.entries:
                if can_verify(entry) is None:
                    result = verify_checkpoint(entry, access.fs)
                    entry = replace(
                        entry, integrity=result.integrity, problem=result.problem or entry.problem, crc_checked=True
                    )
                checked.append(entry)
            listing = replace(listing, entries=tuple(checked))
        below = [] if listing.problem or listing.managed_count else checkpoint_dirs_below(access.root, access.fs)
    finally:
        access.close()
    if args.json:
        status = write_out(printable_json(listing_document(listing), indent=2) + "\n")
    else:
        text = listing_table(listing, time.time())
        if below:
            text += "checkpoints one level down, in %s: list one with opsconsole checkpoints %s\n" % (
                ", ".join(printable_line(name + "/") for name in below),
                shlex.quote(printable_line(posixpath.join(access.root, below[0]))),
            )
        status = write_out(text)
    if status:
        return status
    if listing.problem:
        print("opsconsole: %s" % printable_line(listing.problem), file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
