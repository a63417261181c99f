# cython: language_level=3, boundscheck=True, wraparound=True
# (Bounds checks stay on here, unlike the cache: this module reads what clients send.)
"""The request path's hot parts, compiled (issues 21, 35): the twin of
``notary.protocol._fastrequest_py``, which is the reference of its behaviour
(the docstrings are there); ``notary.protocol.hotpath`` picks one.

What compiling buys: the reader drives llhttp (the parser httptools wraps,
vendored in ``notary/_vendor/llhttp``) through its C API, so a request's
line, headers and body reach it as C callbacks, not as Python calls; the
form's fingerprint is decoded without a regular expression; the query's
target segment is found and looked up without Python-level slicing calls.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t
from libc.string cimport memchr, memcmp

from notary.errors import ProtocolError
from notary.protocol._fastrequest_py import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
)

cdef bytes _FORM_PREFIX = b"fingerprint="
cdef Py_ssize_t _PREFIX_BYTES = 12
cdef Py_ssize_t _PLAIN_FORM_BYTES = 12 + 59


cdef class Request:
    """One complete HTTP request (see the twin); treat it as immutable."""

    cdef readonly object method
    cdef readonly object target
    cdef readonly object version
    cdef readonly object headers
    cdef readonly object body
    cdef readonly object keep_alive
    cdef readonly object upgrade

    def __init__(self, method, target, version, headers, body, keep_alive, upgrade=False):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.upgrade = upgrade

    def _fields(self):
        return (
            self.method, self.target, self.version, self.headers, self.body,
            self.keep_alive, self.upgrade,
        )

    def __eq__(self, other):
        if type(other) is not Request:
            return NotImplemented
        return self._fields() == (<Request>other)._fields()

    def __ne__(self, other):
        if type(other) is not Request:
            return NotImplemented
        return self._fields() != (<Request>other)._fields()

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        return (
            f"Request(method={self.method!r}, target={self.target!r}, "
            f"version={self.version!r}, headers={self.headers!r}, body={self.body!r}, "
            f"keep_alive={self.keep_alive!r}, upgrade={self.upgrade!r})"
        )

    def header(self, name):
        return first_header(self.headers, name)


def first_header(headers, name):
    name = name.lower()
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


cdef inline bint _is_name(bytes name, const char* lower) noexcept:
    """Whether ``name.lower() == lower`` (same size, ASCII letters folded),
    without making the lowered copy."""
    cdef const unsigned char* text = <const unsigned char*>PyBytes_AS_STRING(name)
    cdef Py_ssize_t at
    cdef unsigned char c
    for at in range(PyBytes_GET_SIZE(name)):
        c = text[at]
        if 65 <= c <= 90:  # A-Z
            c += 32
        if c != <unsigned char>lower[at]:
            return False
    return True


def browser_headers(tuple headers):
    """See the twin."""
    cdef object origin = None, host = None, fetch_site = None
    cdef Py_ssize_t size
    cdef bytes name
    for pair in headers:
        name = <bytes?>(<tuple?>pair)[0]
        size = PyBytes_GET_SIZE(name)
        if size == 6:
            if origin is None and _is_name(name, "origin"):
                origin = (<tuple?>pair)[1]
        elif size == 4:
            if host is None and _is_name(name, "host"):
                host = (<tuple?>pair)[1]
        elif size == 14 and fetch_site is None and _is_name(name, "sec-fetch-site"):
            fetch_site = (<tuple?>pair)[1]
    if origin is None and fetch_site is None:
        return None
    return origin, host, fetch_site


cdef extern from "llhttp.h":
    ctypedef struct llhttp_t:
        void* data
        uint8_t method
        uint8_t http_major
        uint8_t http_minor
        uint8_t upgrade
    ctypedef int (*llhttp_data_cb)(llhttp_t*, const char*, size_t) noexcept
    ctypedef int (*llhttp_cb)(llhttp_t*) noexcept
    ctypedef struct llhttp_settings_t:
        llhttp_cb on_message_begin
        llhttp_data_cb on_url
        llhttp_data_cb on_header_field
        llhttp_data_cb on_header_value
        llhttp_cb on_headers_complete
        llhttp_data_cb on_body
        llhttp_cb on_message_complete
        llhttp_cb on_chunk_header
        llhttp_cb on_chunk_complete
    ctypedef int llhttp_errno_t
    enum:
        HTTP_REQUEST
        HPE_OK
        HPE_PAUSED_UPGRADE
        HPE_USER
        HTTP_GET
        HTTP_POST
    void llhttp_settings_init(llhttp_settings_t* settings)
    void llhttp_init(llhttp_t* parser, int type, const llhttp_settings_t* settings)
    llhttp_errno_t llhttp_execute(llhttp_t* parser, const char* data, size_t length)
    int llhttp_should_keep_alive(const llhttp_t* parser)
    const char* llhttp_get_error_reason(const llhttp_t* parser)
    const char* llhttp_get_error_pos(const llhttp_t* parser)
    const char* llhttp_method_name(int method)


cdef llhttp_settings_t _SETTINGS

cdef enum:
    _MESSAGE_BEGIN
    _URL
    _HEADER_FIELD
    _HEADER_VALUE
    _HEADERS_COMPLETE
    _BODY
    _MESSAGE_COMPLETE
    _CHUNK_HEADER
    _CHUNK_COMPLETE

cdef bytes _GET = b"GET"
cdef bytes _POST = b"POST"
cdef str _HTTP_11 = "1.1"
cdef str _HTTP_10 = "1.0"


cdef class RequestReader:
    """Feed it the bytes of one connection; it returns complete requests
    (see the twin for the error handling).

    The twin reads through httptools; this reader drives the same parser,
    llhttp (vendored: ``notary/_vendor/llhttp``), with C callbacks, and
    keeps httptools' way of reporting a header: a name and value are kept
    until the next name or the end of the head, and a name without a value
    is joined to the next one. The callbacks' order, the bounds and the
    errors are the twin's, byte for byte."""

    cdef llhttp_t _parser
    cdef Py_ssize_t _max_header_bytes
    cdef Py_ssize_t _max_headers
    cdef Py_ssize_t _max_body_bytes
    cdef bint _in_request
    cdef Py_ssize_t _message
    cdef bytes _target
    cdef list _headers
    cdef bytes _body
    cdef Py_ssize_t _head_bytes
    cdef Py_ssize_t _idle_bytes
    cdef bytes _method
    cdef str _version
    cdef bint _keep_alive
    cdef object _name
    cdef object _value
    cdef list _completed
    cdef object _error
    cdef bint _progressed
    cdef bint _blank_lines
    cdef public bint finished
    cdef public bytes leftover

    def __init__(self, *, max_header_bytes=DEFAULT_MAX_HEADER_BYTES,
                 max_headers=DEFAULT_MAX_HEADERS, max_body_bytes=DEFAULT_MAX_BODY_BYTES):
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._max_body_bytes = max_body_bytes
        llhttp_init(&self._parser, HTTP_REQUEST, &_SETTINGS)
        self._parser.data = <void*>self
        self._in_request = False
        self._message = 0
        self._new_request()
        self._name = None
        self._value = None
        self._completed = []
        self._error = None
        self._progressed = False
        self._blank_lines = False
        self.finished = False
        self.leftover = b""

    @property
    def in_request(self):
        return self._in_request or self._blank_lines

    def feed(self, data):
        cdef bint in_request_before
        cdef Py_ssize_t message_before
        cdef list done
        cdef Py_buffer view
        cdef llhttp_errno_t status
        cdef Py_ssize_t offset
        if self.finished or not data:
            return []
        in_request_before = self._in_request
        message_before = self._message
        self._progressed = False
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            status = llhttp_execute(&self._parser, <const char*>view.buf, view.len)
            if status == HPE_PAUSED_UPGRADE:
                offset = llhttp_get_error_pos(&self._parser) - <const char*>view.buf
        finally:
            PyBuffer_Release(&view)
        if status != HPE_OK:
            self.finished = True
            if status == HPE_PAUSED_UPGRADE and self._parser.upgrade == 1:
                self.leftover = bytes(data[offset:])
            else:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                last = self._completed[-1] if self._completed else None
                if last is None or last.keep_alive:
                    reason = _error_reason(&self._parser)
                    if reason == "Invalid HTTP version":
                        raise ProtocolError("HTTP version not supported", status=505)
                    raise ProtocolError(f"malformed request: {reason[:80]}")
        if self._in_request:
            if in_request_before and self._message == message_before and not self._progressed:
                self._idle_bytes += len(data)
                if self._idle_bytes > self._max_header_bytes:
                    self.finished = True
                    raise ProtocolError("request header too large", status=431)
            else:
                self._idle_bytes = 0
        elif self._message == message_before and not self._completed:
            self._blank_lines = True
        done = self._completed
        if done:
            self._completed = []
            last = done[-1]
            if not last.keep_alive or last.upgrade:
                self.finished = True
        return done

    # -- the parser's events (the twin's httptools callbacks, in its order)

    cdef int _event(self, int event) noexcept:
        """llhttp's ``event`` without data: 0, or HPE_USER with the exception
        kept for ``feed``."""
        try:
            if event == _MESSAGE_BEGIN:
                self._message_begin()
            elif event == _HEADERS_COMPLETE:
                self._headers_complete()
            elif event == _MESSAGE_COMPLETE:
                self._message_complete()
            elif event == _CHUNK_HEADER:
                self._chunk_header()
            else:  # _CHUNK_COMPLETE: as httptools, report a trailer kept
                self._pending_header()
        except BaseException as error:
            self._error = error
            return HPE_USER
        return 0

    cdef int _data(self, int event, const char* at, size_t length) noexcept:
        """llhttp's ``event`` with the bytes ``at``: as ``_event``."""
        try:
            data = PyBytes_FromStringAndSize(at, length)
            if event == _URL:
                self._url(data)
            elif event == _HEADER_FIELD:
                self._header_field(data)
            elif event == _HEADER_VALUE:
                self._header_value(data)
            else:  # _BODY
                self._body_part(data)
        except BaseException as error:
            self._error = error
            return HPE_USER
        return 0

    cdef inline void _new_request(self):
        self._target = b""
        self._headers = []
        self._body = b""
        self._head_bytes = 0
        self._idle_bytes = 0
        self._method = b""
        self._version = _HTTP_11
        self._keep_alive = True

    cdef _message_begin(self):
        self._progressed = True
        self._in_request = True
        self._blank_lines = False
        self._message += 1
        self._new_request()

    cdef _url(self, bytes url):
        self._progressed = True
        # Nearly always one piece: keep it, not a concatenation with b"" (+= on
        # bytes costs ~500 instructions more per request here).
        self._target = url if not self._target else self._target + url
        self._head_bytes += len(url)
        if self._head_bytes > self._max_header_bytes:
            raise ProtocolError("request header too large", status=431)

    cdef _header_field(self, bytes field):
        self._pending_header()
        self._name = field if self._name is None else self._name + field

    cdef _header_value(self, bytes value):
        self._value = value if self._value is None else self._value + value

    cdef _pending_header(self):
        """httptools' ``_maybe_call_on_header``: report the header kept,
        once it has a value."""
        if self._value is None:
            return
        name, value = self._name, self._value
        self._name = self._value = None
        self._progressed = True
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self._max_header_bytes:
            raise ProtocolError("request header too large", status=431)
        if len(self._headers) >= self._max_headers:
            raise ProtocolError("too many header fields", status=431)
        self._headers.append((name, value))

    cdef _headers_complete(self):
        cdef int major, minor, method
        self._pending_header()
        self._progressed = True
        major, minor = self._parser.http_major, self._parser.http_minor
        if major == 1 and minor == 1:
            self._version = _HTTP_11
        elif major == 1 and minor == 0:
            self._version = _HTTP_10
        elif major == 0 and minor == 9:  # the twin's _NO_VERSION
            raise ProtocolError("malformed request: no HTTP version")
        else:
            raise ProtocolError("HTTP version not supported", status=505)
        method = self._parser.method
        if method == HTTP_GET:
            self._method = _GET
        elif method == HTTP_POST:
            self._method = _POST
        else:
            self._method = <bytes>llhttp_method_name(method)
        self._keep_alive = llhttp_should_keep_alive(&self._parser)

    cdef _body_part(self, bytes body):
        self._progressed = True
        if len(self._body) + len(body) > self._max_body_bytes:
            raise ProtocolError("request body too large", status=413)
        self._body = body if not self._body else self._body + body  # as _url

    cdef _message_complete(self):
        cdef Request request
        cdef bint upgrade = self._parser.upgrade != 0
        self._progressed = True
        self._in_request = False
        request = Request.__new__(Request)
        request.method = self._method
        request.target = self._target
        request.version = self._version
        request.headers = tuple(self._headers)
        request.body = self._body
        request.keep_alive = self._keep_alive and not upgrade
        request.upgrade = upgrade
        self._completed.append(request)

    cdef _chunk_header(self):
        # httptools refuses a chunk while a header is kept; llhttp reports
        # trailers only after the last chunk, so this cannot happen.
        if self._name is not None or self._value is not None:
            raise ProtocolError("malformed request: invalid headers state")


