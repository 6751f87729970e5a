"""Headless subcommands of `opsconsole`, one module each.

A module here defines `register(commands, add_node_options)`: it adds its subparser to
`commands` (argparse's subparsers object), calls `add_node_options(parser)` if it takes
`--config/--nodes/--slurm-job`, and sets `handler=` to a function `(args) -> int` (exit status).
Raise `opsconsole.commands._arguments.UsageError` for a bad argument: main prints it on one line, exit 2.
"""
