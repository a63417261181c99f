"""A PostgreSQL database named without its password: the dsn ``[store]
dsn`` gives (libpq keywords or a URL) checked before any connection is
tried, and the words every message about the database uses.

No message says the password: a dsn libpq cannot read (its parse errors
quote the dsn), or reads otherwise than written (``check_dsn``), is
refused with a fixed message (``INVALID_DSN``), and every form the
password may take (as written, percent-encoded or not, as libpq reads it,
after ``password=``) is replaced by ``***`` in whatever else is said
(``redacted``).

Pure: psycopg's parser (``psycopg.conninfo``) is imported when a function
is called, never at import (a SQLite-only install does not need it).
"""

from __future__ import annotations

import re
from contextlib import suppress
from urllib.parse import unquote

__all__ = ["INVALID_DSN", "check_dsn", "describe_dsn", "redacted"]

#: What a dsn ``check_dsn`` refuses is, in words quoting none of it.
INVALID_DSN = "not a valid libpq connection string or URL"
_URL_SCHEMES = ("postgresql://", "postgres://")
#: ``password=VALUE`` (keywords, or a URL's parameter): quoted, or up to a space or '&'.
_PASSWORD_KEYWORD = re.compile(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^\s&]+))")


def check_dsn(dsn: str) -> None:
    """Raise ``ValueError`` (its message: ``INVALID_DSN``, quoting nothing
    of ``dsn``) if libpq cannot read ``dsn``, or would read a URL otherwise
    than written: an unencoded '@' or '/' in its password (or user, or
    database) moves the rest into the host name or the port, where it is
    looked up and named in errors. Such a URL has two '@' before its
    parameters ('?'), or a '/' before its '@', or a host or port with '@'."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        raise ValueError(INVALID_DSN) from None
    if dsn.startswith(_URL_SCHEMES):
        before_parameters = dsn.partition("://")[2].partition("?")[0]
        userinfo, at, _ = before_parameters.partition("@")
        if (
            before_parameters.count("@") > 1 or (at and "/" in userinfo)
            or "@" in str(parts.get("host") or "") or "@" in str(parts.get("port") or "")
        ):
            raise ValueError(
                f"{INVALID_DSN} (a URL percent-encodes '@' and '/' in its user, "
                "password and database)"
            )


def describe_dsn(dsn: str) -> str:
    """``dsn`` for messages: user, host, port and database, never the
    password (``postgresql (invalid dsn)`` for one ``check_dsn`` refuses)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        check_dsn(dsn)
    except ValueError:
        return "postgresql (invalid dsn)"
    parts = conninfo_to_dict(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return redacted(f"postgresql://{user}{host}{port}/{parts.get('dbname', '')}", dsn)


def _url_password(dsn: str) -> str | None:
    """A URL's password as written: from the ':' after the user to the last
    '@' (as a browser reads it); None if the dsn is no URL or has none."""
    if not dsn.startswith(_URL_SCHEMES):
        return None
    userinfo, at, _ = dsn.partition("://")[2].rpartition("@")
    _, colon, password = userinfo.partition(":")
    return password if at and colon else None


def redacted(text: str, dsn: str) -> str:
    """``text`` with each form ``dsn``'s password may take replaced by ``***``:
    as libpq reads it, as written in a URL (percent-encoded or not), and
    after ``password=`` (quoted or not), whether libpq can read ``dsn`` or
    not."""
    from psycopg.conninfo import conninfo_to_dict

    forms: set[str] = set()
    with suppress(Exception):  # libpq cannot read it: the forms below
        forms.add(str(conninfo_to_dict(dsn).get("password") or ""))
    written = _url_password(dsn)
    if written is not None:
        forms |= {written, unquote(written)}
    for match in _PASSWORD_KEYWORD.finditer(dsn):
        value = match.group(1) if match.group(1) is not None else match.group(2)
        forms |= {value, unquote(value), re.sub(r"\\(.)", r"\1", value)}
    for form in sorted(forms - {""}, key=len, reverse=True):
        text = text.replace(form, "***")
    return text
