"""Deleting checkpoint units pinned to a directory descriptor, on the machine that holds them.

The console ships this file over a node's SSH connection as source (`python3 -I -u -c SOURCE`,
the way probe/filetail.py travels) and imports it for its own machine, so local and remote
deletions keep the same guarantees, in the same code:

- the directory is opened once, O_DIRECTORY|O_NOFOLLOW, and must be the one the plan recorded
  (st_dev, st_ino): a root swapped for a symlink or for another directory is refused whole;
- every name is reached relative to that descriptor, each step O_NOFOLLOW: a symlink inside a
  unit is unlinked, never followed;
- a unit (one checkpoint: its files and directories, `members`) is checked whole before any of
  it goes: each file's device, inode, size and mtime as the console's listing saw them when it
  judged the unit (the console puts those in the tree it sends: checkpoints/cleanup.py), each
  directory's exact entries as pinned; a unit that changed, or that a process holds open or has
  mapped (/proc/PID/fd, /proc/PID/maps: `torch.load(mmap=True)` maps the file), is kept;
- the kept units that justify the deletions (the newest good ones, the recorded best/latest)
  come with the open request too, marked "kept": while one of them is not as judged (changed,
  gone) nothing is deleted;
- a unit goes only when this user may write every directory of it and the one holding it
  (faccessat), and no entry of it sits in a sticky directory (mode +t) where neither the entry
  nor the directory is this user's: one it could delete only in part is kept whole;
- only recorded entries are deleted: a file that appeared inside a directory since the check
  makes its rmdir fail, and the unit is reported as partly deleted, with what went: each entry
  removed (a directory's with a trailing /) and "N of M files went" in the reason. What the
  pre-checks cannot see (an immutable file, EIO) ends the same way.
Nothing here opens a file that is not a directory: FIFOs and devices are lstat'ed, never read.

Protocol (remote): one JSON request per line on stdin, one JSON answer per line on stdout.
    {"op": "pin", "root": R, "units": [[member, ...], ...]}
        -> {"root_id": [dev, ino], "real_root": P, "units": [{"tree": [...]} or {"problem": why}]}
        or {"problem": why} when the directory itself cannot be pinned
    {"op": "in_use", "root": R}  -> {"paths": [...], "denied": n, "uid": u}
    {"op": "open", "root": R, "root_id": [dev, ino], "units": [{"members": [...], "tree": [...]}, ...]}
        (kept units last, each with "kept": what it is, in words; `unit` indexes count the others)
        -> {"ok": true} or {"ok": false, "why": why}
    {"op": "check", "unit": i}   -> {"unit": i, "why": None or why}
    {"op": "delete", "unit": i}  -> {"unit": i, "went": [...], "why": None or why}
        went: the unit's members when it went whole, else each entry removed before it failed
A tree is a list of [relative path, kind, dev, ino, size, mtime_ns] (kind: d f l o; a file's
with its ctime_ns after, -1 where the console does not know it), the member first. Names travel as str with surrogateescape (json escapes them: ASCII on the wire).
Stdlib only, Python 3.6+ (probe/ rules).
"""

import errno
import json
import os
import stat
import sys

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
MAX_TREE_ENTRIES = 100000  # per unit: past this a unit is not pinned (kept)
MAX_DEPTH = 64
MAX_MEMBER_CHARS = 4096
MAX_REQUEST_BYTES = 512 * 1024 * 1024  # one request line (an open request carries every tree)
MAX_MAPS_BYTES = 64 * 1024 * 1024  # of one process's /proc/PID/maps
MAX_IN_USE_IDS = 2000000
MAX_IN_USE_PATHS = 20000
MAX_ROOT_WALK = 200000  # entries looked at to name the in-use files found by identity
SHOWN_NAMES = 8
NAMED_UNREADABLE = 3  # processes an incomplete open-file check names
PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread, which holds no files
MAX_MOUNTINFO_BYTES = 4 * 1024 * 1024  # /proc/self/mountinfo read to find /proc's hidepid=
MAX_THREADS_LOOKED_AT = 4096  # threads of a process whose main thread exited, looked at for a live one


class UnitProblem(Exception):
    """Why a unit (or one of its members) is not deleted: one line."""


def kind_of(mode):
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISLNK(mode):
        return "l"
    return "o"  # FIFO, socket, device: unlinked like a file, never opened


