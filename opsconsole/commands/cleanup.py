"""`opsconsole cleanup DIR --keep N [--min-age S] [--dry-run] [--yes] [--json]`: the retention plan, then (asked) deletion.

The plan is printed first, every time. Without --yes it asks on a terminal and refuses
without one (a cron job must say --yes). Exit 0 when it ran (or only planned), 1 when a
deletion failed or the cleanup stopped (its audit record could not be written), 2 for bad
usage, a read-only config, or a refusal.

Refusals (read-only, no --yes off a terminal) and a cancel at the prompt are written to the
audit log, as the console's are. Names from the disk are printed through sanitize.printable_line,
--json through sanitize.printable_json.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import sys
import time
from typing import Any, Callable, Optional, TextIO

from opsconsole.sanitize import printable_json, printable_line

EXIT_OK = 0
EXIT_FAILED = 1


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number, got %r" % text) from None
    if value < 0:
        raise argparse.ArgumentTypeError("expected 0 or more, got %r" % text)
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds, got %r" % text) from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("expected 0 or more seconds, got %r" % text)
    return value


def register(commands: Any, add_node_options: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = commands.add_parser(
        "cleanup",
        help="delete old checkpoints by a retention plan (shown first)",
        description="Plan which checkpoints of DIR to delete (keeping the newest N, the best, latest's target, "
        "recent and open files), print the plan, and with --yes (or a yes on the terminal) carry it out.",
    )
    parser.add_argument("dir", metavar="DIR", help="the checkpoint directory")
    parser.add_argument(
        "--keep",
        metavar="N",
        type=_non_negative_int,
        help="keep the newest N checkpoints (default: the [[checkpoints]] entry of DIR)",
    )
    parser.add_argument(
        "--min-age",
        metavar="SECONDS",
        type=_non_negative_seconds,
        help="never delete anything modified within SECONDS (default 600)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    parser.add_argument("--yes", action="store_true", help="delete without asking")
    parser.add_argument("--json", action="store_true", help="print the plan (and the results) as JSON")
    parser.add_argument("--node", metavar="NAME", help="a configured SSH node that holds DIR (over SFTP)")
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="config file (TOML)")
    parser.set_defaults(handler=command_cleanup)


def _configured_entry(config: Any, root: str, node: Optional[str]) -> Any:
    for entry in config.checkpoints:
        same_node = (entry.node or None) == (node or None) or (node is None and entry.node in (None, "local"))
        if same_node and os.path.normpath(os.path.expanduser(entry.path)) == os.path.normpath(root):
            return entry
    return None


def plan_table(plan: Any) -> str:
    """The plan as text: one line per checkpoint (keep/delete, size, reason), then the bytes freed."""
    from opsconsole.commands.checkpoints import format_table, place_text, size_text

    place = place_text(plan.node, plan.root)
    rows = [("ACTION", "SIZE", "NAME", "UNIT", "REASON")]
    for item in plan.items:
        unit = ("%s: %s" % (item.layout, item.unit)) if getattr(item, "layout", "") else ""
        rows.append(
            (
                item.action.upper() if item.delete else item.action,
                size_text(item.size_bytes),
                item.name,
                unit,
                item.reason,
            )
        )
    text = format_table(rows) if plan.items else "no checkpoints in %s\n" % place
    for warning in plan.warnings:
        text += "warning: %s\n" % printable_line(warning)
    managed = sum(1 for item in plan.items if item.series is not None)
    text += (
        "plan: delete %d of %d checkpoint%s managed (%d not managed, kept), %s freed (keep %d, min-age %gs) in %s\n"
        % (
            len(plan.to_delete),
            managed,
            "" if managed == 1 else "s",
            len(plan.items) - managed,
            size_text(plan.bytes_freed),
            plan.keep,
            plan.min_age,
            place,
        )
    )
    return text


def ask(question: str, stdin: TextIO = sys.stdin, stderr: TextIO = sys.stderr) -> bool:
    stderr.write(question)
    stderr.flush()
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def confirmed_at_prompt(plan: Any, root: str, stdin: TextIO = sys.stdin, stderr: TextIO = sys.stderr) -> bool:
    """One unit: y/N. More than one: the directory's name typed, as the console asks (a stray `y` deletes nothing)."""
    from opsconsole.commands.checkpoints import place_text, size_text

    count, size = len(plan.to_delete), size_text(plan.bytes_freed)
    place = place_text(plan.node, root)
    if count == 1:
        return ask("delete 1 checkpoint (%s) in %s? [y/N] " % (size, place), stdin, stderr)
    word = posixpath.basename(posixpath.normpath(root)) or root
    stderr.write(
        "delete %d checkpoints (%s) in %s? type the directory's name, %s, to confirm: "
        % (count, size, place, printable_line(word))
    )
    stderr.flush()
    return stdin.readline().strip() == word


