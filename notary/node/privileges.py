"""Dropping root after binding: a node started as root (to bind ports below
1024 without socket activation) switches to ``[node] user``/``group`` (or
``--user``/``--group``) once its sockets are bound, before it starts a
worker or reads a file: the keys, certificate, bundles and database must be
readable (the database writable) by that user.

Error handling: an unknown user or group, or a switch that does not take, is
a ``UsageError``; the process must not go on serving as root.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd

from notary.errors import UsageError

log = logging.getLogger(__name__)


def drop_privileges(user: str, group: str = "") -> bool:
    """As root with ``user`` set: become ``user`` (and ``group``, or the
    user's primary group), with no supplementary groups. True if it
    switched; False (nothing done) when not root or no user is configured."""
    if os.geteuid() != 0 or not user:
        return False
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise UsageError(f"[node] user {user!r} does not exist") from None
    gid = entry.pw_gid
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise UsageError(f"[node] group {group!r} does not exist") from None
    os.setgroups([])
    os.setgid(gid)
    os.setuid(entry.pw_uid)
    if os.geteuid() == 0 or os.getegid() != gid:
        raise UsageError(f"could not drop privileges to {user}:{group or gid}")
    log.info("dropped privileges to %s (uid %d, gid %d)", user, entry.pw_uid, gid)
    return True
