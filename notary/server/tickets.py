"""TLS session-ticket keys shared by a node's workers (issue 35).

A resumed TLS handshake costs about half a full one (bench/RESULTS.md), but
a client resumes only with a process that can decrypt its ticket, and
OpenSSL draws each ``SSL_CTX``'s ticket keys at random: with ``--workers
N`` the kernel hands a reconnection to any worker, and about N-1 of N made a
full handshake. So the supervisor draws one set of keys when the node
starts (``new_ticket_keys``) and hands it to every worker it starts, a
restarted one included, through an anonymous memory file
(``ticket_keys_file``, a ``memfd``) whose descriptor the worker inherits and
names in ``$NOTARY_TICKET_KEYS_FD``; the worker reads it and closes it
(``take_ticket_keys``) and installs the keys in its server context
(``install_ticket_keys``), for TLS 1.2 and TLS 1.3 tickets alike.

The keys never touch a disk and live as long as the node: a node restart
draws new ones (tickets issued before it then make full handshakes, as
every restart did before), a worker restart keeps them. A ticket still
expires with its session (the context's timeout; OpenSSL: 2 hours). A
single-process notary keeps OpenSSL's own keys.

Python's ``ssl`` has no call for this, so ``install_ticket_keys`` calls
``SSL_CTX_ctrl`` in the OpenSSL that ``_ssl`` runs (``ctypes``, looked up
in ``_ssl``'s own library: no second OpenSSL), on the ``SSL_CTX`` pointer
that CPython's ``PySSLContext`` begins with, as the compiled TLS driver
reads it (``notary.server._fasttls``); it checks that pointer first (the
context's options and minimum version read back through it).

Error handling: ``take_ticket_keys`` raises ``UsageError`` for a variable
that names no readable descriptor of ``TICKET_KEYS_BYTES`` bytes (a worker
started by something other than the supervisor); ``install_ticket_keys``
raises ``TicketKeysUnavailable`` where this Python or OpenSSL cannot take
them (the caller logs it and serves with per-worker keys).
"""

from __future__ import annotations

import _ssl
import contextlib
import ctypes
import os
import secrets
import ssl
from collections.abc import MutableMapping

from notary.errors import UsageError

__all__ = [
    "TICKET_KEYS_BYTES",
    "TICKET_KEYS_ENV",
    "TicketKeysUnavailable",
    "install_ticket_keys",
    "installed_ticket_keys",
    "new_ticket_keys",
    "take_ticket_keys",
    "ticket_keys_file",
]

TICKET_KEYS_ENV = "NOTARY_TICKET_KEYS_FD"
#: OpenSSL's ticket keys: a 16-byte key name, a 32-byte HMAC key, a 32-byte AES key.
TICKET_KEYS_BYTES = 80

_SSL_CTRL_GET_TLSEXT_TICKET_KEYS = 58
_SSL_CTRL_SET_TLSEXT_TICKET_KEYS = 59
_SSL_CTRL_GET_MIN_PROTO_VERSION = 130


class TicketKeysUnavailable(RuntimeError):
    """This Python's ``ssl`` contexts, or its OpenSSL, cannot take shared keys."""


def new_ticket_keys() -> bytes:
    """A new set of ticket keys (from the system's random source)."""
    return secrets.token_bytes(TICKET_KEYS_BYTES)


