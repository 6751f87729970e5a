"""What a login's credentials look like from here, to notice when the user changed them.

A node in `auth` waits for the person to act; retrying the same keys in a loop helps nobody and
can lock the account. What they do to fix it is mostly local: `ssh-add` a key, put the right key
in `~/.ssh`, fix the `IdentityFile` in `~/.ssh/config` or the node's `identity`. A signature of
those (the key files' and the config's metadata, the agent's list of public keys) taken before a
login and again while the node waits says when one more attempt is worth making: a new key is
tried once, an unchanged one never. A key authorised on the node itself is invisible from here:
`r` (retry) is for that.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Dict, Optional, Tuple

import asyncssh

# The files asyncssh reads when no identity is given (asyncssh.public_key._DEFAULT_KEY_FILES), and
# their certificates.
DEFAULT_KEY_NAMES = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")
AGENT_TIMEOUT_S = 2.0
AGENT_FRESH_S = 1.0  # one agent query serves every node waiting at once (a fleet parks together)

FileMark = Tuple[str, int, int, int, int]
Signature = Tuple[Tuple[FileMark, ...], Tuple[str, ...]]

_agent_answers: Dict[str, Tuple[float, Tuple[str, ...]]] = {}  # agent path -> (monotonic time, keys)
_agent_queries: Dict[Tuple[int, str], "asyncio.Future[Tuple[str, ...]]"] = {}  # (loop id, path) -> in flight


def key_files(identity: Optional[str], with_defaults: bool = False) -> Tuple[str, ...]:
    """The files whose change can change what a login offers: the node's identity (or the default
    keys; both for a node behind jump hosts, which log in with the defaults) and the ssh config."""
    ssh_dir = os.path.join(os.path.expanduser("~"), ".ssh")
    keys: Tuple[str, ...] = ()
    if identity:
        keys = (os.path.expanduser(identity),)
    if with_defaults or not identity:
        keys += tuple(os.path.join(ssh_dir, name) for name in DEFAULT_KEY_NAMES)
    paths = []
    for key in keys:
        paths += [key, key + "-cert.pub"]
    paths.append(os.path.join(ssh_dir, "config"))
    return tuple(paths)


def files_signature(identity: Optional[str], with_defaults: bool = False) -> Tuple[FileMark, ...]:
    """Metadata of the key files that exist (made, replaced, rewritten or removed all change it)."""
    marks = []
    for path in key_files(identity, with_defaults):
        try:
            st = os.stat(path)
        except OSError:
            continue
        marks.append((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(marks)


async def _query_agent(path: str) -> Tuple[str, ...]:
    """Digests of the public keys the agent at `path` holds; a failure is a value of its own."""
    agent = None
    try:
        agent = await asyncio.wait_for(asyncssh.connect_agent(path), AGENT_TIMEOUT_S)
        if agent is None:
            return ("no agent",)
        keys = await asyncio.wait_for(agent.get_keys(), AGENT_TIMEOUT_S)
        return tuple(sorted(hashlib.sha256(key.public_data).hexdigest() for key in keys))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return ("agent error: %s" % type(exc).__name__,)
    finally:
        if agent is not None:
            agent.close()
            await agent.wait_closed()


async def agent_signature() -> Tuple[str, ...]:
    """The agent's keys as `ssh-add -l` would list them (digests), asked at most once a second
    however many nodes wait; () without SSH_AUTH_SOCK."""
    path = os.environ.get("SSH_AUTH_SOCK", "")
    if not path:
        return ()
    now = time.monotonic()
    kept = _agent_answers.get(path)
    if kept is not None and now - kept[0] < AGENT_FRESH_S:
        return kept[1]
    loop = asyncio.get_running_loop()
    key = (id(loop), path)
    pending = _agent_queries.get(key)
    if pending is None or pending.get_loop() is not loop:
        pending = loop.create_task(_query_agent(path))
        _agent_queries[key] = pending

        def forget(done: "asyncio.Future[Tuple[str, ...]]", key: Tuple[int, str] = key) -> None:
            if _agent_queries.get(key) is done:
                del _agent_queries[key]
            if not done.cancelled() and done.exception() is None:
                _agent_answers[path] = (time.monotonic(), done.result())

        pending.add_done_callback(forget)
    keys = await asyncio.shield(pending)
    return (path,) + keys


async def credentials_signature(identity: Optional[str], with_defaults: bool = False) -> Signature:
    """Everything a changed login could come from, as far as this machine can see it."""
    return files_signature(identity, with_defaults), await agent_signature()
