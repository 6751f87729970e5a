"""The probe agent: one poll of GPUs, host and processes as a NodeFrame, and the loop that prints them.

Shipped over SSH as one script on stdin to `python3 -` (the bundler puts model.py and the
probe modules in sys.modules and calls main(argv)), so imports are absolute and nothing
relies on __file__. Output: one JSON line per frame on stdout, flushed. The loop stops
quietly (exit 0) when stdout closes or on SIGTERM, SIGINT or SIGHUP; stdin is never read,
because the interpreter consumed it as the script.
"""

import argparse
import json
import math
import os
import signal
import socket
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from opsconsole.model import NodeFrame, ProcessSample, to_wire
from opsconsole.probe.host import HostReader, describe_error
from opsconsole.probe.procs import MAX_HOST_PROCESSES, ProcessTable


class _MissingGpuReader(object):
    """Stands in when opsconsole.probe.gpu cannot be loaded: no GPUs, and the reason as an error."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> Any:
        raise RuntimeError(self.reason)

    def close(self) -> None:
        pass


def _default_gpu_reader(slow_every: int) -> Any:
    try:
        from opsconsole.probe.gpu import GpuReader  # lazily: NVML loads only when polled
    except Exception as exc:
        return _MissingGpuReader("gpu reader unavailable: " + describe_error(exc))
    try:
        return GpuReader(slow_every=slow_every)
    except Exception as exc:
        return _MissingGpuReader("gpu reader failed to start: " + describe_error(exc))


class Probe:
    """Polls one node: GPUs (GpuReader), host stats (HostReader), processes (ProcessTable).

    Each part is isolated: a part that fails adds "part: message" to frame.errors and the
    others still report. Readers may be injected (tests, or a console that shares them).
    """

    def __init__(
        self,
        node_name: Optional[str] = None,
        disk_paths: Sequence[str] = ("/",),
        slow_every: int = 5,
        top: int = MAX_HOST_PROCESSES,
        gpu_reader: Any = None,
        host_reader: Optional[HostReader] = None,
        process_table: Optional[ProcessTable] = None,
    ) -> None:
        self.node_name = node_name or socket.gethostname()
        self.top = max(0, int(top))
        self.slow_every = slow_every
        self._gpu_reader = gpu_reader  # created on first poll when None
        self._host_reader = host_reader or HostReader(disk_paths=disk_paths)
        self._process_table = process_table or ProcessTable()
        self.seq = 0

    def _gpu(self) -> Any:
        if self._gpu_reader is None:
            self._gpu_reader = _default_gpu_reader(self.slow_every)
        return self._gpu_reader

    def prime(self, settle_s: float = 0.25) -> None:
        """Take CPU and network baselines and wait `settle_s`, so the next poll has rates."""
        for prime in (self._host_reader.prime, self._process_table.prime):
            try:
                prime()
            except Exception:
                pass  # the poll will report the same failure as an error
        time.sleep(settle_s)

    def prime_processes(self) -> None:
        """Take the host process list's CPU baseline (no users, no command lines read), so the next
        poll's list has CPU %: after a poll without host processes."""
        try:
            self._process_table.prime()
        except Exception:
            pass  # the next poll reports the same failure as an error

    def poll(self, host_processes: bool = True) -> NodeFrame:
        """One frame; never raises for a failing part (seq counts frames from 1).

        host_processes=False leaves the host's process list out (GPU processes are still joined):
        the console's first frame, whose list would have no CPU % yet and whose users and command
        lines (a few hundred reads) would delay the first screen; prime_processes() follows it.
        """
        started = time.perf_counter()
        now = time.time()
        errors: List[str] = []
        gpus: Tuple[Any, ...] = ()
        gpu_procs: Tuple[ProcessSample, ...] = ()
        gpu_source: str = "none"
        gpu_note: Optional[str] = None
        driver: Optional[str] = None
        try:
            reading = self._gpu().read()
            gpus = tuple(reading.gpus)
            gpu_procs = tuple(reading.processes)
            gpu_source = reading.source
            gpu_note = reading.note
            driver = reading.driver_version
            errors.extend(reading.errors)
        except Exception as exc:
            errors.append("gpu: " + describe_error(exc))
            gpu_note = str(exc) or type(exc).__name__

        host = None
        try:
            host = self._host_reader.read()
            errors.extend(self._host_reader.last_errors)
        except Exception as exc:
            errors.append("host: " + describe_error(exc))

        top: Tuple[ProcessSample, ...] = ()
        if self.top and host_processes:
            try:
                top = self._process_table.sample(self.top)
                errors.extend(self._process_table.last_errors)
            except Exception as exc:
                errors.append("procs: " + describe_error(exc))
        processes = gpu_procs
        if gpu_procs:
            try:
                processes = self._process_table.join(gpu_procs)
            except Exception as exc:
                errors.append("procs.join: " + describe_error(exc))

        self.seq += 1
        return NodeFrame(
            node=self.node_name,
            time=now,
            seq=self.seq,
            host=host,
            gpus=gpus,
            processes=processes,
            top_processes=top,
            gpu_source=gpu_source,
            gpu_note=gpu_note,
            driver_version=driver,
            errors=tuple(errors),
            probe_ms=round((time.perf_counter() - started) * 1000.0, 2),
        )

    def close(self) -> None:
        """Release the GPU reader (NVML shutdown); safe to call twice."""
        reader, self._gpu_reader = self._gpu_reader, None
        if reader is not None:
            try:
                reader.close()
            except Exception:
                pass


