"""The listening sockets of a node: bound from the config, taken from systemd
socket activation, or inherited from the supervisor.

Every listener has a *role*, the config key it serves and the
``FileDescriptorName=`` systemd gives it:

=================  ========================  ===========================
role               config                    served by
=================  ========================  ===========================
``api``            ``[server] api``          the HTTPS query API
``plain_api``      ``[server] plain_api``    the plain-HTTP query API
``relay``          ``[relay] listen``        the bounce relay
``perspectives``   ``[perspectives] listen`` Perspectives (plain HTTP)
``admin``          ``[admin] listen``        ``/metrics``, ``/healthz``
=================  ========================  ===========================

Sockets are opened before anything else (so a node started as root can
bind ports below 1024 and then drop privileges, see ``drop_privileges``)
and handed to ``serve_notary``, in this process or, inherited, in each
worker: every worker accepts on the same sockets.

Ownership: the caller owns the sockets returned here; ``serve_notary`` wraps
them in Trio listeners and closes them when it stops. Errors: a socket that
cannot be bound, or a malformed inherited set, is a ``UsageError`` naming the
address or the variable.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Mapping, MutableMapping, Sequence

from notary.config import Config, Endpoint
from notary.errors import UsageError

ROLES = ("api", "plain_api", "relay", "perspectives", "admin")
#: Set by the supervisor for its workers: ``api=3,4;relay=5`` (role to fds).
WORKER_FDS_ENV = "NOTARY_WORKER_FDS"
#: The listen queue asked for; the kernel caps it at ``net.core.somaxconn``.
BACKLOG = 65535

Sockets = Mapping[str, Sequence[socket.socket]]


def endpoints_by_role(config: Config) -> dict[str, tuple[Endpoint, ...]]:
    """The configured addresses of each role this config serves."""
    return {
        "api": config.server.api,
        "plain_api": config.server.plain_api,
        "relay": config.relay.listen,
        "perspectives": (
            config.perspectives.listen if config.perspectives.key_file is not None else ()
        ),
        "admin": config.admin.listen,
    }


def bind_endpoint(endpoint: Endpoint) -> list[socket.socket]:
    """Listening TCP sockets for ``endpoint`` (``localhost`` may give one per
    address family). ``UsageError`` when the address cannot be bound."""
    try:
        infos = socket.getaddrinfo(
            endpoint.host, endpoint.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {endpoint}: {exc.strerror}") from None
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
            (info[0], info[1], info[2], None, info[4]) for info in infos
        ):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
    except OSError as exc:
        for sock in bound:
            sock.close()
        hint = " (ports below 1024 need root or socket activation)" if (
            exc.errno == errno.EACCES
        ) else ""
        raise UsageError(f"cannot listen on {endpoint}: {exc.strerror}{hint}") from None
    return bound


def bind_sockets(config: Config, *, taken: Sockets | None = None) -> dict[str, list[socket.socket]]:
    """Every role's sockets: those in ``taken`` (from systemd) as they are,
    the others bound from the config. On error, nothing stays open."""
    sockets: dict[str, list[socket.socket]] = {}
    try:
        for role, endpoints in endpoints_by_role(config).items():
            if taken is not None and role in taken:
                sockets[role] = list(taken[role])
                continue
            sockets[role] = [s for endpoint in endpoints for s in bind_endpoint(endpoint)]
    except UsageError:
        close_all(sockets)
        raise
    return sockets


def check_roles(named: Mapping[str, object]) -> None:
    """``UsageError`` unless every name is a role (systemd's names)."""
    unknown = sorted(set(named) - set(ROLES))
    if unknown:
        raise UsageError(
            f"socket activation: unknown FileDescriptorName {', '.join(unknown)} "
            f"(expected {', '.join(ROLES)})"
        )


def worker_environment(sockets: Sockets) -> dict[str, str]:
    """The environment entry that tells a worker which inherited fd serves
    which role (the fds must be passed with ``pass_fds``)."""
    return {
        WORKER_FDS_ENV: ";".join(
            f"{role}={','.join(str(s.fileno()) for s in socks)}"
            for role, socks in sockets.items()
            if socks
        )
    }


def inherited_sockets(environ: dict[str, str] | None = None) -> dict[str, list[socket.socket]] | None:
    """The sockets the supervisor passed to this worker (None: not a
    worker). The variable is removed so a child of ours does not take them."""
    source: MutableMapping[str, str] = os.environ if environ is None else environ
    text = source.pop(WORKER_FDS_ENV, None)
    if text is None:
        return None
    sockets: dict[str, list[socket.socket]] = {role: [] for role in ROLES}
    for part in filter(None, text.split(";")):
        role, _, fds = part.partition("=")
        if role not in ROLES or not fds:
            raise UsageError(f"{WORKER_FDS_ENV}: bad entry {part!r}")
        for fd in fds.split(","):
            if not fd.isdigit():
                raise UsageError(f"{WORKER_FDS_ENV}: bad file descriptor {fd!r}")
            try:
                sockets[role].append(socket.socket(fileno=int(fd)))
            except OSError as exc:
                raise UsageError(f"{WORKER_FDS_ENV}: fd {fd}: {exc.strerror}") from None
    return sockets


def close_all(sockets: Sockets) -> None:
    for socks in sockets.values():
        for sock in socks:
            sock.close()
