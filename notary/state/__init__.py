"""Synchronous state: the fingerprint cache (compiled and pure twins), the SQLite store, the notary's keys and signers. No Trio."""