def ticket_keys_file(keys: bytes) -> int:
    """A new memory file holding ``keys``: its descriptor, close-on-exec (give
    it to a child with ``pass_fds``). The caller owns it and closes it."""
    fd = os.memfd_create("notary-ticket-keys", os.MFD_CLOEXEC)
    try:
        os.pwrite(fd, keys, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def take_ticket_keys(environ: MutableMapping[str, str] | None = None) -> bytes | None:
    """The keys the supervisor handed this worker (None: it handed none).
    The variable is removed and the descriptor closed, so no child of ours
    inherits either."""
    source: MutableMapping[str, str] = os.environ if environ is None else environ
    text = source.pop(TICKET_KEYS_ENV, None)
    if text is None:
        return None
    if not text.isdigit():
        raise UsageError(f"{TICKET_KEYS_ENV}: not a file descriptor: {text[:20]!r}")
    fd = int(text)
    try:
        keys = os.pread(fd, TICKET_KEYS_BYTES + 1, 0)
    except OSError as exc:
        raise UsageError(f"{TICKET_KEYS_ENV}: cannot read fd {fd}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):  # not ours to keep either way
            os.close(fd)
    if len(keys) != TICKET_KEYS_BYTES:
        raise UsageError(f"{TICKET_KEYS_ENV}: fd {fd} holds {len(keys)} bytes, not "
                         f"{TICKET_KEYS_BYTES}")
    return keys


def install_ticket_keys(context: ssl.SSLContext, keys: bytes) -> None:
    """Encrypt and decrypt ``context``'s session tickets with ``keys``
    (``TICKET_KEYS_BYTES``), as every context given the same keys does.
    Raises ``ValueError`` for keys of another size, ``TicketKeysUnavailable``
    when the context cannot take them."""
    if len(keys) != TICKET_KEYS_BYTES:
        raise ValueError(f"ticket keys are {TICKET_KEYS_BYTES} bytes, not {len(keys)}")
    library, ctx = _ssl_ctx(context)
    buffer = ctypes.create_string_buffer(keys, TICKET_KEYS_BYTES)
    if library.SSL_CTX_ctrl(ctx, _SSL_CTRL_SET_TLSEXT_TICKET_KEYS, TICKET_KEYS_BYTES,
                            buffer) != 1:
        raise TicketKeysUnavailable("OpenSSL refused the ticket keys")


def installed_ticket_keys(context: ssl.SSLContext) -> bytes:
    """The ticket keys ``context`` uses now (for checks and tests)."""
    library, ctx = _ssl_ctx(context)
    buffer = ctypes.create_string_buffer(TICKET_KEYS_BYTES)
    if library.SSL_CTX_ctrl(ctx, _SSL_CTRL_GET_TLSEXT_TICKET_KEYS, TICKET_KEYS_BYTES,
                            buffer) != 1:
        raise TicketKeysUnavailable("OpenSSL did not give the ticket keys")
    return buffer.raw


def _ssl_ctx(context: ssl.SSLContext) -> tuple[ctypes.CDLL, int]:
    """OpenSSL's functions (``_ssl``'s library) and ``context``'s ``SSL_CTX``,
    checked: its options and minimum version read back through it."""
    if not isinstance(context, ssl.SSLContext):
        raise TypeError("an ssl.SSLContext is needed")
    library = _openssl()
    ctx = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    minimum = max(int(context.minimum_version), 0)  # Python says -2 for OpenSSL's 0
    if not ctx or library.SSL_CTX_get_options(ctx) != int(context.options) or (
        library.SSL_CTX_ctrl(ctx, _SSL_CTRL_GET_MIN_PROTO_VERSION, 0, None) != minimum
    ):
        raise TicketKeysUnavailable("this Python's ssl.SSLContext is not laid out as expected")
    return library, ctx


_library: ctypes.CDLL | None = None


def _openssl() -> ctypes.CDLL:
    """The OpenSSL ``_ssl`` runs (its library's symbols, dependencies included)."""
    global _library
    if _library is None:
        path = getattr(_ssl, "__file__", None)  # None: built into the interpreter
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
            ctrl, get_options = library.SSL_CTX_ctrl, library.SSL_CTX_get_options
        except (OSError, AttributeError) as exc:
            raise TicketKeysUnavailable(f"cannot find the OpenSSL of _ssl: {exc}") from None
        ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        ctrl.restype = ctypes.c_long
        get_options.argtypes = [ctypes.c_void_p]
        get_options.restype = ctypes.c_uint64
        _library = library
    return _library
