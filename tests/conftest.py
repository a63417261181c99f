"""Fixtures every test module may use: ``engine`` (each store engine in
turn) and ``postgres_store`` (each PostgreSQL store in turn:
``tests.support.engines``), ``postgres_server`` (``tests.support.postgres``);
and, for every test, the root logger as it was before it."""

import logging
from collections.abc import Iterator

import pytest

# Helpers moved out of test modules keep pytest's detailed assertion
# messages; registered before the first import of tests.support.
pytest.register_assert_rewrite("tests.support")

from tests.support.engines import engine, postgres_store  # noqa: E402
from tests.support.postgres import postgres_server  # noqa: E402

__all__ = ["engine", "postgres_server", "postgres_store"]


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
