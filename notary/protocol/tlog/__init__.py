"""Transparency-log primitives: RFC 9162 Merkle trees and proofs, C2SP
tiles and entry bundles, signed notes and checkpoints.

Sans-IO: no Trio, no sockets, no files, no clock. Hashes come from the
caller through a ``perfect(level, index)`` callable (see
:mod:`~notary.protocol.tlog.merkle`), tiles through ``read_tile``, and
signatures through ``sign``; this package holds no key and no store.

Modules, in import order: ``errors``, ``merkle`` (hashing, proofs, their
verification, the sequencer's ``CompactRange``), ``tiles`` (paths, tile
contents, ``TileHashReader``, entry bundles), ``note`` (signed notes and
verifier keys, Ed25519), ``checkpoint``, ``cosignature`` (witness
cosignatures, the add-checkpoint body), ``witness`` (a witness's rules),
``policy`` (a client's: which witnesses, how many).
Import the names from this package.

Errors: every rejection of input is a :class:`TlogError` (a
``ValueError``): :class:`ProofError`, :class:`NoteError`,
:class:`CheckpointError`, :class:`TileError`. A caller's out-of-range
argument is a plain ``ValueError``.

References: RFC 9162 section 2.1; c2sp.org/tlog-tiles,
c2sp.org/signed-note, c2sp.org/tlog-checkpoint, c2sp.org/tlog-cosignature,
c2sp.org/tlog-witness.
"""

from __future__ import annotations

from notary.protocol.tlog.checkpoint import (
    MAX_CHECKPOINT_CHARS,
    MAX_TREE_SIZE,
    Checkpoint,
    format_checkpoint,
    open_checkpoint,
    parse_checkpoint,
)
from notary.protocol.tlog.cosignature import (
    COSIGNATURE_TYPE,
    MAX_ADD_CHECKPOINT_BYTES,
    MAX_ADD_CHECKPOINT_PROOF,
    AddCheckpoint,
    AddCheckpointError,
    Cosignature,
    cosign,
    cosignature_key_id,
    cosignature_verifier,
    cosignature_verifiers,
    cosigned_message,
    cosigner_key,
    format_add_checkpoint,
    parse_add_checkpoint,
    parse_cosignature_line,
    parse_cosigner_key,
)
from notary.protocol.tlog.errors import (
    CheckpointError,
    NoteError,
    ProofError,
    TileError,
    TlogError,
)
from notary.protocol.tlog.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    MAX_PROOF_HASHES,
    CompactRange,
    PerfectHash,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    range_hash,
    root_hash,
    verify_consistency,
    verify_inclusion,
)
from notary.protocol.tlog.note import (
    ED25519_PUBLIC_KEY_BYTES,
    ED25519_SIGNATURE_BYTES,
    ED25519_SIGNATURE_TYPE,
    KEY_ID_BYTES,
    MAX_NOTE_BYTES,
    MAX_NOTE_SIGNATURES,
    MAX_VERIFIER_KEY_CHARS,
    Verify,
    ed25519_key_id,
    ed25519_verifier,
    ed25519_verifiers,
    is_valid_key_name,
    known_signatures_only,
    open_note,
    parse_verifier_key,
    parse_vkey,
    sign_note,
    verifier_key,
)
from notary.protocol.tlog.policy import MAX_AHEAD_S, Witnessing, WitnessPolicy
from notary.protocol.tlog.tiles import (
    DEFAULT_CACHED_TILES,
    MAX_ENTRY_BYTES,
    MAX_TILE_INDEX,
    MAX_TILE_LEVEL,
    MAX_TILE_PATH_CHARS,
    TILE_HEIGHT,
    TILE_WIDTH,
    ReadTile,
    TileHashReader,
    decode_entry_bundle,
    encode_entry_bundle,
    entries_path,
    parse_tile_path,
    tile_count,
    tile_hashes,
    tile_path,
    tiles_to_publish,
)
from notary.protocol.tlog.witness import (
    NOTHING_HELD,
    SIZE_CONTENT_TYPE,
    HeldCheckpoint,
    WitnessRefusal,
    check_consistent,
    open_submission,
    witnessed_logs,
)

__all__ = [
    "COSIGNATURE_TYPE",
    "DEFAULT_CACHED_TILES",
    "ED25519_PUBLIC_KEY_BYTES",
    "ED25519_SIGNATURE_BYTES",
    "ED25519_SIGNATURE_TYPE",
    "EMPTY_ROOT",
    "HASH_SIZE",
    "KEY_ID_BYTES",
    "MAX_ADD_CHECKPOINT_BYTES",
    "MAX_ADD_CHECKPOINT_PROOF",
    "MAX_AHEAD_S",
    "MAX_CHECKPOINT_CHARS",
    "MAX_ENTRY_BYTES",
    "MAX_NOTE_BYTES",
    "MAX_NOTE_SIGNATURES",
    "MAX_PROOF_HASHES",
    "MAX_TILE_INDEX",
    "MAX_TILE_LEVEL",
    "MAX_TILE_PATH_CHARS",
    "MAX_TREE_SIZE",
    "MAX_VERIFIER_KEY_CHARS",
    "NOTHING_HELD",
    "SIZE_CONTENT_TYPE",
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "AddCheckpoint",
    "AddCheckpointError",
    "Checkpoint",
    "CheckpointError",
    "CompactRange",
    "Cosignature",
    "HeldCheckpoint",
    "NoteError",
    "PerfectHash",
    "ProofError",
    "ReadTile",
    "TileError",
    "TileHashReader",
    "TlogError",
    "Verify",
    "WitnessPolicy",
    "WitnessRefusal",
    "Witnessing",
    "check_consistent",
    "consistency_proof",
    "cosign",
    "cosignature_key_id",
    "cosignature_verifier",
    "cosignature_verifiers",
    "cosigned_message",
    "cosigner_key",
    "decode_entry_bundle",
    "ed25519_key_id",
    "ed25519_verifier",
    "ed25519_verifiers",
    "encode_entry_bundle",
    "entries_path",
    "format_add_checkpoint",
    "format_checkpoint",
    "inclusion_proof",
    "is_valid_key_name",
    "known_signatures_only",
    "leaf_hash",
    "node_hash",
    "open_checkpoint",
    "open_note",
    "open_submission",
    "parse_add_checkpoint",
    "parse_checkpoint",
    "parse_cosignature_line",
    "parse_cosigner_key",
    "parse_tile_path",
    "parse_verifier_key",
    "parse_vkey",
    "range_hash",
    "root_hash",
    "sign_note",
    "tile_count",
    "tile_hashes",
    "tile_path",
    "tiles_to_publish",
    "verifier_key",
    "verify_consistency",
    "verify_inclusion",
    "witnessed_logs",
]
