"""Fixtures every test module may use: ``engine`` (each store engine in
turn), ``pg_server`` and ``postgres_server`` (``tests.support.postgres``)."""

from tests.support.postgres import engine, pg_server, postgres_server

__all__ = ["engine", "pg_server", "postgres_server"]
