"""SQL that takes a SQLite store of today's schema back to an older one, for
the migration tests: run it with ``executescript`` on a store's database,
then set ``user_version`` to the older schema's number and reopen the store
to migrate it again."""

#: Undoes migration 4 (a database of schema 3 from one of today's).
DOWNGRADE_TO_3 = """
    DROP TABLE probe_claims; DROP TABLE changes; DROP TABLE settings; DROP INDEX targets_by_asked_at; DROP INDEX observations_by_certificate;
    DROP INDEX runs_by_certificate; ALTER TABLE targets DROP COLUMN asked_at;
"""

