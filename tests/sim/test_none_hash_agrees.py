"""The first block's hash the deploy expects and the simulated processes log (one computation,
runners.sim.nonehash) held to values: what real vLLM 0.20.1 + LMCache 0.5.6 logged in the real-engine tier for
sha256_cbor and PYTHONHASHSEED=0 (tests/real, docs/real-engine.md), and the algorithms' own definitions."""
import hashlib
import pickle

import pytest

from runners.lmcache import expected_none_hash
from runners.sim.nonehash import none_hash

REAL_SHA256_CBOR_SEED_0 = "5625442194607170974"   # "Initialized NONE_HASH=…" on every real process, seed "0"


def test_the_value_real_lmcache_logged_is_the_one_expected():
    assert expected_none_hash("sha256_cbor", "0") == REAL_SHA256_CBOR_SEED_0
    assert str(none_hash("sha256_cbor", "0")) == REAL_SHA256_CBOR_SEED_0


@pytest.mark.parametrize("seed", ["0", "42", "4294967295", "1" * 30])
def test_sha256_is_the_first_eight_bytes_of_the_pickles_digest(seed):
    digest = hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert expected_none_hash("sha256", seed) == str(int.from_bytes(digest[:8], "big")) == str(none_hash("sha256", seed))


def test_an_unknown_function_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="sha256_cbor"):
        expected_none_hash("builtin", "0")


def test_without_a_seed_each_call_draws_its_own():
    assert len({none_hash("sha256_cbor", None) for _ in range(5)}) == 5