cdef str _error_reason(llhttp_t* parser):
    """llhttp's reason for its error: the text of httptools' exception. llhttp
    words every parse error; should one come without, the twin falls back on
    the exception's class name, and this on the base class's."""
    cdef const char* reason = llhttp_get_error_reason(parser)
    if reason == NULL or reason[0] == 0:
        return "HttpParserError"
    return (<bytes>reason).decode("latin-1")


# llhttp's callbacks: each hands its event to the reader (``_event``,
# ``_data``), which keeps its exception (a ProtocolError) for ``feed``.

cdef int _on_message_begin(llhttp_t* parser) noexcept:
    return (<RequestReader>parser.data)._event(_MESSAGE_BEGIN)


cdef int _on_url(llhttp_t* parser, const char* at, size_t length) noexcept:
    return (<RequestReader>parser.data)._data(_URL, at, length)


cdef int _on_header_field(llhttp_t* parser, const char* at, size_t length) noexcept:
    return (<RequestReader>parser.data)._data(_HEADER_FIELD, at, length)


cdef int _on_header_value(llhttp_t* parser, const char* at, size_t length) noexcept:
    return (<RequestReader>parser.data)._data(_HEADER_VALUE, at, length)


cdef int _on_headers_complete(llhttp_t* parser) noexcept:
    cdef int result = (<RequestReader>parser.data)._event(_HEADERS_COMPLETE)
    # As httptools: an upgrade's head ends its request (a body it announces
    # is the new protocol's first bytes).
    return 1 if result == 0 and parser.upgrade else result


