"""The systemd service protocol, without a ``python-systemd`` dependency:
readiness and watchdog notifications (``sd_notify``) and socket activation
(``sd_listen_fds``). Plain blocking-free sockets, no Trio: the supervisor and
the workers call these from wherever they are.

Who talks to systemd
    ``systemd/notary.service`` sets ``NotifyAccess=main``: only the unit's
    main process notifies systemd. With workers that is the supervisor: it
    sends ``READY=1`` once every worker serves, ``STATUS=...`` as workers
    come and go, ``WATCHDOG=1`` every ``watchdog_interval_s()`` while no
    worker is overdue, and ``STOPPING=1`` on SIGTERM. Each worker speaks the
    same protocol with these same functions, but to the supervisor: the
    supervisor sets the worker's ``NOTIFY_SOCKET`` to a socket of its own
    and its ``WATCHDOG_USEC`` to the worker timeout, and leaves out
    ``WATCHDOG_PID`` and the ``LISTEN_*`` variables (which would name the
    supervisor's pid anyway, so they could not apply to a worker).

Socket activation
    ``listen_fds()`` returns the sockets systemd passed, grouped by
    ``FileDescriptorName=``. ``FileDescriptorName=`` applies to every socket
    of a ``.socket`` unit, so the units ship one socket unit per role:

    ==============================  ================  =========================
    unit                            name              replaces the config's
    ==============================  ================  =========================
    ``notary-api.socket``           ``api``           ``[server] api`` (HTTPS)
    ``notary-relay.socket``         ``relay``         ``[relay] listen``
    ``notary-perspectives.socket``  ``perspectives``  ``[perspectives] listen``
    ==============================  ================  =========================

    ``plain_api`` (``[server] plain_api``) and ``admin`` (``[admin] listen``)
    are understood too (``notary.server.sockets.ROLES``) but not shipped: the
    admin port is above 1024, so the supervisor binds it from the config, and
    a health check then sees "connection refused" when the service is down
    instead of starting it. The supervisor maps names to roles
    (``notary.server.sockets.check_roles`` refuses unknown names: a socket
    unit without ``FileDescriptorName=`` passes its unit name, such as
    ``notary-api.socket``, and a manager that passes no names at all gives
    ``unknown``): a role that has sockets from systemd uses them and ignores
    its configured addresses; the other roles bind their configured ones.

Resource handling: ``listen_fds`` hands ownership of the sockets to the
caller (each ``socket.socket`` closes its fd when closed or collected).
They are close-on-exec, as ``sd_listen_fds`` makes them: a supervisor passes
them to its workers explicitly (``pass_fds``). A ``Notifier`` owns one
datagram socket until ``close()``; ``notify()`` opens and closes one per call.

Error handling: notifications never raise for a missing, refused or full
notification socket (systemd may be restarting, or the program runs outside
systemd): they return False and log a warning once per address, then at
debug level. A malformed variable that systemd would never set
(``LISTEN_FDS=x``) is a ``UsageError`` naming it; a state that is not
``KEY=VALUE`` is a ``ValueError`` (a bug in the caller).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Mapping

from notary.errors import UsageError

log = logging.getLogger(__name__)

#: The first file descriptor systemd passes (``SD_LISTEN_FDS_START``).
LISTEN_FDS_START = 3
#: The name of every passed socket when the manager passes no
#: ``$LISTEN_FDNAMES`` (systemd always does; a unit without
#: ``FileDescriptorName=`` names its sockets after itself).
UNNAMED = "unknown"
_LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")

_warned_addresses: set[str] = set()


def _socket_address(text: str) -> bytes:
    # A leading "@" names a socket in the abstract namespace (a NUL byte).
    address = os.fsencode(text)
    return b"\0" + address[1:] if address.startswith(b"@") else address


def _datagram(states: tuple[str, ...]) -> bytes:
    for state in states:
        key, sep, _ = state.partition("=")
        if not sep or not key:
            raise ValueError(f"a notification state must be KEY=VALUE, not {state!r}")
    # One datagram, one assignment per line: a newline inside a value (a
    # STATUS= built from an error message) would start a bogus assignment.
    return "\n".join(state.replace("\n", " ") for state in states).encode()


def _report_failure(address: str, error: OSError | str) -> None:
    reason = (error.strerror or str(error)) if isinstance(error, OSError) else error
    if address in _warned_addresses:
        log.debug("systemd notification to %s failed: %s", address, reason)
    else:
        _warned_addresses.add(address)
        log.warning("systemd notification to %s failed: %s", address, reason)


class Notifier:
    """A datagram socket to the service manager, opened once and reused (the
    supervisor's watchdog sends one message every few seconds).

    ``address`` is a path, or ``@name`` for the abstract namespace; None
    reads ``$NOTIFY_SOCKET`` now. Without an address, every ``notify`` is a
    no-op returning False.

    Resource handling: the socket is opened on the first ``notify`` and held
    until ``close()`` (or the end of a ``with`` block). Error handling: as
    the module says, ``notify`` returns False instead of raising, and a
    failed send closes the socket so the next one opens it again (systemd
    may have been re-executed and bound a new socket at the same path).
    """

    def __init__(self, address: str | None = None) -> None:
        if address is None:
            address = os.environ.get("NOTIFY_SOCKET") or None
        self.address = address
        self._socket: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """True when there is an address to notify."""
        return self.address is not None

    def notify(self, *states: str) -> bool:
        """Send ``states`` (``"READY=1"``, ``"STATUS=..."``, ...) as one
        message. True when the service manager's socket took it."""
        data = _datagram(states)
        if self.address is None:
            return False
        if not self.address.startswith(("/", "@")):
            # systemd 254+ may also pass vsock: addresses, for VMs only.
            _report_failure(self.address, "unsupported NOTIFY_SOCKET address")
            return False
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)
            self._socket.sendto(data, _socket_address(self.address))
        except OSError as exc:
            self.close()
            _report_failure(self.address, exc)
            return False
        return True

    def close(self) -> None:
        """Close the socket (idempotent); a later ``notify`` reopens it."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def notify(*states: str) -> bool:
    """Send ``states`` as one message to ``$NOTIFY_SOCKET``, the way
    ``sd_notify(0, "\\n".join(states))`` does: ``notify("READY=1",
    "STATUS=serving")``. Returns False, without raising, when the variable is
    unset or the socket cannot take the message (see the module's error
    handling); True when it was sent. Opens and closes a socket per call:
    hold a ``Notifier`` to send often."""
    with Notifier() as notifier:
        return notifier.notify(*states)


def _positive_int(name: str, text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise UsageError(f"${name} must be a positive integer, not {text!r}")
    value = int(text)
    if value <= 0:
        raise UsageError(f"${name} must be a positive integer, not {text!r}")
    return value


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """How often to send ``WATCHDOG=1``: half of ``$WATCHDOG_USEC``, as
    systemd recommends, so one late ping does not kill the service. None
    when no watchdog is asked for, or when ``$WATCHDOG_PID`` names another
    process (a child that inherited its parent's environment).

    ``UsageError`` naming the variable when either is not a positive integer.
    """
    environ = os.environ if environ is None else environ
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    period_us = _positive_int("WATCHDOG_USEC", usec)
    pid = environ.get("WATCHDOG_PID")
    if pid and _positive_int("WATCHDOG_PID", pid) != os.getpid():
        return None
    return period_us / 2 / 1_000_000


def listen_fds(unset_environment: bool = True) -> dict[str, list[socket.socket]]:
    """The sockets systemd passed by socket activation, grouped by their
    ``FileDescriptorName=`` (``{"api": [...], "relay": [...]}``), in fd
    order; ``{}`` when this process was not socket-activated (no
    ``$LISTEN_PID``, or it names another process).

    Reads ``$LISTEN_PID``, ``$LISTEN_FDS`` (the count; the fds are 3, 4, ...)
    and ``$LISTEN_FDNAMES`` (colon-separated; a missing or empty name is
    ``"unknown"``). With ``unset_environment`` the three variables are
    removed, whatever the outcome, so children do not see them.

    Resource handling: the caller owns the returned sockets; they are made
    close-on-exec. Error handling: a ``UsageError`` naming the variable when
    one is malformed, when ``$LISTEN_FDNAMES`` does not have one name per fd,
    or when a passed fd is not an open socket; nothing is taken over then.
    """
    try:
        pid_text = os.environ.get("LISTEN_PID")
        if not pid_text or _positive_int("LISTEN_PID", pid_text) != os.getpid():
            return {}
        count_text = os.environ.get("LISTEN_FDS")
        if not count_text:
            return {}
        if not count_text.isascii() or not count_text.isdigit():
            raise UsageError(f"$LISTEN_FDS must be a count of file descriptors, not {count_text!r}")
        fds = range(LISTEN_FDS_START, LISTEN_FDS_START + int(count_text))
        if not fds:
            return {}
        names_text = os.environ.get("LISTEN_FDNAMES")
        names = names_text.split(":") if names_text is not None else [UNNAMED] * len(fds)
        if len(names) != len(fds):
            raise UsageError(
                f"$LISTEN_FDNAMES has {len(names)} names for {len(fds)} "
                f"file descriptors ($LISTEN_FDS)"
            )
        for fd in fds:
            # Check them all before taking any: a socket object closes its fd
            # when collected, which would close fds we then refused.
            try:
                is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
            except OSError as exc:
                raise UsageError(f"$LISTEN_FDS: fd {fd}: {exc.strerror}") from None
            if not is_socket:
                raise UsageError(f"$LISTEN_FDS: fd {fd} is not a socket")
        sockets: dict[str, list[socket.socket]] = {}
        for fd, name in zip(fds, names, strict=True):
            os.set_inheritable(fd, False)
            sockets.setdefault(name or UNNAMED, []).append(socket.socket(fileno=fd))
        return sockets
    finally:
        if unset_environment:
            for name in _LISTEN_VARIABLES:
                os.environ.pop(name, None)