# --- the loop ----------------------------------------------------------------------


class _Stop(BaseException):
    """Raised by the signal handler: BaseException, so the parts' `except Exception` let it pass."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def next_deadline(deadline: float, now: float, interval: float) -> float:
    """The first deadline after `now` on the grid deadline + k*interval (an overrun skips ticks)."""
    following = deadline + interval
    if now < following:
        return following
    missed = math.floor((now - following) / interval) + 1
    return following + missed * interval


def delay_to_grid(now: float, interval: float) -> float:
    """Seconds from `now` (wall clock) to the next multiple of `interval` at least half an interval away.

    Every node's agent ticks on the same wall-clock grid (a cluster's clocks are NTP-synced):
    the frames of all nodes describe the same instant, so the console compares like with like,
    and they reach it together, read in one event-loop wake-up instead of one per node. Half
    an interval at least: a tick that woke a little early, or a poll that overran, never gives
    two frames in a row; an overrun skips a tick.
    """
    delay = interval - math.fmod(now, interval)
    if delay < interval / 2.0:
        delay += interval
    return delay


def frame_line(frame: NodeFrame) -> str:
    """The wire line of a frame: compact JSON, no newline."""
    return json.dumps(to_wire(frame), separators=(",", ":"))


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The agent's command line."""
    # The stream's encoder is the agent's alone: the console's in-process probe (nodes/local.py)
    # imports this module without it (~1 ms and 0.2 MB of its launch on the VM).
    from opsconsole.probe.wire_delta import DEFAULT_KEYFRAME_EVERY

    parser = argparse.ArgumentParser(prog="opsconsole-probe", description="Print one JSON NodeFrame per line.")
    parser.add_argument(
        "--interval", type=_positive_float, default=2.0, metavar="SECONDS", help="seconds between polls"
    )
    parser.add_argument("--once", action="store_true", help="print one frame (with rates) and exit")
    parser.add_argument("--disk", action="append", metavar="PATH", help="disk path to report (repeatable; default /)")
    parser.add_argument(
        "--top",
        type=_non_negative_int,
        default=MAX_HOST_PROCESSES,
        metavar="N",
        help="host processes sent, at most (all of them up to N; beyond, D state then busiest first; 0: none)",
    )
    parser.add_argument(
        "--slow-every", type=_positive_int, default=5, metavar="N", help="read slow GPU fields every N polls"
    )
    parser.add_argument("--node-name", default=None, metavar="NAME", help="node name in frames (default: hostname)")
    parser.add_argument(
        "--delta", action="store_true", help="stream a keyframe, then only what changed (see probe/wire_delta.py)"
    )
    parser.add_argument(
        "--keyframe-every",
        type=_positive_int,
        default=DEFAULT_KEYFRAME_EVERY,
        metavar="N",
        help="with --delta: a full frame every N lines (default %d)" % DEFAULT_KEYFRAME_EVERY,
    )
    return parser


def _silence_stdout() -> None:
    # After EPIPE, the interpreter's final flush of stdout would print a traceback: point it at /dev/null.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _install_stop_signals() -> List[Tuple[int, Any]]:
    previous = []
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        try:
            previous.append((signum, signal.signal(signum, _raise_stop)))
        except (ValueError, OSError):  # not the main thread: the caller owns signals
            pass
    return previous


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the agent: print frames until stopped; 0 on a normal stop, 2 on bad arguments."""
    args = build_parser().parse_args(argv)
    previous = _install_stop_signals()
    probe: Optional[Probe] = None
    out = sys.stdout
    try:
        probe = Probe(
            node_name=args.node_name,
            disk_paths=tuple(args.disk or ("/",)),
            slow_every=args.slow_every,
            top=args.top,
        )
        if args.once:
            probe.prime()
            out.write(frame_line(probe.poll()) + "\n")
            out.flush()
            return 0
        # --delta: a keyframe, then deltas (floats rounded); the default stays one full frame per line.
        from opsconsole.probe.wire_delta import DeltaEncoder

        encode = DeltaEncoder(args.keyframe_every).encode if args.delta else frame_line
        while True:  # the first frame at once, then on the wall-clock grid
            out.write(encode(probe.poll()) + "\n")
            out.flush()
            time.sleep(delay_to_grid(time.time(), args.interval))
    except (BrokenPipeError, ConnectionResetError):
        _silence_stdout()
        return 0
    except (_Stop, KeyboardInterrupt):
        return 0
    except ValueError:
        if out.closed:  # "I/O operation on closed file": the reader went away
            return 0
        raise
    finally:
        if probe is not None:
            probe.close()
        for signum, handler in previous:
            try:
                signal.signal(signum, handler)
            except (ValueError, OSError, TypeError):
                pass


if __name__ == "__main__":
    sys.exit(main())