cdef int _on_body(llhttp_t* parser, const char* at, size_t length) noexcept:
    return (<RequestReader>parser.data)._data(_BODY, at, length)


cdef int _on_message_complete(llhttp_t* parser) noexcept:
    return (<RequestReader>parser.data)._event(_MESSAGE_COMPLETE)


cdef int _on_chunk_header(llhttp_t* parser) noexcept:
    return (<RequestReader>parser.data)._event(_CHUNK_HEADER)


cdef int _on_chunk_complete(llhttp_t* parser) noexcept:
    return (<RequestReader>parser.data)._event(_CHUNK_COMPLETE)


llhttp_settings_init(&_SETTINGS)
_SETTINGS.on_message_begin = _on_message_begin
_SETTINGS.on_url = _on_url
_SETTINGS.on_header_field = _on_header_field
_SETTINGS.on_header_value = _on_header_value
_SETTINGS.on_headers_complete = _on_headers_complete
_SETTINGS.on_body = _on_body
_SETTINGS.on_message_complete = _on_message_complete
_SETTINGS.on_chunk_header = _on_chunk_header
_SETTINGS.on_chunk_complete = _on_chunk_complete


# -- Convergence queries


cdef inline int _hex_value(unsigned char c) noexcept:
    if 48 <= c <= 57:  # 0-9
        return c - 48
    if 65 <= c <= 70:  # A-F
        return c - 55
    if 97 <= c <= 102:  # a-f
        return c - 87
    return -1


