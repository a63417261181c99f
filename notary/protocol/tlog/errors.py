"""The errors of the transparency-log primitives.

Every error raised on purpose for bad input is a :class:`TlogError`, a
``ValueError``, so a caller may catch either. Each module raises its own
subclass: a proof that does not verify is a :class:`ProofError`, a malformed
or unverified signed note a :class:`NoteError`, a malformed checkpoint a
:class:`CheckpointError`, a bad tile path, tile or entry bundle a
:class:`TileError`. Messages are short and never repeat a large input.

Misuse of an API by its caller (a negative tree size, an index past the end
of the tree) is a plain ``ValueError``.
"""

from __future__ import annotations

from notary.errors import NotaryError


class TlogError(NotaryError, ValueError):
    """Base class of the errors of ``notary.protocol.tlog``."""


class ProofError(TlogError):
    """An inclusion or consistency proof does not verify, or is malformed."""


class NoteError(TlogError):
    """A signed note or verifier key is malformed, a known key's signature
    on it is invalid, or no known key signed it."""


class CheckpointError(TlogError):
    """A checkpoint's text is not a valid C2SP tlog-checkpoint body."""


class TileError(TlogError):
    """A tile path is not canonical, a tile has the wrong length, or an entry
    bundle is malformed."""
