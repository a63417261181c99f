"""A transparency log made in the test, for witnesses to cosign: its origin,
its own Ed25519 key, and add-checkpoint bodies for its trees of made-up
leaves (RFC 9162 trees from notary.protocol.tlog)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.protocol import tlog


class MadeLog:
    """See the module docstring; ``leaves``: how many there are to grow to."""

    def __init__(self, origin: str, leaves: int = 64) -> None:
        self.origin = origin
        self.key = Ed25519PrivateKey.generate()
        self.public = self.key.public_key().public_bytes_raw()
        self.vkey = tlog.verifier_key(origin, self.public)
        self.leaves = [tlog.leaf_hash(b"%s %d" % (origin.encode(), i)) for i in range(leaves)]

    def _mth(self, start: int, end: int) -> bytes:
        if end - start == 1:
            return self.leaves[start]
        k = 1
        while k * 2 < end - start:
            k *= 2
        return tlog.node_hash(self._mth(start, start + k), self._mth(start + k, end))

    def perfect(self, level: int, index: int) -> bytes:
        return self._mth(index << level, (index + 1) << level)

    def note(self, size: int) -> str:
        """The checkpoint of the first ``size`` leaves, signed by the log."""
        text = tlog.format_checkpoint(
            tlog.Checkpoint(self.origin, size, tlog.root_hash(size, self.perfect))
        )
        return tlog.sign_note(text, self.origin, self.key.sign, self.public)

    def add_checkpoint(self, old: int, size: int, note: str | None = None) -> bytes:
        """The body asking a witness holding ``old`` to cosign ``size``
        (``note``: another signed note of it than ``note(size)``)."""
        proof = tlog.consistency_proof(old, size, self.perfect)
        return tlog.format_add_checkpoint(old, proof, note or self.note(size))
