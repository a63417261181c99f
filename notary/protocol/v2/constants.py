"""The v2 wire vocabulary shared by several modules: document types, verdict
names, digest and signature sizes, and the text formats of hex and base64
(docs/v2.md). Limits that one module owns live in that module."""

from __future__ import annotations

import re

CONTENT_TYPE = b"application/json"
STATEMENT_TYPE = "notary.v2.statement"
ANSWER_TYPE = "notary.v2.answer"

VERDICT_MATCH = "match"
VERDICT_MISMATCH = "mismatch"
VERDICT_UNKNOWN = "unknown"
VERDICT_UNREACHABLE = "unreachable"
VERDICT_REFUSED = "refused"
VERDICTS = frozenset(
    {VERDICT_MATCH, VERDICT_MISMATCH, VERDICT_UNKNOWN, VERDICT_UNREACHABLE, VERDICT_REFUSED}
)

#: Most observations in one statement (the newest ones, rule S1).
MAX_STATEMENT_OBSERVATIONS = 64
#: Most addresses in a statement's ``consistency`` (the first ones in their
#: order, rule S8): 64 observations keep up to 8 each, and the statement's
#: log entry must stay within 65,535 bytes (S7).
MAX_CONSISTENCY_ADDRESSES = 64

#: A result's ``matched_by`` (rule S2, V6): the match is by the submitted
#: ``spki_sha256`` alone.
MATCHED_BY_SPKI = "spki"
MATCHED_BY = frozenset({MATCHED_BY_SPKI})

ED25519_SIGNATURE_BYTES = 64
SHA256_BYTES = 32
SHA1_BYTES = 20

#: Hex digits in lower case, as the notary writes them.
LOWER_HEX_RE = re.compile(r"[0-9a-f]*")
#: Standard base64 with padding (rule S3).
BASE64_RE = re.compile(r"[A-Za-z0-9+/]+={0,2}")
