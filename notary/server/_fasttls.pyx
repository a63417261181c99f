# cython: language_level=3
"""Server-side TLS over OpenSSL's own API, compiled (issue 35): the twin of
``notary.server._fasttls_py``, which is the reference of its behaviour (the
docstrings are there); ``notary.server.tlsdriver`` picks one.

What compiling buys, per connection: no ``ssl.SSLSocket`` (its set-up asks
the kernel for the socket's type, name and peer, and switches it between
blocking modes around every handshake call), no exception object for each
"would block", no release of the GIL around calls that never block, one
``SSL_shutdown`` at close instead of two, and OpenSSL reading ahead (one
``read`` per flight instead of one per record header and one per body).

The ``SSL`` objects are made from the ``SSL_CTX`` of the ``ssl.SSLContext``
given, so the certificate, versions, ciphers, options and ALPN are those the
Python context holds, and OpenSSL is the very library Python's ``_ssl`` runs:
its functions are looked up in ``_ssl``'s own dependencies at import
(``dlopen`` with ``RTLD_NOLOAD``), so building this module needs no OpenSSL
headers and cannot link another OpenSSL than the one that made the context.
The import fails (and the twin is used) when that library is not OpenSSL 3,
or when what this module reads as a context's ``SSL_CTX`` is not it (same
options, same minimum version: checked on a context made at import, and on
each context given). ``ServerContext`` refuses a context whose callbacks
need Python's own TLS socket objects (``sni_callback``,
``keylog_filename``, a message callback).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.object cimport PyObject
from libc.errno cimport errno
from libc.stdint cimport uint64_t

import os
import ssl

import _ssl

cdef extern from "<dlfcn.h>" nogil:
    void *dlopen(const char *filename, int flags)
    void *dlsym(void *handle, const char *symbol)
    char *dlerror()
    int RTLD_NOW
    int RTLD_NOLOAD

cdef extern from *:
    """
    typedef struct ssl_st SSL;
    typedef struct ssl_ctx_st SSL_CTX;
    """
    ctypedef struct SSL_CTX
    ctypedef struct SSL

ctypedef SSL *(*f_SSL_new)(SSL_CTX *) noexcept nogil
ctypedef void (*f_SSL_free)(SSL *) noexcept nogil
ctypedef int (*f_SSL_set_fd)(SSL *, int) noexcept nogil
ctypedef void (*f_SSL_set_accept_state)(SSL *) noexcept nogil
ctypedef int (*f_SSL_do_handshake)(SSL *) noexcept nogil
ctypedef int (*f_SSL_read_ex)(SSL *, void *, size_t, size_t *) noexcept nogil
ctypedef int (*f_SSL_write_ex)(SSL *, const void *, size_t, size_t *) noexcept nogil
ctypedef int (*f_SSL_shutdown)(SSL *) noexcept nogil
ctypedef int (*f_SSL_get_error)(const SSL *, int) noexcept nogil
ctypedef int (*f_SSL_session_reused)(const SSL *) noexcept nogil
ctypedef int (*f_SSL_is_init_finished)(const SSL *) noexcept nogil
ctypedef int (*f_SSL_has_pending)(const SSL *) noexcept nogil
ctypedef long (*f_SSL_ctrl)(SSL *, int, long, void *) noexcept nogil
ctypedef void (*f_SSL_set_read_ahead)(SSL *, int) noexcept nogil
ctypedef const char *(*f_SSL_get_version)(const SSL *) noexcept nogil
ctypedef uint64_t (*f_SSL_CTX_get_options)(const SSL_CTX *) noexcept nogil
ctypedef long (*f_SSL_CTX_ctrl)(SSL_CTX *, int, long, void *) noexcept nogil
ctypedef int (*f_SSL_CTX_up_ref)(SSL_CTX *) noexcept nogil
ctypedef void (*f_SSL_CTX_free)(SSL_CTX *) noexcept nogil
ctypedef void (*f_ERR_clear_error)() noexcept nogil
ctypedef unsigned long (*f_ERR_get_error)() noexcept nogil
ctypedef unsigned long (*f_ERR_peek_error)() noexcept nogil
ctypedef void (*f_ERR_error_string_n)(unsigned long, char *, size_t) noexcept nogil
ctypedef unsigned long (*f_OpenSSL_version_num)() noexcept nogil

cdef f_SSL_new SSL_new
cdef f_SSL_free SSL_free
cdef f_SSL_set_fd SSL_set_fd
cdef f_SSL_set_accept_state SSL_set_accept_state
cdef f_SSL_do_handshake SSL_do_handshake
cdef f_SSL_read_ex SSL_read_ex
cdef f_SSL_write_ex SSL_write_ex
cdef f_SSL_shutdown SSL_shutdown
cdef f_SSL_get_error SSL_get_error
cdef f_SSL_session_reused SSL_session_reused
cdef f_SSL_is_init_finished SSL_is_init_finished
cdef f_SSL_has_pending SSL_has_pending
cdef f_SSL_ctrl SSL_ctrl
cdef f_SSL_set_read_ahead SSL_set_read_ahead
cdef f_SSL_get_version SSL_get_version
cdef f_SSL_CTX_get_options SSL_CTX_get_options
cdef f_SSL_CTX_ctrl SSL_CTX_ctrl
cdef f_SSL_CTX_up_ref SSL_CTX_up_ref
cdef f_SSL_CTX_free SSL_CTX_free
cdef f_ERR_clear_error ERR_clear_error
cdef f_ERR_get_error ERR_get_error
cdef f_ERR_peek_error ERR_peek_error
cdef f_ERR_error_string_n ERR_error_string_n
cdef f_OpenSSL_version_num OpenSSL_version_num

# OpenSSL 3's ABI constants (ssl.h, err.h, sslerr.h).
DEF SSL_ERROR_SSL = 1
DEF SSL_ERROR_WANT_READ = 2
DEF SSL_ERROR_WANT_WRITE = 3
DEF SSL_ERROR_SYSCALL = 5
DEF SSL_ERROR_ZERO_RETURN = 6
DEF SSL_CTRL_MODE = 33
DEF SSL_CTRL_GET_MIN_PROTO_VERSION = 130
DEF SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER = 0x2
DEF SSL_MODE_AUTO_RETRY = 0x4
DEF SSL_MODE_RELEASE_BUFFERS = 0x10
DEF ERR_LIB_SSL = 20
DEF ERR_SYSTEM_FLAG = 0x80000000
DEF SSL_R_UNEXPECTED_EOF_WHILE_READING = 294

#: What ``handshake``, ``receive`` and ``send`` return when OpenSSL would block
#: (as the twin).
WANT_READ = -1
WANT_WRITE = -2
cdef int _WANT_READ = -1
cdef int _WANT_WRITE = -2


cdef void *_symbol(void *library, const char *name) except NULL:
    cdef void *found = dlsym(library, name)
    if found == NULL:
        raise ImportError(f"OpenSSL has no {name.decode()}")
    return found


cdef int _bind() except -1:
    """Look up the functions in the OpenSSL that ``_ssl`` runs."""
    global SSL_new, SSL_free, SSL_set_fd, SSL_set_accept_state, SSL_do_handshake
    global SSL_read_ex, SSL_write_ex, SSL_shutdown, SSL_get_error, SSL_session_reused
    global SSL_is_init_finished, SSL_has_pending, SSL_ctrl, SSL_set_read_ahead, SSL_get_version
    global SSL_CTX_get_options, SSL_CTX_ctrl, SSL_CTX_up_ref, SSL_CTX_free
    global ERR_clear_error, ERR_get_error, ERR_peek_error, ERR_error_string_n, OpenSSL_version_num
    path = getattr(_ssl, "__file__", None)
    cdef bytes encoded
    cdef void *library
    if path is None:  # _ssl built into the interpreter: its symbols are the program's
        library = dlopen(NULL, RTLD_NOW)
    else:
        encoded = os.fsencode(path)
        library = dlopen(encoded, RTLD_NOW | RTLD_NOLOAD)
    if library == NULL:
        raise ImportError(f"cannot find the OpenSSL of _ssl: {dlerror().decode()}")
    OpenSSL_version_num = <f_OpenSSL_version_num>_symbol(library, b"OpenSSL_version_num")
    if OpenSSL_version_num() < 0x30000000:
        raise ImportError(f"{ssl.OPENSSL_VERSION}: the compiled TLS driver needs OpenSSL 3")
    SSL_new = <f_SSL_new>_symbol(library, b"SSL_new")
    SSL_free = <f_SSL_free>_symbol(library, b"SSL_free")
    SSL_set_fd = <f_SSL_set_fd>_symbol(library, b"SSL_set_fd")
    SSL_set_accept_state = <f_SSL_set_accept_state>_symbol(library, b"SSL_set_accept_state")
    SSL_do_handshake = <f_SSL_do_handshake>_symbol(library, b"SSL_do_handshake")
    SSL_read_ex = <f_SSL_read_ex>_symbol(library, b"SSL_read_ex")
    SSL_write_ex = <f_SSL_write_ex>_symbol(library, b"SSL_write_ex")
    SSL_shutdown = <f_SSL_shutdown>_symbol(library, b"SSL_shutdown")
    SSL_get_error = <f_SSL_get_error>_symbol(library, b"SSL_get_error")
    SSL_session_reused = <f_SSL_session_reused>_symbol(library, b"SSL_session_reused")
    SSL_is_init_finished = <f_SSL_is_init_finished>_symbol(library, b"SSL_is_init_finished")
    SSL_has_pending = <f_SSL_has_pending>_symbol(library, b"SSL_has_pending")
    SSL_ctrl = <f_SSL_ctrl>_symbol(library, b"SSL_ctrl")
    SSL_set_read_ahead = <f_SSL_set_read_ahead>_symbol(library, b"SSL_set_read_ahead")
    SSL_get_version = <f_SSL_get_version>_symbol(library, b"SSL_get_version")
    SSL_CTX_get_options = <f_SSL_CTX_get_options>_symbol(library, b"SSL_CTX_get_options")
    SSL_CTX_ctrl = <f_SSL_CTX_ctrl>_symbol(library, b"SSL_CTX_ctrl")
    SSL_CTX_up_ref = <f_SSL_CTX_up_ref>_symbol(library, b"SSL_CTX_up_ref")
    SSL_CTX_free = <f_SSL_CTX_free>_symbol(library, b"SSL_CTX_free")
    ERR_clear_error = <f_ERR_clear_error>_symbol(library, b"ERR_clear_error")
    ERR_get_error = <f_ERR_get_error>_symbol(library, b"ERR_get_error")
    ERR_peek_error = <f_ERR_peek_error>_symbol(library, b"ERR_peek_error")
    ERR_error_string_n = <f_ERR_error_string_n>_symbol(library, b"ERR_error_string_n")
    return 0


_bind()


ctypedef struct _PySSLContext:
    # CPython's PySSLContext (Modules/_ssl.c) begins with its SSL_CTX pointer,
    # unchanged from 2.7 to 3.14; _ctx_of checks what it reads.
    PyObject ob_base
    SSL_CTX *ctx


cdef SSL_CTX *_ctx_of(object context) except? NULL:
    """The ``SSL_CTX`` of the ``ssl.SSLContext`` ``context``, or NULL when
    what is read there is not it (other options, another minimum version)."""
    cdef SSL_CTX *ctx = (<_PySSLContext *>context).ctx
    # Python reports OpenSSL's "no minimum" (0) as MINIMUM_SUPPORTED (-2).
    cdef long minimum = max(int(context.minimum_version), 0)
    if ctx == NULL or SSL_CTX_get_options(ctx) != <uint64_t>int(context.options) or (
        SSL_CTX_ctrl(ctx, SSL_CTRL_GET_MIN_PROTO_VERSION, 0, NULL) != minimum
    ):
        return NULL
    return ctx


# A Python whose contexts are laid out otherwise gets the pure twin (an
# ImportError, by notary.extensions' rules), not a notary that cannot start.
_probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
_probe.options |= ssl.OP_NO_COMPRESSION
if _ctx_of(_probe) == NULL:
    raise ImportError("this Python's ssl.SSLContext is not laid out as the TLS driver reads it")
del _probe


#: What ``receive`` reads into (held with the GIL: one reader at a time),
#: copied out at the size read: one TLS record's plaintext at most is 16 KiB,
#: and the callers' reads are 64 KiB.
cdef enum:
    _RECEIVE_BUFFER_BYTES = 65536
cdef char _receive_buffer[_RECEIVE_BUFFER_BYTES]


cdef object _error(unsigned long code, int saved_errno, str what):
    """The exception for a failed call: the queue's first OpenSSL error, or
    the system call's."""
    cdef char text[256]
    if code != 0:
        ERR_error_string_n(code, text, sizeof(text))
        ERR_clear_error()
        return ssl.SSLError(1, f"{what}: {text.decode('ascii', 'replace')}")
    if saved_errno != 0:
        return OSError(saved_errno, os.strerror(saved_errno))
    return ssl.SSLEOFError(8, f"{what}: EOF occurred in violation of protocol")


