# cython: language_level=3, boundscheck=True, wraparound=True
# (Bounds checks stay on here, unlike the cache: this module reads what clients send.)
"""The request path's hot parts, compiled (issue 21): the twin of
``notary.protocol._fastrequest_py``, which is the reference of its behaviour
(the docstrings are there); ``notary.protocol.hotpath`` picks one.

What compiling buys: httptools calls the reader's callbacks for every
request line, header and body, and each is a C function here; the form's
fingerprint is decoded without a regular expression; the query's target
segment is found and looked up without Python-level slicing calls.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp

import httptools

from notary.errors import ProtocolError
from notary.protocol._fastrequest_py import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
)

cdef str _NO_VERSION = "0.9"
cdef bytes _FORM_PREFIX = b"fingerprint="
cdef Py_ssize_t _PREFIX_BYTES = 12
cdef Py_ssize_t _PLAIN_FORM_BYTES = 12 + 59
cdef object _Upgrade = httptools.HttpParserUpgrade
cdef object _CallbackError = httptools.HttpParserCallbackError
cdef object _ParserError = httptools.HttpParserError


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


def browser_headers(tuple headers):
    """See the twin."""
    cdef object origin = None, host = None, fetch_site = None
    cdef Py_ssize_t size
    cdef bytes name
    for pair in headers:
        name = <bytes?>(<tuple?>pair)[0]
        size = PyBytes_GET_SIZE(name)
        if size == 6:
            if origin is None and name.lower() == b"origin":
                origin = (<tuple?>pair)[1]
        elif size == 4:
            if host is None and name.lower() == b"host":
                host = (<tuple?>pair)[1]
        elif size == 14 and fetch_site is None and name.lower() == b"sec-fetch-site":
            fetch_site = (<tuple?>pair)[1]
    if origin is None and fetch_site is None:
        return None
    return origin, host, fetch_site


cdef class RequestReader:
    """Feed it the bytes of one connection; it returns complete requests
    (see the twin for the error handling)."""

    cdef Py_ssize_t _max_header_bytes
    cdef Py_ssize_t _max_headers
    cdef Py_ssize_t _max_body_bytes
    cdef object _parser
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
        self._parser = httptools.HttpRequestParser(self)
        self._in_request = False
        self._message = 0
        self._new_request()
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
        if self.finished or not data:
            return []
        in_request_before = self._in_request
        message_before = self._message
        self._progressed = False
        try:
            self._parser.feed_data(data)
        except _Upgrade as upgrade:
            self.finished = True
            offset = upgrade.args[0] if upgrade.args else len(data)
            self.leftover = bytes(data[offset:])
        except _CallbackError:
            self.finished = True
            error, self._error = self._error, None
            if error is None:
                raise
            raise error from None
        except _ParserError as exc:
            self.finished = True
            last = self._completed[-1] if self._completed else None
            if last is None or last.keep_alive:
                if str(exc) == "Invalid HTTP version":
                    raise ProtocolError("HTTP version not supported", status=505) from None
                raise ProtocolError(f"malformed request: {_reason(exc)}") from None
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

    # -- httptools callbacks

    cdef inline void _new_request(self):
        self._target = b""
        self._headers = []
        self._body = b""
        self._head_bytes = 0
        self._idle_bytes = 0
        self._method = b""
        self._version = "1.1"
        self._keep_alive = True

    def on_message_begin(self):
        self._progressed = True
        self._in_request = True
        self._blank_lines = False
        self._message += 1
        self._new_request()

    def on_url(self, bytes url):
        self._progressed = True
        self._target += url
        self._head_bytes += len(url)
        if self._head_bytes > self._max_header_bytes:
            self._fail(ProtocolError("request header too large", status=431))

    def on_header(self, bytes name, bytes value):
        self._progressed = True
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self._max_header_bytes:
            self._fail(ProtocolError("request header too large", status=431))
        if len(self._headers) >= self._max_headers:
            self._fail(ProtocolError("too many header fields", status=431))
        self._headers.append((name, value))

    def on_headers_complete(self):
        self._progressed = True
        parser = self._parser
        version = self._version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            if version == _NO_VERSION:
                self._fail(ProtocolError("malformed request: no HTTP version"))
            self._fail(ProtocolError("HTTP version not supported", status=505))
        self._method = parser.get_method()
        self._keep_alive = parser.should_keep_alive()

    def on_body(self, bytes body):
        self._progressed = True
        if len(self._body) + len(body) > self._max_body_bytes:
            self._fail(ProtocolError("request body too large", status=413))
        self._body += body

    def on_message_complete(self):
        self._progressed = True
        self._in_request = False
        upgrade = bool(self._parser.should_upgrade())
        self._completed.append(
            Request(
                self._method,
                self._target,
                self._version,
                tuple(self._headers),
                self._body,
                self._keep_alive and not upgrade,
                upgrade,
            )
        )

    cdef _fail(self, error):
        self._error = error
        raise error


def _reason(exc):
    text = str(exc) or type(exc).__name__
    return text[:80]


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
