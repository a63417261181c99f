"""Where the real 2011 vectors are: the repository's copy under tests/vectors
(kept identical to ../shared/vectors, see test_vectors_match_shared)."""

from pathlib import Path

VECTORS = Path(__file__).parent / "vectors"
SHARED_VECTORS = Path(__file__).resolve().parents[2] / "shared" / "vectors"