def record_of(rel, st):
    """[rel, kind, dev, ino, size, mtime_ns] (a file's with its ctime_ns after): what must still hold when it goes.

    The ctime catches a file rewritten in place with its size kept and its mtime set back.
    """
    kind = kind_of(st.st_mode)
    if kind == "f":
        return [rel, kind, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    # A directory's own mtime moves with any create/unlink inside: its entries are compared instead.
    return [rel, kind, st.st_dev, st.st_ino, 0, 0]


def why_differs(recorded, now):
    """None when `now` (a record) is the entry the plan recorded, else why not.

    A file's recorded identity is the one its unit was judged by (see the module docstring).
    """
    rel = recorded[0]
    since = "since it was judged" if recorded[1] == "f" else "since the plan"
    if now[1] != recorded[1]:
        if now[1] == "l":
            return "%s is a symlink now: never followed" % rel
        return "%s changed kind %s" % (rel, since)
    if now[2:4] != recorded[2:4]:
        return "%s was replaced %s (another file has its name)" % (rel, since)
    if now[4:6] != recorded[4:6]:
        return "%s changed %s (size or mtime)" % (rel, since)
    if len(recorded) > 6 and len(now) > 6 and recorded[6] != -1 and now[6] != recorded[6]:
        return "%s changed %s (rewritten in place: its ctime moved)" % (rel, since)
    return None


def split_member(rel):
    """The components of a unit member (a relative path inside the root); UnitProblem when it is not one."""
    if not isinstance(rel, str) or not rel or len(rel) > MAX_MEMBER_CHARS or "\0" in rel:
        raise UnitProblem(
            "not a usable relative path: %r" % (rel if isinstance(rel, str) else type(rel).__name__)[:200]
        )
    parts = rel.split("/")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise UnitProblem("%r is not a plain path inside the directory" % rel[:200])
    return parts


def open_error(what, exc, name=None, dir_fd=None):
    """One line for a failed O_NOFOLLOW|O_DIRECTORY open (Linux says ENOTDIR for a symlink there)."""
    if exc.errno == errno.ENOTDIR and name is not None:
        try:
            if stat.S_ISLNK(lstat_at(name, dir_fd).st_mode):
                return "%s is a symlink: never followed" % what
        except OSError:
            pass
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "%s is a symlink: never followed" % what
    if exc.errno == errno.ENOENT:
        return "%s is gone" % what
    if exc.errno == errno.ENOTDIR:
        return "%s is not a directory" % what
    return "%s: %s" % (what, exc.strerror or exc)


def open_root(root):
    """The root's descriptor (O_NOFOLLOW: a symlink at the root is refused); UnitProblem when it cannot be."""
    try:
        return os.open(root, DIR_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            try:
                if stat.S_ISLNK(os.lstat(root).st_mode):
                    raise UnitProblem("%s is a symlink: never followed (name the directory itself)" % root)
            except OSError:
                pass
        raise UnitProblem(open_error(root, exc))


def open_parent(root_fd, parts):
    """A descriptor (the caller closes it) of the directory holding parts[-1], every step O_NOFOLLOW."""
    fd = os.dup(root_fd)
    for index, part in enumerate(parts[:-1]):
        try:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            why = open_error("/".join(parts[: index + 1]), exc, part, fd)
            os.close(fd)
            raise UnitProblem(why)
        os.close(fd)
        fd = child
    return fd


def lstat_at(name, dir_fd):
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def tree_of(root_fd, rel):
    """The records of one member and, for a directory, of everything below it (never following links)."""
    parts = split_member(rel)
    parent = open_parent(root_fd, parts)
    try:
        try:
            st = lstat_at(parts[-1], parent)
        except FileNotFoundError:
            raise UnitProblem("%s is gone" % rel)
        except OSError as exc:
            raise UnitProblem("%s: %s" % (rel, exc.strerror or exc))
        records = [record_of(rel, st)]
        if stat.S_ISDIR(st.st_mode):
            _walk_dir(parent, parts[-1], rel, st, records, 0)
        return records
    finally:
        os.close(parent)


def open_same_dir(parent_fd, name, rel, st, depth, when):
    """A descriptor of directory `name` under `parent_fd`, refused unless it is still the one `st` describes."""
    if depth >= MAX_DEPTH:
        raise UnitProblem("%s: nested deeper than %d directories" % (rel, MAX_DEPTH))
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise UnitProblem(open_error(rel, exc, name, parent_fd))
    own = os.fstat(fd)
    if (own.st_dev, own.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnitProblem("%s was replaced %s" % (rel, when))
    return fd


def _walk_dir(parent_fd, name, rel, st, records, depth):
    fd = open_same_dir(parent_fd, name, rel, st, depth, "while it was read")
    try:
        try:
            names = sorted(os.listdir(fd))
        except OSError as exc:
            raise UnitProblem("cannot list %s: %s" % (rel, exc.strerror or exc))
        for child in names:
            if len(records) >= MAX_TREE_ENTRIES:
                raise UnitProblem("more than %d files and directories: not pinned" % MAX_TREE_ENTRIES)
            child_rel = rel + "/" + child
            try:
                child_st = lstat_at(child, fd)
            except FileNotFoundError:
                continue  # gone between listdir and lstat: not part of the unit any more
            except OSError as exc:
                raise UnitProblem("%s: %s" % (child_rel, exc.strerror or exc))
            records.append(record_of(child_rel, child_st))
            if stat.S_ISDIR(child_st.st_mode):
                _walk_dir(fd, child, child_rel, child_st, records, depth + 1)
    finally:
        os.close(fd)


def unit_tree(root_fd, members):
    """The records of a whole unit; overlapping or repeated members are a UnitProblem."""
    seen = set()
    for rel in members:
        split_member(rel)
        if rel in seen or any(rel.startswith(other + "/") or other.startswith(rel + "/") for other in seen):
            raise UnitProblem("member %s overlaps another member" % rel)
        seen.add(rel)
    records = []
    for rel in members:
        records.extend(tree_of(root_fd, rel))
        if len(records) > MAX_TREE_ENTRIES:
            raise UnitProblem("more than %d files and directories: not pinned" % MAX_TREE_ENTRIES)
    return records


def root_identity(fd):
    st = os.fstat(fd)
    return [st.st_dev, st.st_ino]


def real_path_of(fd, fallback):
    """The path the kernel gives the pinned directory (what /proc/PID/fd and maps show under it)."""
    try:
        path = os.readlink("/proc/self/fd/%d" % fd)
        if path.startswith("/") and not path.endswith(" (deleted)"):
            return path
    except OSError:
        pass
    return os.path.realpath(fallback)


# --- in use: open descriptors and memory maps of every process we may look at ---------------------


class InUse(object):
    """Files some process holds open or mapped: by (dev, ino), and by path under one directory."""

    def __init__(self):
        self.ids = set()
        self.paths = set()  # under the prefix given to scan_in_use
        self.unreadable = {}  # pid -> (real uid, comm): alive, no kernel thread, its fds or maps not readable
        self.cannot_list = False  # /proc itself could not be listed: nothing was looked at
        self.hidden_by = None  # /proc's hidepid= value when it hides other users' processes from us
        self.processes = 0
        self.truncated = False

    @property
    def denied(self):
        return len(self.unreadable) + (1 if self.cannot_list else 0)

    def holds(self, record, real_root):
        if (record[2], record[3]) in self.ids:
            return True
        return (real_root.rstrip("/") + "/" + record[0]) in self.paths

    def note(self, owner_uid=None):
        """None, or which processes the check could not look at and what that means for a deletion.

        The directory owner's processes are named first (a job writing checkpoints there is most
        likely its owner's), then the newest."""
        notes = []
        if self.cannot_list:
            notes.append("open-file check could not list /proc: a checkpoint any process holds open could be deleted")
        if self.hidden_by is not None:
            notes.append(
                "open-file check cannot see other users' processes (/proc is mounted hidepid=%s): a checkpoint"
                " one of them holds open or mapped would not be seen, and could be deleted" % self.hidden_by
            )
        if self.unreadable:
            ranked = sorted(self.unreadable.items(), key=lambda item: (item[1][0] != owner_uid, -int(item[0])))
            named = ", ".join("pid %s %s" % (pid, comm) for pid, (_, comm) in ranked[:NAMED_UNREADABLE])
            if len(ranked) > NAMED_UNREADABLE:
                named += " and %d more" % (len(ranked) - NAMED_UNREADABLE)
            count = len(ranked)
            text = "open-file check could not read %d process%s (%s)" % (count, "" if count == 1 else "es", named)
            text += ": a checkpoint %s open or mapped would not be seen, and could be deleted" % (
                "it holds" if count == 1 else "they hold"
            )
            if os.geteuid() != 0:
                text += " (run as root to see other users' processes)"
            notes.append(text)
        if self.truncated:
            notes.append("open-file check stopped at its limits: it may be incomplete")
        return "; ".join(notes) or None


def _stat_of(where):
    """(state, flags, start time, comm) from WHERE/stat; None when it cannot be read."""
    try:
        with open(where + "/stat", "rb") as handle:
            data = handle.read(4096)
    except OSError:
        return None
    head, _, tail = data.rpartition(b")")
    fields = tail.split()
    try:
        return fields[0], int(fields[6]), int(fields[19]), head.partition(b"(")[2].decode("utf-8", "replace")
    except (IndexError, ValueError):
        return None


def _live_thread_of(pid):
    """/proc/PID/task/TID of a thread of `pid` that has not exited, None when none has."""
    try:
        tids = os.listdir("/proc/%s/task" % pid)
    except OSError:
        return None
    for tid in tids[:MAX_THREADS_LOOKED_AT]:
        where = "/proc/%s/task/%s" % (pid, tid)
        seen = _stat_of(where) if tid != pid else None
        if seen is not None and seen[0] not in (b"Z", b"X"):
            return where
    return None


def _process_of(pid):
    """(start time, comm, kernel thread, where its files show) of a live process; None when it is gone
    or a zombie. `where` is /proc/PID, or /proc/PID/task/TID of a live thread when the main thread
    alone has exited: its /proc/PID/stat says Z and its fd and maps are empty, yet the threads left
    hold the process's files."""
    seen = _stat_of("/proc/%s" % pid)
    if seen is None:
        return None
    state, flags, started, comm = seen
    where = "/proc/%s" % pid
    if state in (b"Z", b"X"):
        where = _live_thread_of(pid)
        if where is None:
            return None  # a zombie holds no files any more
    return started, comm, bool(flags & PF_KTHREAD), where


def _real_uid(pid):
    """The real uid in /proc/PID/status (/proc/PID itself is root's when the process is not dumpable); None if unknown."""
    try:
        with open("/proc/%s/status" % pid, "rb") as handle:
            for line in handle.read(65536).splitlines():
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def _under(path, prefix):
    return bool(prefix) and (path == prefix or path.startswith(prefix.rstrip("/") + "/"))


def _add_path(found, path, prefix):
    if path.endswith(" (deleted)") or not _under(path, prefix):
        return
    if len(found.paths) >= MAX_IN_USE_PATHS:
        found.truncated = True
        return
    found.paths.add(path)


def _add_id(found, dev, ino):
    if len(found.ids) >= MAX_IN_USE_IDS:
        found.truncated = True
        return
    found.ids.add((dev, ino))


def _read_fds(found, where, prefix):
    """Open files of the process at `where` (/proc/PID); False when the kernel refused to show them
    (another user's, or not ptrace-readable)."""
    fd_dir = where + "/fd"
    try:
        names = os.listdir(fd_dir)
    except PermissionError:
        return False
    except OSError:
        return True  # the process ended
    for name in names:
        link = fd_dir + "/" + name
        try:
            target = os.readlink(link)
        except PermissionError:
            return False  # listing is allowed where reading the links is not (a process root may not ptrace)
        except OSError:
            continue  # closed since the listing
        if not target.startswith("/"):
            continue  # socket:[..], pipe:[..], anon_inode:..
        try:
            st = os.stat(link)  # the magic link leads to the open file itself, whatever its name now
        except OSError:
            st = None
        if st is not None:
            _add_id(found, st.st_dev, st.st_ino)
        _add_path(found, target, prefix)
    return True


def _read_maps(found, where, prefix):
    """File-backed mappings (`addr perms offset MAJ:MIN inode path`) of the process at `where`;
    False when the kernel refused them."""
    try:
        handle = open(where + "/maps", "rb")
    except PermissionError:
        return False
    except OSError:
        return True  # the process ended
    with handle:
        read = 0
        last = None
        while True:
            try:
                line = handle.readline(65536)
            except PermissionError:
                return False  # EACCES on read: the ptrace check
            except OSError:
                return True  # the process ended
            if not line:
                return True
            read += len(line)
            if read > MAX_MAPS_BYTES:
                found.truncated = True
                return True
            fields = line.split(None, 5)
            if len(fields) < 6 or not fields[5].startswith(b"/"):
                continue
            key = (fields[3], fields[4])
            if key == last:
                continue  # a file's segments come one after another
            last = key
            try:
                major, minor = fields[3].split(b":")
                inode = int(fields[4])
                if inode:
                    _add_id(found, os.makedev(int(major, 16), int(minor, 16)), inode)
            except ValueError:
                pass
            _add_path(found, fields[5].rstrip(b"\n").decode("utf-8", "surrogateescape"), prefix)


def proc_hides_others(mountinfo="/proc/self/mountinfo"):
    """/proc's hidepid= value when it hides other users' processes from us (hidepid=1/noaccess makes
    their files unreadable, 2/invisible and 4/ptraceable their very pids), else None. Root sees them
    all; so does a member of the mount's gid= group."""
    if os.geteuid() == 0:
        return None
    try:
        with open(mountinfo, "rb") as handle:
            lines = handle.read(MAX_MOUNTINFO_BYTES).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    hidepid = gid = None
    for line in lines:
        # ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        left, separator, right = line.partition(" - ")
        fields, supers = left.split(), right.split()
        if not separator or len(fields) < 5 or fields[4] != "/proc" or len(supers) < 3 or supers[0] != "proc":
            continue
        hidepid = gid = None  # the last mount on /proc is the one seen
        for option in supers[2].split(","):
            if option.startswith("hidepid="):
                hidepid = option[len("hidepid=") :]
            elif option.startswith("gid="):
                gid = option[len("gid=") :]
    if hidepid in (None, "0", "off"):
        return None
    if gid is not None and gid.isdigit() and (int(gid) == os.getegid() or int(gid) in os.getgroups()):
        return None
    return hidepid


def scan_in_use(prefix, exclude_pid=None):
    """Every file open or mapped by a process we may look at (our own excluded: the deleter's own descriptors)."""
    found = InUse()
    found.hidden_by = proc_hides_others()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        found.cannot_list = True
        return found
    scan_pids(found, pids, prefix, str(os.getpid() if exclude_pid is None else exclude_pid))
    return found


def scan_pids(found, pids, prefix, exclude=None):
    """Look at the files of each of `pids` (as /proc named them) into `found`.

    Kernel threads hold no files and are passed over; a process that ended during the scan is
    not counted, not even as unreadable (its refusal was the kernel's for a process being torn
    down, or its pid is gone); one that stays unreadable is kept with its user and name.
    """
    for pid in pids:
        if pid == exclude:
            continue
        before = _process_of(pid)
        if before is None or before[2]:
            continue  # gone, a zombie, or a kernel thread
        found.processes += 1
        readable = _read_fds(found, before[3], prefix)
        readable = _read_maps(found, before[3], prefix) and readable
        if not readable:
            after = _process_of(pid)
            if after is not None and after[0] == before[0]:  # the same process, still there
                found.unreadable[pid] = (_real_uid(pid), after[1])


def in_use_under(root, exclude_pid=None):
    """{"paths": files under root open or mapped (by the root as named), "denied": n, "uid": u, "note": ...}."""
    try:
        fd = open_root(root)
    except UnitProblem as exc:
        return {"paths": [], "denied": 0, "uid": os.geteuid(), "note": "open-file check: %s" % exc}
    try:
        real_root = real_path_of(fd, root)
        owner = os.fstat(fd).st_uid
        found = scan_in_use(real_root, exclude_pid)
        paths = set(found.paths)
        if found.ids:
            paths.update(_paths_with_ids(fd, real_root, found))
    finally:
        os.close(fd)
    named = root.rstrip("/") or "/"
    shown = sorted(named + p[len(real_root.rstrip("/")) :] if real_root.rstrip("/") != named else p for p in paths)
    return {"paths": shown, "denied": found.denied, "uid": os.geteuid(), "note": found.note(owner)}


def _paths_with_ids(root_fd, real_root, found):
    """Paths under the root whose (dev, ino) a process holds: for mappings whose path the kernel shows elsewhere."""
    hits = []
    budget = [MAX_ROOT_WALK]

    def walk(fd, prefix, depth):
        try:
            names = os.listdir(fd)
        except OSError:
            return
        for name in names:
            budget[0] -= 1
            if budget[0] < 0:
                found.truncated = True
                return
            try:
                st = lstat_at(name, fd)
            except OSError:
                continue
            path = prefix + "/" + name
            if (st.st_dev, st.st_ino) in found.ids:
                hits.append(path)
            if stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    walk(child, path, depth + 1)
                finally:
                    os.close(child)

    walk(root_fd, real_root.rstrip("/"), 0)
    return hits


# --- plan time: pin ------------------------------------------------------------------------------


def pin_units(root, units):
    """The root's identity and every unit's records, for the plan (see the module docstring)."""
    try:
        fd = open_root(root)
    except UnitProblem as exc:
        return {"problem": str(exc)}
    try:
        answers = []
        for members in units:
            try:
                if not isinstance(members, list) or not members:
                    raise UnitProblem("a unit without members")
                answers.append({"tree": unit_tree(fd, members)})
            except UnitProblem as exc:
                answers.append({"problem": str(exc)})
            except OSError as exc:
                answers.append({"problem": str(exc.strerror or exc)})
        return {"root_id": root_identity(fd), "real_root": real_path_of(fd, root), "units": answers}
    finally:
        os.close(fd)


# --- execution ------------------------------------------------------------------------------------


def unlink_at(name, dir_fd):
    """Remove one non-directory entry (a seam for tests that need a deletion to fail)."""
    os.unlink(name, dir_fd=dir_fd)


def rmdir_at(name, dir_fd):
    os.rmdir(name, dir_fd=dir_fd)


def _names(items):
    items = list(items)
    text = ", ".join(items[:SHOWN_NAMES])
    return text + (" and %d more" % (len(items) - SHOWN_NAMES) if len(items) > SHOWN_NAMES else "")


class PinnedRoot(object):
    """One execution: the root opened and checked once, units checked whole and deleted on request.

    `refused` is set (and nothing can be deleted) when the directory is not the one planned.
    """

    def __init__(self, root, root_id, units, exclude_pid=None, check_in_use=True):
        self.root = root
        # [{"members": [...], "tree": [...]}]; those marked "kept" (what they are, in words) are the
        # kept units that justify the deletions: never deleted, and while one of them is not as
        # judged nothing is (the doomed units keep their indexes: kept ones come after them).
        self.units = [u for u in units if not (isinstance(u, dict) and u.get("kept"))]
        self.kept = [u for u in units if isinstance(u, dict) and u.get("kept")]
        self.fd = None
        self.refused = None
        self.in_use = InUse()
        self.owner = None  # uid of the directory: its processes are named first when unreadable
        self.real_root = root
        try:
            fd = open_root(root)
        except UnitProblem as exc:
            self.refused = str(exc)
            return
        now = root_identity(fd)
        if list(now) != list(root_id):
            os.close(fd)
            self.refused = (
                "%s is not the directory the plan was made for (device %s inode %s, planned %s %s):"
                " replaced since the plan" % (root, now[0], now[1], root_id[0], root_id[1])
            )
            return
        self.fd = fd
        self.owner = os.fstat(fd).st_uid
        self.real_root = real_path_of(fd, root)
        why = self._kept_changed()
        if why:
            self.close()
            self.refused = why
            return
        if check_in_use:
            self.in_use = scan_in_use(self.real_root, exclude_pid)

    def _kept_changed(self, outcome="nothing deleted"):
        """None while every kept unit that vouches for the deletions is as judged, else why nothing (more) may go."""
        for unit in self.kept:
            members = [str(m) for m in unit.get("members") or []]
            recorded = [list(r) for r in unit.get("tree") or []]
            try:
                why = self._differs(members, recorded)
            except UnitProblem as exc:
                why = str(exc)
            except OSError as exc:
                why = str(exc.strerror or exc)
            if why:
                return "%s %s changed since it was judged: %s (%s)" % (
                    unit["kept"],
                    ", ".join(members)[:300],
                    outcome,
                    why,
                )
        return None

    @property
    def note(self):
        """None, or why the in-use check may have missed a process."""
        return self.in_use.note(self.owner)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _unit(self, index):
        if self.fd is None:
            raise UnitProblem(self.refused or "closed")
        if not isinstance(index, int) or not 0 <= index < len(self.units):
            raise UnitProblem("no unit %r in this plan" % (index,))
        unit = self.units[index]
        return list(unit["members"]), [list(r) for r in unit["tree"]]

    def check(self, index):
        """None when the unit may go now, else why it is kept."""
        try:
            members, recorded = self._unit(index)
            return self._why_not(members, recorded)
        except UnitProblem as exc:
            return str(exc)
        except OSError as exc:
            return str(exc.strerror or exc)

    def _why_not(self, members, recorded):
        if not recorded:
            return "nothing recorded for this unit"
        try:
            now = unit_tree(self.fd, members)
        except UnitProblem as exc:
            text = str(exc)
            if len(members) == 1 and text == "%s is gone" % members[0]:
                return "already gone"
            return text
        why = self._compare(recorded, now) or self._kept_changed("not deleted") or self._not_removable(members, now)
        if why:
            return why
        held = [r[0] for r in now if self.in_use.holds(r, self.real_root)]
        if held:
            return "in use: %s open or mapped by a process" % _names(held)
        return None

    def _not_removable(self, members, records):
        """Why this user could not remove all of the unit (a directory of it, or holding it, that the
        user may not write), else None: asked before anything goes, so that a unit goes whole or not
        at all (a root-owned global_stepN/ inside checkpoint-N/ left it without config.json)."""
        folders = set(r[0] for r in records if r[1] == "d")
        folders.update("/".join(split_member(rel)[:-1]) for rel in members)
        for rel in sorted(folders):
            if rel:
                parts = split_member(rel)
                parent = open_parent(self.fd, parts)
                try:
                    may = os.access(parts[-1], os.W_OK | os.X_OK, dir_fd=parent)
                finally:
                    os.close(parent)
            else:
                may = os.access(".", os.W_OK | os.X_OK, dir_fd=self.fd)
            if not may:
                return "%s: Permission denied (this user may not delete in it): nothing of the unit deleted" % (
                    rel or "the directory"
                )
        return self._sticky_refusal(records)

    def _sticky_refusal(self, records):
        """Why an entry of the unit could not be unlinked for a sticky directory (mode +t, as /tmp),
        else None: there only the entry's owner, the directory's owner (or root) may remove it."""
        me = os.geteuid()
        if me == 0:
            return None  # CAP_FOWNER: root removes in sticky directories
        by_folder = {}
        for r in records:
            parts = split_member(r[0])
            by_folder.setdefault("/".join(parts[:-1]), []).append(parts[-1])
        for folder in sorted(by_folder):
            fd = open_parent(self.fd, split_member(folder + "/x")) if folder else os.dup(self.fd)
            try:
                st = os.fstat(fd)
                if not st.st_mode & stat.S_ISVTX or st.st_uid == me:
                    continue
                for name in sorted(by_folder[folder]):
                    if lstat_at(name, fd).st_uid != me:
                        rel = folder + "/" + name if folder else name
                        return (
                            "%s: Permission denied (in a sticky directory, and neither it nor the directory is this "
                            "user's): nothing of the unit deleted" % rel
                        )
            finally:
                os.close(fd)
        return None

    def _differs(self, members, recorded):
        """None when the unit's files are all as recorded (not asking whether a process holds them)."""
        if not recorded:
            return "nothing recorded for this unit"
        return self._compare(recorded, unit_tree(self.fd, members))

    @staticmethod
    def _compare(recorded, now):
        planned = dict((r[0], r) for r in recorded)
        found = dict((r[0], r) for r in now)
        gone = [rel for rel in planned if rel not in found]
        if gone:
            return "%s gone since it was judged: the unit is not whole" % _names(gone)
        new = [rel for rel in found if rel not in planned]
        if new:
            return "%s appeared since it was judged: not deleted" % _names(new)
        for rel in planned:
            why = why_differs(planned[rel], found[rel])
            if why:
                return why
        return None

    def delete(self, index):
        """(its members, None) when the unit went whole; else (each entry removed, why the rest did not)."""
        try:
            members, recorded = self._unit(index)
            why = self._why_not(members, recorded)  # again: the audit record was written in between
        except UnitProblem as exc:
            return [], str(exc)
        except OSError as exc:
            return [], str(exc.strerror or exc)
        if why:
            return [], why
        planned = dict((r[0], r) for r in recorded)
        went = []  # every entry removed, files and (with a trailing /) directories, as it goes
        for rel in members:
            try:
                self._remove_member(rel, planned, went)
            except UnitProblem as exc:
                return went, self._partial(went, recorded, str(exc))
            except OSError as exc:
                return went, self._partial(went, recorded, "%s: %s" % (rel, exc.strerror or exc))
        return list(members), None

    @staticmethod
    def _partial(went, recorded, why):
        """The reason a unit failed, first saying how much of it went when any did."""
        if not went:
            return why
        files = sum(1 for r in recorded if r[1] != "d")
        files_went = sum(1 for rel in went if not rel.endswith("/"))
        return "partly deleted: %d of %d files went, the unit is no longer whole (went: %s): %s" % (
            files_went,
            files,
            _names(went),
            why,
        )

    def _remove_member(self, rel, planned, went):
        parts = split_member(rel)
        parent = open_parent(self.fd, parts)
        try:
            self._remove_entry(parent, parts[-1], rel, planned, 0, went)
        finally:
            os.close(parent)

    def _remove_entry(self, parent_fd, name, rel, planned, depth, went):
        try:
            st = lstat_at(name, parent_fd)
        except FileNotFoundError:
            raise UnitProblem("%s went missing during the deletion" % rel)
        # The ctime was compared just before (check); here it is not: unlinking one of two
        # members that are hard links of one file moves the other's ctime.
        why = why_differs(planned[rel][:6], record_of(rel, st)[:6])
        if why:
            raise UnitProblem(why)
        if not stat.S_ISDIR(st.st_mode):
            try:
                unlink_at(name, parent_fd)
            except OSError as exc:  # named by the file that stayed, not by the member holding it
                raise UnitProblem("%s: %s" % (rel, exc.strerror or exc))
            went.append(rel)
            return
        fd = open_same_dir(parent_fd, name, rel, st, depth, "during the deletion")
        try:
            for child in sorted(os.listdir(fd)):
                child_rel = rel + "/" + child
                if child_rel in planned:
                    self._remove_entry(fd, child, child_rel, planned, depth + 1, went)
        finally:
            os.close(fd)
        try:
            rmdir_at(name, parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise UnitProblem("%s holds files that are not in the plan: they and it were left" % rel)
            raise UnitProblem("%s: %s" % (rel, exc.strerror or exc))
        went.append(rel + "/")


# --- the node side of the protocol ------------------------------------------------------------------


def answer(request, state):
    """The reply to one request; `state` holds the open PinnedRoot between requests."""
    op = request.get("op") if isinstance(request, dict) else None
    if op == "pin":
        return pin_units(request["root"], request["units"])
    if op == "in_use":
        return in_use_under(request["root"])
    if op == "open":
        if state.get("pinned") is not None:
            state["pinned"].close()
        pinned = PinnedRoot(request["root"], request["root_id"], request["units"])
        state["pinned"] = pinned
        if pinned.refused:
            return {"ok": False, "why": pinned.refused}
        return {"ok": True, "real_root": pinned.real_root, "note": pinned.note}
    if op in ("check", "delete"):
        pinned = state.get("pinned")
        if pinned is None:
            return {"unit": request.get("unit"), "why": "no plan opened", "went": []}
        if op == "check":
            return {"unit": request["unit"], "why": pinned.check(request["unit"])}
        went, why = pinned.delete(request["unit"])
        return {"unit": request["unit"], "went": went, "why": why}
    return {"error": "unknown request %r" % (op,)}


def main(stdin=None, stdout=None):
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    state = {}
    try:
        while True:
            line = stdin.readline(MAX_REQUEST_BYTES + 1)
            if not line:
                return 0
            if len(line) > MAX_REQUEST_BYTES:
                stdout.write(json.dumps({"error": "request over %d bytes" % MAX_REQUEST_BYTES}) + "\n")
                stdout.flush()
                return 2
            try:
                request = json.loads(line.decode("utf-8"))
            except ValueError as exc:
                request, reply = None, {"error": "not a JSON request: %s" % str(exc)[:200]}
            if isinstance(request, dict) and request.get("op") == "close":
                return 0
            if request is not None:
                try:
                    reply = answer(request, state)
                except Exception as exc:  # a bad request is answered, never a traceback on the wire
                    reply = {"error": "%s: %s" % (type(exc).__name__, str(exc)[:500])}
            stdout.write(json.dumps(reply) + "\n")
            stdout.flush()
    finally:
        if state.get("pinned") is not None:
            state["pinned"].close()


if __name__ == "__main__":
    sys.exit(main())