cdef inline void _clear_errors() noexcept nogil:
    """Empty this thread's OpenSSL error queue before a call whose failure
    ``SSL_get_error`` explains (it reads the queue). ``ERR_clear_error``
    clears all sixteen slots every time (about 800 instructions, twice a
    request); the queue is nearly always empty, which ``ERR_peek_error``
    sees for a fraction of that."""
    if ERR_peek_error() != 0:
        ERR_clear_error()


cdef inline bint _unexpected_eof(unsigned long code) noexcept:
    return (
        code & ERR_SYSTEM_FLAG == 0
        and (code >> 23) & 0xFF == ERR_LIB_SSL
        and code & 0x7FFFFF == SSL_R_UNEXPECTED_EOF_WHILE_READING
    )


cdef class ServerContext:
    """The server side of ``context`` (see the twin)."""

    cdef SSL_CTX *ctx
    cdef readonly object context

    def __cinit__(self, context):
        if not isinstance(context, ssl.SSLContext):
            raise TypeError("an ssl.SSLContext is needed")
        if context.sni_callback is not None or context.keylog_filename is not None or (
            getattr(context, "_msg_callback", None) is not None
        ):
            raise ValueError(
                "the compiled TLS driver cannot run a context with an SNI, keylog or "
                "message callback"
            )
        cdef SSL_CTX *ctx = _ctx_of(context)
        if ctx == NULL:  # checked at import already: only a context of another kind
            raise ValueError("this ssl.SSLContext is not laid out as the TLS driver reads it")
        SSL_CTX_up_ref(ctx)
        self.ctx = ctx
        self.context = context

    def __dealloc__(self):
        if self.ctx != NULL:
            SSL_CTX_free(self.ctx)
            self.ctx = NULL

    def connection(self, sock):
        """A ``Connection`` over ``sock`` (non-blocking; see the twin)."""
        cdef Connection made = Connection.__new__(Connection)
        made._start(self, sock)
        return made


