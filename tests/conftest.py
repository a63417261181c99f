"""Fixtures every test module may use: ``engine`` (each store engine in
turn) and ``postgres_store`` (each PostgreSQL store in turn:
``tests.support.engines``), ``postgres_server`` (``tests.support.postgres``);
``autojump_clock`` (pytest-trio's, made patient); and, for every test, the
root logger as it was before it."""

import logging
from collections.abc import Iterator

import pytest
import trio.testing

# Helpers moved out of test modules keep pytest's detailed assertion
# messages; registered before the first import of tests.support.
pytest.register_assert_rewrite("tests.support")

from tests.support.engines import engine, postgres_store  # noqa: E402
from tests.support.faults import WORKER_THREAD_S  # noqa: E402
from tests.support.postgres import postgres_server  # noqa: E402

__all__ = ["autojump_clock", "engine", "postgres_server", "postgres_store"]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """pytest-trio's ``autojump_clock``, but jumping only after
    ``WORKER_THREAD_S`` of idleness, not at once: a notary under test works
    in threads (its store, its key), and a clock jumping from deadline to
    deadline meanwhile runs those deadlines out (a relay test once saw 240
    virtual seconds pass while a thread worked on a loaded machine)."""
    return trio.testing.MockClock(autojump_threshold=WORKER_THREAD_S)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that runs a command (``notary.cli.main``) configures logging
    (``notary.logs.configure_logging``: the root logger's level and a
    handler): put both back, or a later test's ``caplog`` misses records
    below that level."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in root.handlers[:]:
        if getattr(handler, "_notary_logs", False) and handler not in handlers:
            root.removeHandler(handler)
