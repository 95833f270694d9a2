"""The first-block hash (vLLM's NONE_HASH) as LMCache 0.5.6 logs it in each of its processes.

LMCache's token database calls vLLM's `kv_cache_utils.init_none_hash(hash_fn)` with the hash function named by
`pre_caching_hash_algorithm` (vllm.utils.hashing: sha256 = SHA-256 of the pickle, sha256_cbor = SHA-256 of canonical
CBOR, xxhash / xxhash_cbor = xxh3-128 of the same; any other name, LMCache's default `builtin`, falls back to Python's
hash()). vLLM 0.20.1 hashes the PYTHONHASHSEED string with it, or draws 32 random bytes per process when the variable
is unset. LMCache folds a digest into an int (its first 8 bytes, big-endian) and logs
`Initialized NONE_HASH=<int> from vLLM (>= PR#20511)`. Standard library only (runners.sim imports no Django).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys

VLLM_HASH_FUNCTIONS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
CBOR_FUNCTIONS = ("sha256_cbor", "xxhash_cbor")


def vllm_function(algorithm: str) -> str | None:
    """The vLLM hash function LMCache loads for ``algorithm`` (sha256_cbor_64bit was renamed sha256_cbor), or None
    when vLLM has none of that name (LMCache then uses Python's hash())."""
    name = "sha256_cbor" if algorithm == "sha256_cbor_64bit" else algorithm
    return name if name in VLLM_HASH_FUNCTIONS else None


def _cbor_text(text: str) -> bytes:
    """cbor2.dumps(text, canonical=True) for a text string (major type 3, shortest length)."""
    data = text.encode()
    size = len(data)
    if size < 24:
        head = bytes([0x60 + size])
    elif size < 256:
        head = bytes([0x78, size])
    elif size < 65536:
        head = bytes([0x79]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x7A]) + size.to_bytes(4, "big")
    return head + data


def digest(function: str, seed: str) -> bytes:
    """vLLM's hash function `function` (sha256, sha256_cbor, xxhash, xxhash_cbor) of the seed string."""
    data = _cbor_text(seed) if function in CBOR_FUNCTIONS else pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)
    if function.startswith("sha256"):
        return hashlib.sha256(data).digest()
    import xxhash  # noqa: PLC0415 - optional, as in vLLM: raises ModuleNotFoundError when the package is missing
    return xxhash.xxh3_128_digest(data)


def builtin_hash(seed: str) -> int:
    """Python's hash() of the seed string in a process started with PYTHONHASHSEED=seed."""
    if os.environ.get("PYTHONHASHSEED") == seed:
        return hash(seed)
    out = subprocess.run([sys.executable, "-S", "-c", "import sys; print(hash(sys.argv[1]))", seed],
                         env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def none_hash(algorithm: str, seed: str | None) -> int:
    """The value LMCache logs for (pre_caching_hash_algorithm, PYTHONHASHSEED); random when the seed is missing.
    Raises ModuleNotFoundError for the xxhash functions when the xxhash package is not installed."""
    function = vllm_function(algorithm)
    if seed is None:
        return int.from_bytes(os.urandom(32)[:8], "big")
    if function is None:
        return builtin_hash(seed)
    return int.from_bytes(digest(function, seed)[:8], "big")
