"""`opsconsole agent`: the probe on this node, as JSON lines or (with --metrics-port) a Prometheus exporter."""

from __future__ import annotations

import argparse


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a TCP port number, got %r" % text) from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("expected a port between 0 and 65535, got %d" % value)
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds, got %r" % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError("expected a positive number of seconds, got %r" % text)
    return value


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "agent",
        help="run the probe on this node: JSON lines, or a Prometheus exporter with --metrics-port",
        description=(
            "Run the probe on this node. With --metrics-port it serves /metrics in the Prometheus "
            "text format (dcgm-exporter metric and label names, extra health fields under opsconsole_); "
            "without, it prints one JSON frame per line."
        ),
    )
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
        default=None,
        help="serve /metrics on this port (0: any free port, printed at start)",
    )
    parser.add_argument(
        "--bind",
        metavar="ADDRESS",
        default=None,
        help="address to listen on with --metrics-port (default 127.0.0.1: this node only)",
    )
    parser.add_argument(
        "--interval",
        metavar="S",
        type=_interval,
        default=None,
        help="seconds between probe polls (default 5 with --metrics-port, else 2)",
    )
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        default=None,
        help="the node's name in frames and the Hostname label (default: hostname)",
    )
    parser.add_argument(
        "--disk", metavar="PATH", action="append", default=None, help="file system to report (repeatable; default /)"
    )
    parser.set_defaults(handler=command_agent)


def command_agent(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import UsageError

    if args.metrics_port is None:
        if args.bind is not None:
            raise UsageError("--bind needs --metrics-port")
        from opsconsole.probe.agent import main as probe_main

        argv = ["--interval", str(args.interval or 2.0)]
        if args.node_name:
            argv += ["--node-name", args.node_name]
        for path in args.disk or ():
            argv += ["--disk", path]
        return probe_main(argv)

    from opsconsole.exporter.serve import (
        DEFAULT_BIND,
        DEFAULT_INTERVAL_S,
        ExporterError,
        check_bind_address,
        serve_probe,
    )
    from opsconsole.probe.agent import Probe

    bind = args.bind or DEFAULT_BIND
    try:
        check_bind_address(bind)
    except ExporterError as exc:
        raise UsageError(str(exc)) from None
    probe = Probe(
        node_name=args.node_name, disk_paths=tuple(args.disk or ("/",)), top=0
    )  # host top list is not exported
    try:
        return serve_probe(
            args.metrics_port,
            bind,
            args.interval or DEFAULT_INTERVAL_S,
            probe=probe,
            announce=lambda line: print(line, flush=True),
        )
    except ExporterError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        return 0
