"""Logging of the server processes: one handler on the root logger writing
one line per event to stderr (the journal, under systemd), in one of three
formats (``[server] log_format``):

``text``
    For people: ``2024-05-01 12:00:00,123 INFO notary.server: listening``;
    extra fields follow the message as ``key=value``; a traceback spans the
    lines after it.
``json``
    One object per line: ``time`` (ISO-8601, UTC, milliseconds, ``Z``),
    ``level`` (lower case), ``logger``, ``message``, then ``worker`` when
    set, the fields passed with ``extra=``, and ``exception`` / ``stack``
    (the traceback as one string). ASCII only, so no character can split a
    line whatever a reader counts as a line break.
``logfmt``
    ``time=... level=info logger=notary.server msg="..." worker=2 ...``, the
    same fields. A value with a space, ``=``, ``"``, ``\\``, a control
    character or a Unicode line break is quoted, and its escapes are JSON's
    (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``): a quoted value is a JSON string.

An extra field named like a built-in one (``time``, ``level``, ...) is
written as ``extra_<name>`` rather than replacing it.

Ownership: ``configure_logging`` owns the one handler it installs (marked,
so a second call replaces it instead of adding another); other handlers on
the root logger are left alone. The stream stays the caller's (never
closed). The worker index is process-wide state, set by each worker after it
starts (``set_worker``).

Error handling: ``configure_logging`` raises ``UsageError`` for an unknown
level or format. While formatting, a field that cannot be serialised is
written as its ``str()``; the ``logging`` module's own ``handleError``
reports anything else, never the caller.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import re
import sys
from typing import Any, TextIO

from notary.errors import UsageError

LOG_FORMATS = ("text", "json", "logfmt")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: The human format ``notary serve`` has always used.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_TEXT_WORKER_FORMAT = "%(asctime)s %(levelname)s %(name)s (worker %(worker)s): %(message)s"

_worker: int | None = None

# Every attribute a LogRecord has of its own; the rest came from extra=.
_RECORD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None))
) | {"message", "asctime", "taskName"}
_RESERVED = frozenset({"time", "level", "logger", "message", "msg", "worker", "exception", "stack"})
_LOGFMT_KEY_INVALID = re.compile(r"[^A-Za-z0-9_.\-/]")
# Quote a logfmt value holding any of these; \x85 and \u2028/9 count as line
# breaks for str.splitlines() and some log readers.
_LOGFMT_NEEDS_QUOTES = re.compile(r'[\s="\\\x00-\x1f\x7f\x85\u2028\u2029]')


def set_worker(index: int | None) -> None:
    """Tag every later line of this process with ``worker=index`` (None:
    untag, as in the supervisor)."""
    global _worker
    _worker = index


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in vars(record).items():
        if key in _RECORD_ATTRIBUTES or key.startswith("_"):
            continue
        fields[f"extra_{key}" if key in _RESERVED else key] = value
    return fields


def _utc_time(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _StructuredFormatter(logging.Formatter):
    """The fields of one record, in order, for the json and logfmt lines."""

    message_key = "message"

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "time": _utc_time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            self.message_key: record.getMessage(),
        }
        if _worker is not None:
            fields["worker"] = _worker
        fields.update(_extra_fields(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            fields["exception"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return fields


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, default=str, allow_nan=False)
    except (TypeError, ValueError):  # NaN, a cycle, a key that is not a string
        return str(value)
    return value


class JsonFormatter(_StructuredFormatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {key: _jsonable(value) for key, value in self.fields(record).items()}
        return json.dumps(fields, default=str, allow_nan=False)


def _logfmt_key(key: str) -> str:
    return _LOGFMT_KEY_INVALID.sub("_", key) or "_"


def logfmt_value(value: Any) -> str:
    """``value`` as a logfmt value: bare when it can be, else a quoted JSON
    string (``None`` is ``null``, booleans ``true``/``false``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)
    text = str(value)
    if text and not _LOGFMT_NEEDS_QUOTES.search(text):
        return text
    quoted = json.dumps(text)  # escapes quotes, backslashes, control characters
    return quoted.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace(
        "\x85", "\\u0085"
    )


class LogfmtFormatter(_StructuredFormatter):
    """``key=value`` pairs, one record per line."""

    message_key = "msg"

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(
            f"{_logfmt_key(key)}={logfmt_value(value)}"
            for key, value in self.fields(record).items()
        )


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, with ``(worker N)`` after the logger name when set
    and extra fields after the message."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        if _worker is None:
            line = super().formatMessage(record)
        else:
            line = _TEXT_WORKER_FORMAT % {**vars(record), "worker": _worker}
        extra = _extra_fields(record)
        if extra:
            pairs = " ".join(f"{_logfmt_key(k)}={logfmt_value(v)}" for k, v in extra.items())
            line = f"{line} {pairs}"
        return line


_FORMATTERS: dict[str, type[logging.Formatter]] = {
    "text": TextFormatter,
    "json": JsonFormatter,
    "logfmt": LogfmtFormatter,
}


def configure_logging(level: str, fmt: str, *, stream: TextIO | None = None) -> None:
    """Send the root logger's records at ``level`` and above to ``stream``
    (default: ``sys.stderr`` as it is now) in format ``fmt``
    (``LOG_FORMATS``). Calling it again replaces the handler it installed
    before (a reload may change the level or the format)."""
    if level.lower() not in LOG_LEVELS:
        raise UsageError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    if fmt not in _FORMATTERS:
        raise UsageError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_notary_logs", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler._notary_logs = True  # type: ignore[attr-defined]
    handler.setFormatter(_FORMATTERS[fmt]())
    root.addHandler(handler)
    root.setLevel(level.upper())