def _refuse(audit: Any, node: str, root: str, detail: str, outcome: str, message: str) -> str:
    """Write the refusal (or cancel) record; the one line to print, saying when it was not recorded."""
    from opsconsole.checkpoints.cleanup import ACTION_CLEANUP

    problem = audit.write(
        ACTION_CLEANUP,
        node,
        "cleanup of %s: %s (opsconsole cleanup)" % (root, detail),
        outcome,
        target="dir %s" % root,  # as the console's records of the same action name it
    )
    return message if problem is None else "%s; and not recorded: %s" % (message, printable_line(problem))


def command_cleanup(args: argparse.Namespace) -> int:
    """Plan, print, and (with --yes or a terminal's yes) delete; see the module docstring for exit codes."""
    from opsconsole.actions.audit import OUTCOME_CANCELLED, OUTCOME_REFUSED, AuditLog, audit_path
    from opsconsole.checkpoints.cleanup import SHOWN_MEMBERS, execute_plan, plan_directory
    from opsconsole.checkpoints.scan import scan_directory
    from opsconsole.commands._arguments import UsageError, config_from_args
    from opsconsole.commands.checkpoints import open_dir_access, write_out

    config = config_from_args(args)
    access = open_dir_access(args)
    try:
        entry = _configured_entry(config, access.root, getattr(args, "node", None))
        keep = args.keep if args.keep is not None else (entry.keep if entry is not None else None)
        if keep is None:
            raise UsageError("--keep N is required (DIR is not a configured [[checkpoints]] directory)")
        min_age = args.min_age if args.min_age is not None else (entry.min_age if entry is not None else 600.0)
        listing = scan_directory(access.root, access.fs)
        if listing.problem:
            print("opsconsole: %s" % printable_line(listing.problem), file=sys.stderr)
            return EXIT_FAILED
        plan = plan_directory(listing, access.fs, keep=keep, min_age=min_age, now=time.time())
        document = {"plan": plan.to_json(), "result": None}
        if not args.json:
            status = write_out(plan_table(plan))
            if status:
                return status
        if args.dry_run or not plan.to_delete:
            if args.json:
                return write_out(printable_json(document, indent=2) + "\n")
            return EXIT_OK
        audit = AuditLog(audit_path(config.actions))
        node = plan.node or access.fs.node
        planned = "%d deletions planned" % len(plan.to_delete)
        if config.console.read_only:
            raise UsageError(
                _refuse(
                    audit,
                    node,
                    access.root,
                    planned + ", read-only console: refused",
                    OUTCOME_REFUSED,
                    "read-only config: cleanup refused (nothing deleted)",
                )
            )
        if not args.yes:
            if not (sys.stdin.isatty() and sys.stderr.isatty()):
                raise UsageError(
                    _refuse(
                        audit,
                        node,
                        access.root,
                        planned + ", no --yes off a terminal: refused",
                        OUTCOME_REFUSED,
                        "refusing to delete without --yes when not on a terminal (nothing deleted)",
                    )
                )
            if not confirmed_at_prompt(plan, access.root):
                print(
                    _refuse(
                        audit,
                        node,
                        access.root,
                        planned + ", cancelled at the prompt",
                        OUTCOME_CANCELLED,
                        "cancelled: nothing deleted",
                    ),
                    file=sys.stderr,
                )
                if args.json:
                    return write_out(printable_json(document, indent=2) + "\n")
                return EXIT_OK
        result = execute_plan(plan, access.root, audit, fs=access.fs, user_detail=" (opsconsole cleanup)")
    finally:
        access.close()
    if args.json:
        document["result"] = result.to_json()
        status = write_out(printable_json(document, indent=2) + "\n")
    else:
        lines = ["deleted %s" % r.path if r.deleted else "FAILED %s: %s" % (r.path, r.error) for r in result.results]
        # The units not reached as --json names them: the first SHOWN_MEMBERS and how many more (every
        # planned unit is in the plan printed above; the summary counts them).
        lines += ["not attempted %s" % path for path in result.remaining[:SHOWN_MEMBERS]]
        if len(result.remaining) > SHOWN_MEMBERS:
            lines.append("and %d more not attempted" % (len(result.remaining) - SHOWN_MEMBERS))
        status = write_out("".join(printable_line(line) + "\n" for line in lines + [result.summary()]))
    if status:
        return status
    return EXIT_OK if result.ok else EXIT_FAILED
