"""Signal one process on its node, only while it is still the process the console's plan saw.

A pid in a frame names a process for as long as that process lives; after it exits the kernel
may hand the pid to another. So right before the signal, on the node itself, this step reads
/proc/PID/stat and /proc/PID/status and compares what the plan saw:

- the start time: field 22 of stat (clock ticks after boot) as epoch seconds with the node's
  boot time, within proc_read.START_SLACK_S of the frame's (wider, up to MAX_SLACK_S, where
  the request says the frame knew it less exactly);
- the command name (comm, which the kernel cuts at 15 characters) and the real uid's user: by
  name, or by uid where the frame gave a number that is nobody's name (same_user).

Anything different refuses the signal ("pid 1234 is now a different process ...: not
signalled"). Where the interpreter and kernel have pidfds (Python 3.9+, Linux 5.3+) a pidfd is
opened before the check and the signal goes through it: a process that exits after the check
takes its pidfd with it, and the signal fails (ESRCH) instead of reaching the pid's next owner.
Without pidfds it is check-then-kill, a window of microseconds instead of the seconds between
a frame and a confirmation.

Run in the console's process for its own machine, and as `python3 -I - REQUEST` with a small
bundle on stdin (nodes/bundle.py: helper_bundle) on a remote node.
Request (JSON): {"pid": P, "signal": "INT"|"TERM"|"KILL", "start_time": epoch s,
                 "slack": s (START_SLACK_S to MAX_SLACK_S), "name": comm or null, "user": name or null}
Answer (one JSON line): {"pid", "signal", "signalled", "via" ("pidfd"|"kill"|null),
                         "refused" (why, or null), "error" (why, or null), "seen" (what /proc said)}
Exit status: 0 signalled, 3 refused, 4 not signalled (gone or a zombie, not permitted), 2 a bad request.

Stdlib only, Python 3.6 syntax.
"""

import errno
import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional

from opsconsole.probe.proc_read import START_SLACK_S, STAT_LIMIT, boot_time, read_prefix, split_stat, start_time_of

SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
MAX_SLACK_S = 10.0  # the most a request may widen START_SLACK_S (a GPU row's start is known to a poll)
COMM_CHARS = 15  # TASK_COMM_LEN - 1: what /proc/PID/stat keeps of a command name
STATUS_LIMIT = 16384
EXIT_SIGNALLED = 0
EXIT_BAD_REQUEST = 2
EXIT_REFUSED = 3
EXIT_NOT_SIGNALLED = 4
EXITED_STATES = ("Z", "X")  # a zombie (exited, not yet reaped by its parent), dead


class PasswdUsers(object):
    """User names and uids as this node's passwd database has them (pwd: NSS, LDAP); tests give a table."""

    def name_of(self, uid: int) -> Optional[str]:
        """The name of `uid`, None when it has none."""
        try:
            import pwd

            return pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError, OverflowError):
            return None

    def uid_of(self, name: str) -> Optional[int]:
        """The uid of the user called `name`, None when there is none."""
        try:
            import pwd

            return pwd.getpwnam(name).pw_uid
        except (ImportError, KeyError, ValueError):  # ValueError: a NUL in the name
            return None


PASSWD = PasswdUsers()


def identity_of(pid: int, proc_root: str = "/proc", users: PasswdUsers = PASSWD) -> Dict[str, Any]:
    """What /proc says of `pid` now: start ticks and time, command name, real uid and user, state, parent.

    `user` is the uid's name, or the uid as a number where it has none (as the probe's frames say it).
    Raises OSError (ENOENT, ESRCH) when there is no such process.
    """
    base = "%s/%d" % (proc_root.rstrip("/"), pid)
    name, fields = split_stat(read_prefix(base + "/stat", STAT_LIMIT))
    ticks = int(fields[19])
    uid = None
    for line in read_prefix(base + "/status", STATUS_LIMIT).decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            break
    return {
        "start_ticks": ticks,
        "start_time": start_time_of(ticks, boot_time(proc_root)),
        "name": name,
        "uid": uid,
        "user": (users.name_of(uid) or str(uid)) if uid is not None else None,
        "state": fields[0].decode("ascii", "replace")[:1],
        "ppid": int(fields[1]),
    }


def same_command(name: str, comm: str) -> bool:
    """Whether a frame's command `name` is /proc's `comm`: the same, or comm is the kernel's 15-byte cut of it.

    Not any prefix either way: 'python' is not 'python3', and an empty comm (prctl can set one) no command.
    """
    return name == comm or (len(comm.encode("utf-8", "surrogateescape")) >= COMM_CHARS and name.startswith(comm))


