"""Following 16 log files appended at 200,000 lines/s in total: delivery, latency, memory, CPU vs `tail -F`.

Three processes besides this one, all on the same files in a temp dir made here:
  writer    a separate Python process appending realistic training-log lines (the seed's
            '%(asctime)s - %(levelname)s - %(message)s', some NCCL INFO chatter, varied lengths) to
            16 files at --rate lines/s in total for --seconds; every line ends with its file's
            sequence number and the time.time_ns() it was written. It writes every --tick-ms what
            is due, one write() per file, as a logging FileHandler flushing per record would at
            that rate (batched by the clock tick).
  follower  the console's code path: opsconsole.logs.hub.LogHub (LocalFollower: inotify, FileTail,
            LogLine per line) on a config whose [logs] paths glob the 16 files, delivering on its
            asyncio loop to a consumer that checks every line arrived once and in order per file,
            and records write-to-delivery latency (a 0.1 ms histogram: bounded memory).
  tail -F   GNU tail following the same 16 files in the same run (`tail -q -F -n 0 FILES`), its
            output counted by a reader thread here (the reader's CPU is not tail's).
This process samples RSS and CPU of follower and tail every 0.25 s.

Printed: lines written/delivered, duplicates/gaps/out-of-order, p50/p99/max latency (target p99
<= 250 ms), follower RSS at start/peak/end (memory bounded: growth), CPU seconds of the follower
and of tail -F, and their ratio. On a 2-core machine the writer (and tail) compete with the
follower for the cores: the figures say how busy each was.

    .venv/bin/python benchmarks/log_follow.py [--seconds 30] [--rate 200000] [--files 16] [--tick-ms 1]
                                              [--polling] [--no-tail]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIST_STEP_NS = 100_000  # latency histogram bucket: 0.1 ms
HIST_BUCKETS = 600_000  # up to 60 s


def file_names(folder: str, count: int) -> List[str]:
    """The seed's naming: train_{hostname}_rank{rank}_{timestamp}.log, 8 ranks per host."""
    return [
        os.path.join(folder, "train_gpu-b%02d_rank%d_20261202_230800.log" % (rank // 8 + 1, rank))
        for rank in range(count)
    ]


# --- the writer (a separate process) ------------------------------------------------------------------

MESSAGES = (
    "Epoch {epoch} Step {step}/{total} loss={loss:.4f} lr={lr:.3e} grad_norm={grad:.3f} tokens/s={tps}",
    "Epoch {epoch} Step {step}/{total} loss={loss:.4f} lr={lr:.3e}",
    "step {step}: throughput {tps} tokens/s, mem allocated {mem:.2f} GiB, reserved {res:.2f} GiB, "
    "data wait {wait:.1f} ms, fwd {fwd:.1f} ms, bwd {bwd:.1f} ms, optim {opt:.1f} ms",
    "eval step {step}: val_loss={loss:.4f} ppl={ppl:.2f} acc={acc:.4f}",
    "Checkpoint saved to /scratch/run42/ckpt/checkpoint_epoch_{epoch}_step_{step}.pt ({mem:.2f} GiB in {wait:.1f} s)",
)


def message_pool(files: int, size: int = 4096) -> List[List[Tuple[str, str]]]:
    """Per file, `size` (level, message) pairs of a training log, made once so that writing is cheap."""
    import random

    rnd = random.Random(42)
    pools = []
    for index in range(files):
        pool = []
        for n in range(size):
            kind = rnd.random()
            step = rnd.randint(1, 5000000)
            if kind < 0.04:  # NCCL's own prefix, not the seed's format (the slower parse): level None
                pool.append(
                    (
                        "",
                        "gpu-b%02d:%d:%d [%d] NCCL INFO Channel %02d/32 : %d[%d] -> %d[%d] via P2P/IPC/read"
                        % (
                            index // 8 + 1,
                            4100 + index,
                            4200 + index,
                            index % 8,
                            n % 32,
                            index,
                            index % 8,
                            (index + 1) % files,
                            (index + 1) % 8,
                        ),
                    )
                )
                continue
            level = "WARNING" if kind > 0.995 else "INFO"
            template = MESSAGES[
                0 if kind < 0.7 else 1 if kind < 0.85 else 2 if kind < 0.97 else 3 if kind < 0.995 else 4
            ]
            pool.append(
                (
                    level,
                    template.format(
                        epoch=step // 100000,
                        step=step,
                        total=5000000,
                        loss=3.0 / (1 + step / 1e6),
                        lr=3e-4,
                        grad=rnd.random() * 2,
                        tps=rnd.randint(100000, 500000),
                        mem=rnd.random() * 80,
                        res=rnd.random() * 90,
                        wait=rnd.random() * 20,
                        fwd=rnd.random() * 90,
                        bwd=rnd.random() * 180,
                        opt=rnd.random() * 20,
                        ppl=rnd.random() * 30,
                        acc=rnd.random(),
                    ),
                )
            )
        pools.append(pool)
    return pools


def run_writer(args: argparse.Namespace) -> None:
    """Append lines to every file at the total rate until `seconds` have passed; print the totals."""
    paths = file_names(args.dir, args.files)
    fds = [os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) for path in paths]
    pools = message_pool(args.files)
    per_file = args.rate / args.files
    total_lines = int(args.rate * args.seconds)
    due_total = [total_lines // args.files] * args.files
    for n in range(total_lines - sum(due_total)):
        due_total[n] += 1
    written = [0] * args.files
    stamp_second, stamp = -1, ""
    tick = args.tick_ms / 1000.0
    time_ns = time.time_ns
    slowest_write, slow_writes = 0.0, 0  # write() itself can block (dirty-page throttling): not the follower's delay
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        now_s = time.time()
        second = int(now_s)
        if second != stamp_second:
            stamp_second, stamp = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        asctime = "%s,%03d" % (stamp, int((now_s - second) * 1000))
        done = True
        for index in range(args.files):
            due = min(due_total[index], int(per_file * elapsed))
            if written[index] < due_total[index]:
                done = False
            if due <= written[index]:
                continue
            pool = pools[index]
            parts = []
            for seq in range(written[index] + 1, due + 1):
                level, message = pool[seq & 4095]
                if level:
                    parts.append("%s - %s - %s #%d @%d\n" % (asctime, level, message, seq, time_ns()))
                else:
                    parts.append("%s #%d @%d\n" % (message, seq, time_ns()))
            data = "".join(parts).encode()
            before = time.monotonic()
            os.write(fds[index], data)
            took = time.monotonic() - before
            if took > slowest_write:
                slowest_write = took
            if took > 0.05:
                slow_writes += 1
            written[index] = due
        if done:
            break
        time.sleep(tick)
    for fd in fds:
        os.close(fd)
    print(
        json.dumps(
            {
                "written": written,
                "seconds": time.monotonic() - start,
                "slowest_write_ms": slowest_write * 1000,
                "writes_over_50ms": slow_writes,
            }
        ),
        flush=True,
    )


# --- the follower (the console's code path, in its own process) ----------------------------------------


class Checker:
    """Every line once, in order per file; latency from the write to the delivery."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.last: Dict[str, int] = {}
        self.count: Dict[str, int] = {}
        self.delivered = 0
        self.duplicates = self.gaps = self.unparsed = self.parse_mismatch = 0
        self.hist = [0] * HIST_BUCKETS
        self.max_ns = 0
        self.batches = 0
        self.done = asyncio.Event()
        self.trace: Optional[list] = [] if os.environ.get("LOGBENCH_TRACE") else None  # experiments only

    def on_lines(self, lines) -> None:
        """The consumer: parse each line's sequence number and write time; count and bucket them."""
        from opsconsole.logs.names import parse_line

        now = time.time_ns()
        self.batches += 1
        hist, last, count = self.hist, self.last, self.count
        top = HIST_BUCKETS - 1
        slowest = self.max_ns
        source = None
        key, previous, seen = "", 0, 0
        for line in lines:
            if line.source is not source:  # a batch holds each file's lines together
                if source is not None:
                    last[key], count[key] = previous, count.get(key, 0) + seen
                source = line.source
                key = source.path
                previous, seen = last.get(key, 0), 0
            text = line.text
            at = text.rfind(" @")
            mark = text.rfind(" #", 0, at)
            try:
                seq, written = int(text[mark + 2 : at]), int(text[at + 2 :])
            except ValueError:
                self.unparsed += 1
                continue
            if mark < 0:
                self.unparsed += 1
                continue
            if seq != previous + 1:
                if seq <= previous:
                    self.duplicates += 1
                else:
                    self.gaps += seq - previous - 1
            previous = seq
            seen += 1
            latency = now - written
            if latency > slowest:
                slowest = latency
            bucket = latency // HIST_STEP_NS
            hist[top if bucket > top else 0 if bucket < 0 else bucket] += 1
        if source is not None:
            last[key], count[key] = previous, count.get(key, 0) + seen
        self.max_ns = slowest
        if lines and self.batches % 16 == 0:  # the fast parse gives what parse_line gives
            line = lines[0]
            when, level, _ = parse_line(line.text)
            if (when, level) != (line.time, line.level):
                self.parse_mismatch += 1
        self.delivered += len(lines)
        if self.trace is not None:
            self.trace.append(("took", now / 1e9, time.time(), len(lines), time.process_time()))
        if self.delivered >= self.expect:
            self.done.set()

    def percentile(self, fraction: float) -> float:
        """Milliseconds below which `fraction` of the latencies lie (bucket upper bound)."""
        total = sum(self.hist)
        if not total:
            return float("nan")
        wanted, running = fraction * total, 0
        for bucket, n in enumerate(self.hist):
            running += n
            if running >= wanted:
                return (bucket + 1) * HIST_STEP_NS / 1e6
        return float("nan")


def trace_passes(hub, checker) -> None:
    from opsconsole.logs import follow as follow_module
    from opsconsole.logs import hub as hub_module

    original_pass = follow_module.LocalFollower._poll_pass
    original_make = hub_module.make_lines

    def timed_pass(self):
        began = time.perf_counter()
        result = original_pass(self)
        checker.trace.append(("pass", began, time.perf_counter(), result[0], time.process_time()))
        return result

    def timed_make(source, raws):
        began = time.perf_counter()
        lines = original_make(source, raws)
        checker.trace.append(("make", began, time.perf_counter(), len(lines), 0))
        return lines

    follow_module.LocalFollower._poll_pass = timed_pass
    hub_module.make_lines = timed_make


def consumer_cost(args: argparse.Namespace) -> float:
    """Microseconds per line the checking consumer itself costs (part of the follower's CPU figure)."""
    from opsconsole.logs.hub import make_lines
    from opsconsole.logs.index import read_last_lines
    from opsconsole.logs.names import label_source

    lines = []
    for path in file_names(args.dir, args.files):
        lines.extend(
            make_lines(label_source("local", path), [(o, 0, raw, cut) for o, raw, cut in read_last_lines(path, 5000)])
        )
    if not lines:
        return 0.0
    scratch = Checker(len(lines) + 1)
    began = time.process_time()
    scratch.on_lines(lines)
    return (time.process_time() - began) * 1e6 / len(lines)


async def follow(args: argparse.Namespace) -> None:
    from opsconsole.config import Config, LogsConfig
    from opsconsole.logs.hub import LogHub

    checker = Checker(args.expect)
    config = Config(logs=LogsConfig(paths=(os.path.join(args.dir, "*.log"),)))
    hub = LogHub(config, use_inotify=False if args.polling else None)
    if checker.trace is not None:  # experiments only: where each pass spends its time
        trace_passes(hub, checker)
    await hub.start(checker.on_lines)
    print(json.dumps({"ready": hub._local.mode if hub._local else None}), flush=True)
    loop = asyncio.get_running_loop()
    stop = loop.run_in_executor(None, sys.stdin.readline)  # "stop" from the main process
    waiter = asyncio.ensure_future(checker.done.wait())
    await asyncio.wait([stop, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    problems = hub.problems()
    if checker.trace is not None:
        with open(os.environ["LOGBENCH_TRACE"], "w") as out:
            json.dump(checker.trace, out)
    print(
        json.dumps(
            {
                "delivered": checker.delivered,
                "per_file": checker.count,
                "duplicates": checker.duplicates,
                "gaps": checker.gaps,
                "unparsed": checker.unparsed,
                "parse_mismatch": checker.parse_mismatch,
                "batches": checker.batches,
                "p50_ms": checker.percentile(0.50),
                "p99_ms": checker.percentile(0.99),
                "p999_ms": checker.percentile(0.999),
                "max_ms": checker.max_ns / 1e6,
                "problems": problems,
            }
        ),
        flush=True,
    )
    await hub.stop()
    # Measured (CPU, RSS) up to here; on the next line from the main process: what the checking costs.
    await (stop if not stop.done() else loop.run_in_executor(None, sys.stdin.readline))
    print(json.dumps({"check_us": consumer_cost(args)}), flush=True)
    os._exit(0)  # the stdin reader thread would keep the process alive


# --- the main process: start, sample, report ------------------------------------------------------------


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (no psutil needed on a bare machine)."""
    with open("/proc/%d/stat" % pid) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_rss(pid: int) -> int:
    with open("/proc/%d/statm" % pid) as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


class Sampler:
    """RSS and CPU time of some processes every `interval` seconds, in a thread."""

    def __init__(self, processes: Dict[str, int], interval: float = 0.25) -> None:
        self.processes = dict(processes)
        self.rss: Dict[str, List[int]] = {name: [] for name in processes}
        self.cpu: Dict[str, float] = {}
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def cpu_seconds(self, name: str) -> float:
        try:
            self.cpu[name] = process_cpu_seconds(self.processes[name])
        except (OSError, ValueError, IndexError):
            pass  # it exited: its last figure stands
        return self.cpu.get(name, 0.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.processes.items():
                try:
                    self.rss[name].append(process_rss(pid))
                except (OSError, ValueError, IndexError):
                    pass
                self.cpu_seconds(name)
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def count_lines(stream, counter: List[int]) -> None:
    """Read tail's output and count its lines (the reader's CPU is this process's, not tail's)."""
    fd = stream.fileno()
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            return
        counter[0] += data.count(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=200_000.0, help="lines per second, all files together")
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--tick-ms", type=float, default=1.0, help="how often the writer appends what is due")
    parser.add_argument("--polling", action="store_true", help="follow by polling (as on NFS), not inotify")
    parser.add_argument("--no-tail", action="store_true", help="leave out the tail -F baseline")
    parser.add_argument("--role", choices=("main", "writer", "follower"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "writer":
        run_writer(args)
        return
    if args.role == "follower":
        if os.environ.get("LOGBENCH_SWITCH"):  # experiments only: the GIL's switch interval
            sys.setswitchinterval(float(os.environ["LOGBENCH_SWITCH"]))
        if os.environ.get("LOGBENCH_NOGC"):
            import gc

            gc.disable()
        asyncio.run(follow(args))
        return

    folder = tempfile.mkdtemp(prefix="opsconsole-logfollow-")
    me = os.path.abspath(__file__)
    common = ["--dir", folder, "--files", str(args.files), "--rate", str(args.rate), "--seconds", str(args.seconds)]
    expect = int(args.rate * args.seconds)
    children: List[subprocess.Popen] = []
    try:
        for path in file_names(folder, args.files):
            open(path, "wb").close()
        follower = subprocess.Popen(
            [sys.executable, me, "--role", "follower", "--expect", str(expect)]
            + common
            + (["--polling"] if args.polling else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(follower)
        ready = json.loads(follower.stdout.readline())
        tail: Optional[subprocess.Popen] = None
        tail_lines = [0]
        reader: Optional[threading.Thread] = None
        watched = {"follower": follower.pid}
        if not args.no_tail:
            tail = subprocess.Popen(
                ["tail", "-q", "-F", "-n", "0"] + file_names(folder, args.files),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            children.append(tail)
            reader = threading.Thread(target=count_lines, args=(tail.stdout, tail_lines), daemon=True)
            reader.start()
            watched["tail"] = tail.pid
        time.sleep(0.5)  # tail -F and inotify watches in place before the first line
        sampler = Sampler(watched)
        cpu0 = {name: sampler.cpu_seconds(name) for name in watched}
        machine0, me0 = busy_seconds(), process_cpu_seconds(os.getpid())
        sampler.start()
        began = time.monotonic()
        writer = subprocess.Popen(
            [sys.executable, me, "--role", "writer", "--tick-ms", str(args.tick_ms)] + common,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(writer)
        writer_cpu = 0.0
        while writer.poll() is None:
            try:
                writer_cpu = process_cpu_seconds(writer.pid)
            except (OSError, ValueError, IndexError):
                pass
            time.sleep(0.2)
        written = json.loads(writer.stdout.read())
        write_s = time.monotonic() - began
        result = json.loads(follower.stdout.readline() or "{}") if _wait_readable(follower, 60.0) else None
        follower_s = time.monotonic() - began
        if result is None:  # not everything arrived in time: ask it for what it has
            follower.stdin.write("stop\n")
            follower.stdin.flush()
            result = json.loads(follower.stdout.readline())
        if tail is not None:
            deadline = time.monotonic() + 20.0
            while tail_lines[0] < expect and time.monotonic() < deadline:
                time.sleep(0.05)
        cpu = {name: sampler.cpu_seconds(name) - cpu0[name] for name in watched}
        ours = sum(cpu.values()) + writer_cpu + process_cpu_seconds(os.getpid()) - me0
        cpu["others"] = max(0.0, busy_seconds() - machine0 - ours)
        cpu["wall"] = time.monotonic() - began
        sampler.stop()
        follower.stdin.write("cost\n")
        follower.stdin.flush()
        result.update(json.loads(follower.stdout.readline()))
        report(
            args, folder, ready, written, write_s, follower_s, writer_cpu, result, sampler, cpu, tail_lines[0], expect
        )
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
        shutil.rmtree(folder, ignore_errors=True)


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores), for what other processes took."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


def _wait_readable(process: subprocess.Popen, timeout: float) -> bool:
    import select

    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return bool(ready)


def report(
    args, folder, ready, written, write_s, follower_s, writer_cpu, result, sampler, cpu, tail_lines, expect
) -> None:
    mib = 1 << 20
    total_written = sum(written["written"])
    print(
        "machine: %d CPU cores; %d files, %.0f lines/s in total for %.0f s (writer: %.1f s, %.1f CPU s = %.0f%% of a core)"
        % (
            os.cpu_count() or 0,
            args.files,
            args.rate,
            args.seconds,
            write_s,
            writer_cpu,
            100 * writer_cpu / max(write_s, 1e-9),
        )
    )
    print(
        "  the writer's slowest write() took %.1f ms; %d writes took over 50 ms (a line's latency counts from "
        "before its write)" % (written["slowest_write_ms"], written["writes_over_50ms"])
    )
    print("follower: LogHub (%s), all lines in after %.1f s" % (ready.get("ready"), follower_s))
    print(
        "  lines written %d, delivered %d; repeated or out of order %d, missing %d, unparsed %d, "
        "parse mismatches %d; %d batches"
        % (
            total_written,
            result["delivered"],
            result["duplicates"],
            result["gaps"],
            result["unparsed"],
            result["parse_mismatch"],
            result["batches"],
        )
    )
    per_file_ok = all(
        result["per_file"].get(path, 0) == n for path, n in zip(file_names(folder, args.files), written["written"])
    )
    exact = (
        per_file_ok
        and result["delivered"] == total_written
        and result["duplicates"] == 0
        and result["gaps"] == 0
        and result["unparsed"] == 0
    )
    print("  every line once, in order per file: %s" % ("yes" if exact else "NO"))
    print(
        "  latency write -> delivery: p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms (target p99 <= 250 ms: %s)"
        % (
            result["p50_ms"],
            result["p99_ms"],
            result["p999_ms"],
            result["max_ms"],
            "met" if result["p99_ms"] <= 250 else "MISSED",
        )
    )
    rss = sampler.rss["follower"]
    if rss:
        print(
            "  follower RSS: start %.1f MiB, peak %.1f MiB, end %.1f MiB (growth %.1f MiB over %d samples)"
            % (rss[0] / mib, max(rss) / mib, rss[-1] / mib, (max(rss) - rss[0]) / mib, len(rss))
        )
        step = max(1, len(rss) // 10)
        print(
            "  follower RSS over time (MiB, every %.1f s): %s"
            % (step * sampler.interval, " ".join("%.0f" % (value / mib) for value in rss[::step]))
        )
    wall = max(follower_s, 1e-9)
    per_line = 1e6 * cpu["follower"] / max(total_written, 1)
    print(
        "  follower CPU: %.2f s (%.0f%% of a core over %.1f s; %.2f us per line, of which the checking consumer "
        "%.2f us: LogHub itself %.2f us)"
        % (
            cpu["follower"],
            100 * cpu["follower"] / wall,
            wall,
            per_line,
            result["check_us"],
            per_line - result["check_us"],
        )
    )
    if "tail" in cpu:
        trss = sampler.rss["tail"]
        print(
            "tail -F: %d lines counted of %d; CPU %.2f s; RSS peak %.1f MiB"
            % (tail_lines, expect, cpu["tail"], max(trss) / mib if trss else 0.0)
        )
        print("follower CPU / tail -F CPU = %.1f" % (cpu["follower"] / max(cpu["tail"], 1e-9)))
    print(
        "other processes on this machine meanwhile: %.1f CPU s (%.0f%% of one core on average, of %d cores)"
        % (cpu["others"], 100 * cpu["others"] / max(cpu["wall"], 1e-9), os.cpu_count() or 0)
    )
    if result.get("problems"):
        print("problems:", result["problems"])


if __name__ == "__main__":
    main()
