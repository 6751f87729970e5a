"""Step 3 of scripts/device-multi-gpu: a real hang of 2 ranks, triaged by the console as an operator would.

    python scripts/multi_gpu/hang.py --backend nccl|gloo --out DIR [--timeout-s S] [--python PY]

Starts scripts/multi_gpu/hang_job.py under torchrun (2 ranks; nccl: one GPU each) with the flight
recorder on (TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_FR_BUFFER_SIZE, dumps on timeout, the dump FIFO) and
a short process-group timeout. While it hangs: `opsconsole stacks --json` on both ranks, and with NCCL
`opsconsole fr --collect` (the console asks each live rank through its FIFO). Then `opsconsole fr` on
the ranks' own dumps, waits for the timeout to end the job, and `opsconsole fr` on the watchdog's dumps
if torch wrote any. DIR keeps everything (dumps, logs, each command's JSON) and summary.json, whose
"ok" says whether fr named rank 1 and collective 5 (all_reduce) and stacks named rank 1's line.
Exit 0 when ok, 1 when not. Signals only the torchrun session it started.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "hang_job.py")
SKIPPED_SEQ, SKIPPED_OP = 5, "all_reduce"
START_TIMEOUT_S = 180.0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hang_line():
    """The line of hang_job.py where rank 1 waits (marked '# HANG:')."""
    with open(JOB) as source:
        for number, line in enumerate(source, 1):
            if "# HANG:" in line:
                return number
    raise RuntimeError("no '# HANG:' line in %s" % JOB)


def children_with_rank(parent):
    """{rank: pid} of parent's child processes that have RANK in their environment."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open("/proc/%s/environ" % name, "rb") as environ:
                for item in environ.read().split(b"\0"):
                    if item.startswith(b"RANK="):
                        found[int(item[5:])] = int(name)
        except (OSError, ValueError, IndexError):
            continue
    return found


