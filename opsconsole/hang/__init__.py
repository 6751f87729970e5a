"""Finding out why a run hangs: stacks of every rank, the flight recorder, NCCL watchdog lines."""