cdef class Connection:
    """One server-side TLS connection (see the twin)."""

    cdef SSL *ssl
    cdef ServerContext server
    cdef readonly object socket

    def __dealloc__(self):
        if self.ssl != NULL:
            SSL_free(self.ssl)
            self.ssl = NULL

    cdef int _start(self, ServerContext server, object sock) except -1:
        cdef int fd = sock.fileno()
        cdef SSL *made = SSL_new(server.ctx)
        if made == NULL:
            raise MemoryError("SSL_new failed")
        if SSL_set_fd(made, fd) != 1:
            SSL_free(made)
            raise _error(ERR_get_error(), 0, "SSL_set_fd")
        SSL_set_accept_state(made)
        SSL_ctrl(
            made, SSL_CTRL_MODE,
            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_AUTO_RETRY | SSL_MODE_RELEASE_BUFFERS,
            NULL,
        )
        SSL_set_read_ahead(made, 1)
        self.ssl = made
        self.server = server
        self.socket = sock
        return 0

    cdef inline SSL *_live(self) except NULL:
        if self.ssl == NULL:
            raise ValueError("the TLS connection is closed")
        return self.ssl

    def handshake(self):
        cdef SSL *tls = self._live()
        _clear_errors()
        cdef int result = SSL_do_handshake(tls)
        if result == 1:
            return 0
        cdef int saved_errno = errno
        cdef int reason = SSL_get_error(tls, result)
        if reason == SSL_ERROR_WANT_READ:
            return _WANT_READ
        if reason == SSL_ERROR_WANT_WRITE:
            return _WANT_WRITE
        raise _error(ERR_get_error(), saved_errno, "handshake")

    def receive(self, Py_ssize_t max_bytes):
        cdef SSL *tls = self._live()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        cdef size_t got = 0
        cdef int result
        _clear_errors()
        if max_bytes > _RECEIVE_BUFFER_BYTES:
            data = PyBytes_FromStringAndSize(NULL, max_bytes)
            result = SSL_read_ex(tls, PyBytes_AS_STRING(data), <size_t>max_bytes, &got)
            if result == 1:
                return data if got == <size_t>max_bytes else data[:got]
        else:
            result = SSL_read_ex(tls, _receive_buffer, <size_t>max_bytes, &got)
            if result == 1:
                return PyBytes_FromStringAndSize(_receive_buffer, got)
        cdef int saved_errno = errno
        cdef int reason = SSL_get_error(tls, result)
        if reason == SSL_ERROR_WANT_READ:
            return _WANT_READ
        if reason == SSL_ERROR_WANT_WRITE:
            return _WANT_WRITE
        if reason == SSL_ERROR_ZERO_RETURN:
            return b""
        cdef unsigned long code = ERR_get_error()
        if reason == SSL_ERROR_SYSCALL and code == 0:
            return b""  # an EOF without close_notify, or a reset: as Python's ssl
        if reason == SSL_ERROR_SSL and _unexpected_eof(code):
            ERR_clear_error()
            return b""  # the same, as OpenSSL 3 reports it
        raise _error(code, saved_errno, "receive")

    def send(self, data):
        cdef SSL *tls = self._live()
        cdef Py_buffer view
        cdef size_t sent = 0
        cdef int result
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if view.len == 0:
                return 0
            _clear_errors()
            result = SSL_write_ex(tls, view.buf, <size_t>view.len, &sent)
        finally:
            PyBuffer_Release(&view)
        if result == 1:
            return <Py_ssize_t>sent
        cdef int saved_errno = errno
        cdef int reason = SSL_get_error(tls, result)
        if reason == SSL_ERROR_WANT_WRITE:
            return _WANT_WRITE
        if reason == SSL_ERROR_WANT_READ:
            return _WANT_READ
        raise _error(ERR_get_error(), saved_errno, "send")

    def pending(self):
        return self.ssl != NULL and SSL_has_pending(self.ssl) == 1

    @property
    def session_reused(self):
        return self.ssl != NULL and SSL_session_reused(self.ssl) == 1

    def version(self):
        if self.ssl == NULL or SSL_is_init_finished(self.ssl) != 1:
            return None
        return SSL_get_version(self.ssl).decode("ascii")

    def close(self):
        cdef SSL *tls = self.ssl
        if tls == NULL:
            return
        self.ssl = NULL
        if SSL_is_init_finished(tls) == 1:
            ERR_clear_error()
            SSL_shutdown(tls)  # one try: close_notify if the socket takes it
            ERR_clear_error()
        SSL_free(tls)