def plain_form_fingerprint(bytes body):
    """See the twin."""
    cdef const unsigned char* text
    cdef unsigned char digest[20]
    cdef Py_ssize_t at = _PREFIX_BYTES
    cdef int pair, high, low
    if PyBytes_GET_SIZE(body) != _PLAIN_FORM_BYTES:
        return None
    text = <const unsigned char*>PyBytes_AS_STRING(body)
    if memcmp(text, PyBytes_AS_STRING(_FORM_PREFIX), _PREFIX_BYTES) != 0:
        return None
    for pair in range(20):
        if pair and text[at - 1] != 58:  # ':'
            return None
        high = _hex_value(text[at])
        low = _hex_value(text[at + 1])
        if high < 0 or low < 0:
            return None
        digest[pair] = <unsigned char>((high << 4) | low)
        at += 3
    return PyBytes_FromStringAndSize(<char*>digest, 20)


cdef class ConvergenceQueries:
    """See the twin."""

    cdef Py_ssize_t _prefix_bytes
    cdef Py_ssize_t _max_target_bytes
    cdef Py_ssize_t _max_entries
    cdef object _parse_segment
    cdef object _parse_form
    cdef dict _memo

    def __init__(self, *, bytes prefix, max_target_bytes, max_entries, parse_segment,
                 parse_form):
        self._prefix_bytes = len(prefix)
        self._max_target_bytes = max_target_bytes
        self._max_entries = max_entries
        self._parse_segment = parse_segment
        self._parse_form = parse_form
        self._memo = {}

    def parse(self, bytes method, bytes path, bytes body):
        cdef Py_ssize_t size = PyBytes_GET_SIZE(path) - self._prefix_bytes
        cdef const char* start
        cdef const char* found
        cdef const char* slash
        if size < 0:
            size = 0
        start = PyBytes_AS_STRING(path) + self._prefix_bytes
        found = <const char*>memchr(start, 63, size)  # '?'
        if found != NULL:
            size = found - start
        if size > self._max_target_bytes:
            raise ProtocolError("target too long", status=414)
        slash = <const char*>memchr(start, 47, size)  # '/'
        if slash != NULL:
            size = slash - start
        segment = PyBytes_FromStringAndSize(start, size)
        target = self._memo.get(segment)
        if target is None:
            target = self._parse_segment(segment)
            if len(self._memo) >= self._max_entries:
                self._memo.clear()
            self._memo[segment] = target
        if method == b"POST":
            fingerprint = plain_form_fingerprint(body)
            if fingerprint is None:
                fingerprint = self._parse_form(body)
            return target, fingerprint
        return target, None

    def __len__(self):
        return len(self._memo)

    def __contains__(self, segment):
        return segment in self._memo
