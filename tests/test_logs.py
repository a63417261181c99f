"""notary.logs: each format's lines parsed back, escaping, idempotence, the
worker field."""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from notary import logs
from notary.errors import UsageError
from notary.logs import configure_logging, logfmt_value, set_worker

log = logging.getLogger("notary.test")

_LOGFMT_PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?:\s+|$)')


def parse_logfmt(line: str) -> dict[str, str]:
    """A strict logfmt parser: the whole line must be ``key=value`` pairs;
    quoted values are JSON strings (as notary.logs writes them)."""
    fields, position = {}, 0
    while position < len(line):
        match = _LOGFMT_PAIR.match(line, position)
        assert match, f"not logfmt at {position}: {line[position:]!r}"
        key, value = match.groups()
        fields[key] = json.loads(value) if value.startswith('"') else value
        position = match.end()
    return fields


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    set_worker(None)


def lines_of(fmt: str, emit, level: str = "info") -> list[str]:
    stream = io.StringIO()
    configure_logging(level, fmt, stream=stream)
    emit()
    return stream.getvalue().splitlines()


def raise_and_log() -> None:
    try:
        raise RuntimeError('bad "thing"\nsecond line')
    except RuntimeError:
        log.exception("probe failed")


def test_json_is_one_object_per_line_with_the_fields() -> None:
    def emit() -> None:
        log.info("listening on %s", "[::]:443", extra={"workers": 4, "target": "a b"})
        log.debug("not shown at info")
        raise_and_log()

    info, error = (json.loads(line) for line in lines_of("json", emit))
    assert list(info)[:4] == ["time", "level", "logger", "message"]
    assert info["level"] == "info"
    assert info["logger"] == "notary.test"
    assert info["message"] == "listening on [::]:443"
    assert (info["workers"], info["target"]) == (4, "a b")
    moment = datetime.datetime.fromisoformat(info["time"].replace("Z", "+00:00"))
    assert moment.utcoffset() == datetime.timedelta(0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", info["time"])
    assert abs((datetime.datetime.now(datetime.UTC) - moment).total_seconds()) < 60
    assert "worker" not in info
    assert error["level"] == "error"
    assert error["exception"].startswith("Traceback (most recent call last):\n")
    assert error["exception"].endswith('RuntimeError: bad "thing"\nsecond line')


def test_json_survives_values_json_cannot_hold() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    def emit() -> None:
        cycle: list = []
        cycle.append(cycle)
        log.warning("odd extras", extra={
            "nan": float("nan"), "obj": Opaque(), "cycle": cycle, "keys": {1: "a"},
            "nested": {"ok": [1, 2]},
        })

    (line,) = lines_of("json", emit)
    fields = json.loads(line)
    assert fields["nan"] == "nan"
    assert fields["obj"] == "opaque"
    assert fields["cycle"] == "[[...]]"
    assert fields["keys"] == {"1": "a"}
    assert fields["nested"] == {"ok": [1, 2]}


def test_json_is_ascii_so_no_character_breaks_a_line() -> None:
    (line,) = lines_of("json", lambda: log.info("caf\u00e9\u2028next\x85line\r"))
    assert line.isascii()
    assert json.loads(line)["message"] == "caf\u00e9\u2028next\x85line\r"


def test_logfmt_quotes_and_escapes_what_it_must() -> None:
    message = 'say "hi"\nto C:\\temp = 1\ttab\u2028ls'

    def emit() -> None:
        log.warning(message, extra={"empty": "", "flag": True, "none": None, "n": 2.5,
                                    "bad key": "x"})
        raise_and_log()

    warning, error = lines_of("logfmt", emit)
    fields = parse_logfmt(warning)
    assert list(fields)[:4] == ["time", "level", "logger", "msg"]
    assert fields["level"] == "warning"
    assert fields["logger"] == "notary.test"
    assert fields["msg"] == message
    assert (fields["empty"], fields["flag"], fields["none"], fields["n"]) == ("", "true", "null", "2.5")
    assert fields["bad_key"] == "x"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["time"])
    error_fields = parse_logfmt(error)
    assert error_fields["msg"] == "probe failed"
    assert error_fields["exception"].endswith('RuntimeError: bad "thing"\nsecond line')


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("plain", "plain"),
        ("", '""'),
        ("a b", '"a b"'),
        ("k=v", '"k=v"'),
        ('q"', '"q\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("bell\x07", '"bell\\u0007"'),
        ("sep\u2028", '"sep\\u2028"'),
        ("nel\x85", '"nel\\u0085"'),
        ("caf\u00e9", "caf\u00e9"),
        (3, "3"),
        (False, "false"),
        (float("inf"), "inf"),
    ],
)
def test_logfmt_values(value: object, written: str) -> None:
    assert logfmt_value(value) == written


def test_text_keeps_the_human_format() -> None:
    lines = lines_of("text", lambda: (log.info("hello"), raise_and_log()))
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO notary\.test: hello", lines[0]
    )
    assert lines[1].endswith(" ERROR notary.test: probe failed")
    assert lines[2] == "Traceback (most recent call last):"  # tracebacks span lines here
    assert lines[-1] == "second line"


def test_text_appends_extra_fields() -> None:
    (line,) = lines_of("text", lambda: log.info("stopped", extra={"rows": 3, "why": "a b"}))
    assert line.endswith('notary.test: stopped rows=3 why="a b"')


def test_an_extra_field_cannot_replace_a_built_in_one() -> None:
    (line,) = lines_of("json", lambda: log.info("x", extra={"level": "fake", "time": 1}))
    fields = json.loads(line)
    assert (fields["level"], fields["extra_level"], fields["extra_time"]) == ("info", "fake", 1)


@pytest.mark.parametrize("fmt", ["json", "logfmt", "text"])
def test_the_worker_index_tags_every_line(fmt: str) -> None:
    set_worker(3)
    (line,) = lines_of(fmt, lambda: log.info("serving"))
    if fmt == "json":
        assert json.loads(line)["worker"] == 3
    elif fmt == "logfmt":
        assert parse_logfmt(line)["worker"] == "3"
    else:
        assert line.endswith(" INFO notary.test (worker 3): serving")
    set_worker(None)
    (line,) = lines_of(fmt, lambda: log.info("supervisor"))
    assert "worker" not in line


def test_configuring_twice_replaces_the_handler() -> None:
    root = logging.getLogger()
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "text", stream=first)
    configure_logging("warning", "json", stream=second)
    ours = [h for h in root.handlers if getattr(h, "_notary_logs", False)]
    assert len(ours) == 1
    log.info("dropped at warning")
    log.warning("once")
    assert first.getvalue() == ""
    assert [json.loads(line)["message"] for line in second.getvalue().splitlines()] == ["once"]
    assert root.level == logging.WARNING


def test_other_handlers_are_left_alone() -> None:
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    configure_logging("info", "logfmt", stream=io.StringIO())
    configure_logging("info", "logfmt", stream=io.StringIO())
    assert other in root.handlers


def test_level_names_are_case_insensitive() -> None:
    assert lines_of("json", lambda: log.debug("shown"), level="DEBUG") != []


@pytest.mark.parametrize(("level", "fmt", "message"), [
    ("verbose", "text", "log level must be one of"),
    ("info", "yaml", "log format must be one of"),
])
def test_unknown_level_or_format_is_a_usage_error(level: str, fmt: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        configure_logging(level, fmt)


def test_the_formats_match_the_config_choices() -> None:
    from notary import config

    assert logs.LOG_FORMATS == config._LOG_FORMATS
    assert set(config._LOG_LEVELS) <= set(logs.LOG_LEVELS)
