"""The Trio edge: listeners, connection handlers, the query service and the
store gateway. Trio, ``ssl`` and OpenSSL errors are mapped to
``notary.errors`` types here."""
