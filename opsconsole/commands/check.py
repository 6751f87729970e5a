"""`opsconsole check [--node NAME] [--gpu-tests] [--json]`: health checks for cron or a Slurm prolog.

Polls the nodes once (as `snapshot` does), runs the threshold rules and telemetry findings
on each frame, and with --gpu-tests the on-node GPU suite. Exit 0 when everything passes
(warnings allowed), 1 when any check fails, 2 when a check could not run.

Node names, GPU names and the messages of failed checks can hold outside text (a node's error, a
name from its driver): the table prints each line through sanitize.printable_line, --json goes
through sanitize.printable_json.
"""

from __future__ import annotations

import argparse
import sys

from opsconsole.sanitize import printable_json, printable_line


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "check",
        help="run the health checks once (exit 0 pass/warn, 1 fail, 2 could not run)",
        description="Poll the nodes once and run the health checks: thresholds from [health], findings from "
        "telemetry, and with --gpu-tests the GPU sanity suite on each node. Exit 0 when all pass "
        "(warnings allowed), 1 when any check fails, 2 when a check could not run.",
    )
    add_node_options(parser)
    parser.add_argument("--node", action="append", metavar="NAME", help="check only this node (repeatable)")
    parser.add_argument(
        "--gpu-tests", action="store_true", help="also run the GPU sanity suite on each node (torch on the node)"
    )
    parser.add_argument(
        "--force", action="store_true", help="with --gpu-tests: also test GPUs that run compute processes"
    )
    parser.add_argument(
        "--level",
        type=int,
        choices=(1, 2),
        help="with --gpu-tests: 1 quick (seconds, the default), 2 longer (as dcgmi diag -r 1/2)",
    )
    parser.add_argument("--json", action="store_true", help='print {"results": [...]} as JSON')
    parser.add_argument("--all", action="store_true", help="list passing checks too (the table shows problems only)")
    parser.add_argument("--timeout", metavar="S", type=float, default=10.0, help="give up polling a node after S s")
    parser.set_defaults(handler=command_check)


def select_nodes(config, names):
    """The config restricted to `names` (UsageError naming the unknown one, with a suggestion)."""
    import difflib
    from dataclasses import replace

    from opsconsole.commands._arguments import UsageError

    if not names:
        return config
    known = [node.name for node in config.nodes]
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = " (did you mean %s?)" % close[0] if close else ""
            raise UsageError(
                printable_line("check: no node is named %s%s; nodes: %s" % (name, hint, ", ".join(known) or "none"))
            )
    return replace(config, nodes=tuple(node for node in config.nodes if node.name in names))


SOURCE_CHECK = "source_reachable"
REMEDY_SOURCE = (
    "check the source's url, its bearer_token_file and TLS options in [[sources]] "
    "(curl URL/-/ready from this machine); its nodes are not checked until it answers"
)


def source_results(statuses, now: float) -> list:
    """One result per [[sources]] entry: error when it did not answer (it then reports no node at all,
    which left `check` saying `0 checks on 0 node(s)` and nothing else), warn when it answered with no node."""
    from opsconsole.health.result import STATUS_ERROR, STATUS_PASS, STATUS_WARN, HealthResult

    results = []
    for status in statuses:
        evidence = (("url", status.url), ("state", status.state), ("nodes", str(status.nodes)))
        if status.state != "up":
            message = "%s: %s" % (status.state, status.reason or "no answer")
            results.append(
                HealthResult(SOURCE_CHECK, status.name, STATUS_ERROR, message, None, evidence, REMEDY_SOURCE, now)
            )
        elif not status.nodes:
            message = "up at %s, but reports no node (no scrape target)" % status.url
            results.append(
                HealthResult(SOURCE_CHECK, status.name, STATUS_WARN, message, None, evidence, REMEDY_SOURCE, now)
            )
        else:
            message = "up, %d node%s" % (status.nodes, "" if status.nodes == 1 else "s")
            results.append(
                HealthResult(SOURCE_CHECK, status.name, STATUS_PASS, message, None, evidence, REMEDY_SOURCE, now)
            )
    return results


async def gather_results(config, timeout: float, gpu_tests: bool, force: bool, follower=None, level: int = 1):
    """Poll once, then run every node's checks (and say how each source answered); the links are closed afterwards."""
    import time

    from opsconsole.health.runner import run_all_checks, snapshot_for_checks
    from opsconsole.sources import fleet_with_sources

    fleet = fleet_with_sources(config)
    if follower is not None:
        fleet.follow_slurm(follower)
    try:
        states = await snapshot_for_checks(fleet, timeout)
        links = {name: fleet.link(name) for name in fleet.names}
        by_node = await run_all_checks(states, config, links=links, gpu_tests=gpu_tests, force=force, level=level)
        sources = source_results(fleet.source_statuses(), time.time())
    finally:
        await fleet.stop()
    return sources + [result for results in by_node.values() for result in results]


def results_table(results, show_all: bool) -> str:
    """Problems first (fail, error, warn), one line each, and a summary line."""
    order = {"fail": 0, "error": 1, "warn": 2, "skip": 3, "pass": 4}
    shown = [r for r in results if show_all or r.status != "pass"]
    shown.sort(key=lambda r: (order.get(r.status, 9), r.node, -1 if r.gpu is None else r.gpu, r.check))
    lines = []
    for r in shown:
        where = r.node + ("" if r.gpu is None else " gpu%d" % r.gpu)
        lines.append(printable_line("%-5s %-20s %-22s %s" % (r.status.upper(), where, r.check, r.message)))
        if r.status != "pass" and r.remedy:
            lines.append(printable_line("      remedy: %s" % r.remedy))
    counts = {status: sum(1 for r in results if r.status == status) for status in order}
    nodes = len({r.node for r in results if r.check != SOURCE_CHECK})
    lines.append(
        "%d checks on %d node(s): %d fail, %d error, %d warn, %d pass%s"
        % (
            len(results),
            nodes,
            counts["fail"],
            counts["error"],
            counts["warn"],
            counts["pass"],
            ", %d skipped" % counts["skip"] if counts["skip"] else "",
        )
    )
    return "\n".join(lines) + "\n"


def command_check(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import config_from_args, run_without_joining_threads, slurm_follower
    from opsconsole.health.runner import EXIT_ERROR, exit_status, result_to_json

    config = select_nodes(config_from_args(args), args.node)
    if not config.nodes and not getattr(config, "sources", ()):
        from opsconsole.commands._arguments import UsageError

        raise UsageError("check: no nodes configured")
    if not args.gpu_tests and (args.force or args.level is not None):
        from opsconsole.commands._arguments import UsageError

        # Ignored, `check --level 2` would pass on the telemetry alone, no GPU tested.
        raise UsageError("check: --level and --force go with --gpu-tests, e.g. check --gpu-tests --level 2")
    results = run_without_joining_threads(
        gather_results(config, args.timeout, args.gpu_tests, args.force, slurm_follower(args), args.level or 1)
    )
    if args.json:
        text = printable_json({"results": [result_to_json(r) for r in results]}, indent=2) + "\n"
    else:
        text = results_table(results, args.all)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    if not any(r.check != SOURCE_CHECK for r in results):
        return EXIT_ERROR  # no node was checked: a source that answers is not a passing node
    return exit_status(results)