def same_user(user: str, uid: Optional[int], users: PasswdUsers = PASSWD) -> bool:
    """Whether a frame's `user` is real uid `uid`: names compared with names, uids with uids.

    The probe writes a user's name, or the uid as a number where the uid has no name
    (probe/procs.py _user_name). So a number that is nobody's name stands for a uid; any other
    text, a user called "1001" included, is a name, and matches only the uid of that name:
    never another user whose uid is 1001.
    """
    if uid is None:
        return False
    if user and all(c in "0123456789" for c in user) and users.uid_of(user) is None:
        return uid == int(user)
    return users.name_of(uid) == user


def why_different(
    pid: int, expected: Dict[str, Any], seen: Dict[str, Any], users: PasswdUsers = PASSWD
) -> Optional[str]:
    """None when `seen` (identity_of) is the process `expected` describes, else the refusal line."""
    reasons = []
    start = expected.get("start_time")
    try:
        slack = min(max(float(expected.get("slack") or START_SLACK_S), START_SLACK_S), MAX_SLACK_S)
    except (TypeError, ValueError):
        slack = START_SLACK_S
    if start is None:
        reasons.append("no start time to compare")
    elif not abs(seen["start_time"] - float(start)) <= slack:  # NaN is no match either
        reasons.append(
            "started %.2f s %s the one the plan saw"
            % (
                abs(seen["start_time"] - float(start)),
                "after" if seen["start_time"] > float(start) else "before",
            )
        )
    name = expected.get("name")
    if name and not same_command(name, seen["name"]):
        reasons.append("command %r, not %r" % (seen["name"], name))
    user = expected.get("user")
    if user and not same_user(user, seen["uid"], users):
        reasons.append("user %r, not %r" % (seen["user"], user))
    if not reasons:
        return None
    return "pid %d is now a different process (%s): not signalled" % (pid, "; ".join(reasons))


def _open_pidfd(pid: int) -> Optional[int]:
    """A pidfd for `pid`, or None where this Python or kernel has none. OSError(ESRCH): no such process."""
    if not (hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise
        return None  # ENOSYS (a kernel before 5.3), EPERM (a seccomp filter): check then kill


def signal_checked(
    pid: int, signal_name: str, expected: Dict[str, Any], proc_root: str = "/proc", users: PasswdUsers = PASSWD
) -> Dict[str, Any]:
    """Send SIG`signal_name` to `pid` if it is still the process `expected` describes; the answer (see above)."""
    answer = {"pid": pid, "signal": signal_name, "signalled": False, "via": None, "refused": None, "error": None}
    answer["seen"] = None
    if signal_name not in SIGNALS:
        answer["error"] = "unknown signal %r" % (signal_name,)
        return answer
    if pid <= 1 or pid == os.getpid():
        answer["refused"] = "pid %d cannot be signalled" % pid
        return answer
    try:
        pidfd = _open_pidfd(pid)
    except OSError:
        answer["error"] = "pid %d has exited: not signalled" % pid
        return answer
    try:
        try:
            seen = identity_of(pid, proc_root, users)
        except (OSError, ValueError, IndexError):
            answer["error"] = "pid %d has exited: not signalled" % pid
            return answer
        answer["seen"] = seen
        why = why_different(pid, expected, seen, users)
        if why is not None:
            answer["refused"] = why
            return answer
        if seen["state"] in EXITED_STATES:
            # It exited after the frame (the question was open) and its parent has not waited for it: /proc
            # still names it, and a signal to it succeeds and does nothing.
            answer["error"] = "pid %d has exited (a zombie: its parent, pid %d, has not reaped it): not signalled" % (
                pid,
                seen["ppid"],
            )
            return answer
        try:
            if pidfd is not None:
                answer["via"] = "pidfd"
                signal.pidfd_send_signal(pidfd, SIGNALS[signal_name])
            else:
                answer["via"] = "kill"
                os.kill(pid, SIGNALS[signal_name])
        except ProcessLookupError:
            answer["error"] = "pid %d exited before the signal: not signalled" % pid
            return answer
        except PermissionError:
            answer["error"] = "not permitted to signal pid %d" % pid
            return answer
        answer["signalled"] = True
        return answer
    finally:
        if pidfd is not None:
            os.close(pidfd)


def exit_status_of(answer: Dict[str, Any]) -> int:
    if answer.get("signalled"):
        return EXIT_SIGNALLED
    return EXIT_REFUSED if answer.get("refused") else EXIT_NOT_SIGNALLED


def main(args: List[str]) -> int:
    try:
        request = json.loads(args[0])
        pid = request["pid"]
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise ValueError("pid")
        expected = {key: request.get(key) for key in ("start_time", "slack", "name", "user")}
        for key, types in (("start_time", (int, float)), ("slack", (int, float)), ("name", str), ("user", str)):
            value = expected[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
                raise TypeError("%s is a %s" % (key, type(value).__name__))
        signal_name = str(request["signal"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        sys.stdout.write(json.dumps({"error": "bad request: %s" % exc}) + "\n")
        return EXIT_BAD_REQUEST
    answer = signal_checked(pid, signal_name, expected)
    sys.stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return exit_status_of(answer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