def console(python, args, out_path, timeout):
    """Run `python -m opsconsole ARGS`; stdout to out_path; (exit code, parsed JSON or None, stderr)."""
    started = time.time()
    try:
        done = subprocess.run(
            [python, "-m", "opsconsole"] + args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = 124, exc.stdout or b"", "timed out after %g s" % timeout
    with open(out_path, "wb") as out:
        out.write(stdout)
    with open(out_path + ".stderr", "w") as err:
        err.write(stderr)
    try:
        document = json.loads(stdout.decode(errors="replace"))
    except ValueError:
        document = None
    return code, document, stderr, time.time() - started


def fr_verdict(document):
    """What `opsconsole fr --json` said, and whether it named rank 1 and collective 5 (all_reduce)."""
    found = (document or {}).get("mismatch") or {}
    return {
        "summary": (document or {}).get("summary"),
        "kind": found.get("kind"),
        "seq": found.get("seq"),
        "op": found.get("op"),
        "culprit_ranks": found.get("culprit_ranks"),
        "ranks": [d.get("rank") for d in (document or {}).get("dumps", [])],
        "named": found.get("culprit_ranks") == [1]
        and found.get("seq") == SKIPPED_SEQ
        and found.get("op") == SKIPPED_OP,
    }


def stacks_verdict(document, pids, line):
    """Whether `opsconsole stacks --json` made rank 1 the odd one, at hang_job.py's HANG line."""
    ranks = {entry.get("pid"): entry for entry in (document or {}).get("ranks", [])}
    rank1 = ranks.get(pids.get(1), {})
    top = (rank1.get("frames") or [{}])[0]
    rank0_functions = [frame.get("function") for frame in (ranks.get(pids.get(0), {}).get("frames") or [])]
    return {
        "odd": (document or {}).get("odd"),
        "rank1_top": top,
        "rank0_functions": rank0_functions[:6],
        "expected_line": "hang_job.py:%d" % line,
        "errors": (document or {}).get("errors"),
        "named": (document or {}).get("odd") == [1]
        and str(top.get("file", "")).endswith("hang_job.py")
        and top.get("line") == line,
    }


def end_session(job):
    """SIGTERM then SIGKILL to the torchrun session this script started (it and its ranks)."""
    for signum, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(job.pid, signum)
        except ProcessLookupError:
            return
        try:
            job.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--out", required=True, help="directory for dumps, logs and results")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=45.0,
        help="the process group's timeout (45: stacks and the FIFO collection come first)",
    )
    parser.add_argument("--python", default=sys.executable, help="python for torchrun and the console")
    args = parser.parse_args(argv)
    if os.sep in args.python:  # the job runs in the output directory
        args.python = os.path.abspath(args.python)
    out = os.path.abspath(args.out)
    for sub in ("own", "watchdog", "collected"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    pipes = os.path.join(out, "pipes")
    os.makedirs(pipes, exist_ok=True)
    config = os.path.join(out, "local.toml")
    with open(config, "w") as conf:
        conf.write(
            '[[nodes]]\nname = "local"\nlocal = true\n\n[actions]\naudit_log = "%s"\n' % os.path.join(out, "audit.log")
        )
    env = dict(os.environ)
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            # The flight recorder under the names torch 2.11 reads and the older ones the issue names.
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": os.path.join(out, "watchdog", "nccl_trace_rank_"),
            "TORCH_FR_DUMP_TEMP_FILE": os.path.join(out, "watchdog", "nccl_trace_rank_"),
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(pipes, "pipe_"),
            # NVLink multicast stays off (the lender's rule: it can take a shared host's GPUs down).
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1",
        }
    )
    line = hang_line()
    summary = {"backend": args.backend, "timeout_s": args.timeout_s, "hang_line": line}
    log = open(os.path.join(out, "torchrun.log"), "wb")
    started = time.time()
    job = subprocess.Popen(
        [
            args.python,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "--tee",
            "3",
            JOB,
            args.backend,
            out,
            str(args.timeout_s),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        cwd=out,
    )
    try:
        pids = {}
        while time.time() - started < START_TIMEOUT_S:
            pids = children_with_rank(job.pid)
            if all(os.path.exists(os.path.join(out, "ready_%d" % r)) for r in (0, 1)) and len(pids) == 2:
                break
            if job.poll() is not None:
                break
            time.sleep(0.2)
        hung_at = time.time()
        summary["pids"] = pids
        summary["start_to_hang_s"] = round(hung_at - started, 1)
        if len(pids) != 2 or job.poll() is not None:
            summary["ok"] = False
            summary["problem"] = "the job did not reach its hang (see torchrun.log)"
            return summary
        print("hang set after %.1f s: rank 0 pid %d, rank 1 pid %d" % (hung_at - started, pids[0], pids[1]), flush=True)
        pid_args = ["--pid", str(pids[0]), "--pid", str(pids[1])]
        for attempt in range(5):  # rank 0 may still be on its way into the barrier
            code, document, stderr, took = console(
                args.python, ["stacks", "--json", "--config", config] + pid_args, os.path.join(out, "stacks.json"), 120
            )
            summary["stacks"] = dict(
                stacks_verdict(document, pids, line), exit=code, seconds=round(took, 1), attempt=attempt + 1
            )
            if summary["stacks"]["named"] or code != 0:
                break
            time.sleep(1)
        print(
            "stacks: exit %d, odd %s, rank 1 at %s" % (code, summary["stacks"]["odd"], summary["stacks"]["rank1_top"]),
            flush=True,
        )
        if args.backend == "nccl":  # gloo has no dump FIFO
            code, document, stderr, took = console(
                args.python,
                ["fr", "--collect", os.path.join(out, "collected"), "--config", config, "--json", "--wait", "20"],
                os.path.join(out, "fr_collected.json"),
                120,
            )
            summary["fr_collected"] = dict(fr_verdict(document), exit=code, seconds=round(took, 1))
            print("fr --collect: exit %d, %s" % (code, summary["fr_collected"]["summary"]), flush=True)
        code, document, stderr, took = console(
            args.python, ["fr", os.path.join(out, "own"), "--json"], os.path.join(out, "fr_own.json"), 120
        )
        summary["fr_own"] = dict(fr_verdict(document), exit=code)
        print("fr (the ranks' own dumps): exit %d, %s" % (code, summary["fr_own"]["summary"]), flush=True)
        try:  # the timeout ends the job: the watchdog (NCCL) or the barrier's error (gloo)
            summary["job_exit"] = job.wait(timeout=args.timeout_s + 90)
            summary["hang_to_end_s"] = round(time.time() - hung_at, 1)
        except subprocess.TimeoutExpired:
            summary["job_exit"] = None
            summary["problem"] = "the job outlived its timeout by 90 s: ended by this script"
        # torch writes to its temp file when asked through the FIFO and again on timeout: which came later
        written = {
            name: round(os.path.getmtime(os.path.join(out, "watchdog", name)) - hung_at, 1)
            for name in os.listdir(os.path.join(out, "watchdog"))
            if name.startswith("nccl_trace_rank_")
        }
        summary["temp_file_dumps_written_s_after_hang"] = written
        if written:
            code, document, stderr, took = console(
                args.python, ["fr", os.path.join(out, "watchdog"), "--json"], os.path.join(out, "fr_watchdog.json"), 120
            )
            summary["fr_watchdog"] = dict(fr_verdict(document), exit=code)
            print(
                "fr (torch's temp-file dumps: the FIFO's, rewritten on timeout if the watchdog dumped): exit %d, %s"
                % (code, summary["fr_watchdog"]["summary"]),
                flush=True,
            )
        named = [summary["stacks"]["named"], summary["fr_own"]["named"]]
        if "fr_collected" in summary:
            named.append(summary["fr_collected"]["named"])
        summary["ok"] = all(named)
        return summary
    finally:
        end_session(job)
        log.close()
        for name in os.listdir(pipes):  # FIFOs: nothing to keep
            os.unlink(os.path.join(pipes, name))
        os.rmdir(pipes)
        summary["seconds"] = round(time.time() - started, 1)
        with open(os.path.join(out, "summary.json"), "w") as handle:
            json.dump(summary, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    result = main()
    print(
        "step 3 (%s): %s"
        % (
            result["backend"],
            "rank 1 and collective %d named by fr and stacks" % SKIPPED_SEQ
            if result.get("ok")
            else "NOT named: %s" % result.get("problem", "see summary.json"),
        )
    )
    sys.exit(0 if result.get("ok") else 1)
