"""Chunk names follow the first-block hash: a process whose PYTHONHASHSEED (or hash function) differs writes other
chunk files and finds none of the others' (what the deploy's canary prompt compares, issue 43 item 6)."""
from __future__ import annotations

from tests.sim.conftest import SimServer, cached, prompt_ids

CONTEXT = 1024


def settings(node, algorithm: str = "sha256_cbor") -> dict:
    return {"chunk_size": 256, "local_cpu": False, "max_local_disk_size": 50, "pre_caching_hash_algorithm": algorithm,
            "local_disk": f"file://{node.nvme / 'lmcache'}"}


def run(node, seed: str, algorithm: str = "sha256_cbor") -> tuple[int, set[str]]:
    """Start a server with this seed, send the canary twice (the second after an HBM reset); its hit, the files."""
    server = SimServer(node, "local_nvme", lmcache=settings(node, algorithm), env={"PYTHONHASHSEED": seed},
                       name=f"seed{seed}")
    try:
        server.start()
        context = prompt_ids(CONTEXT)
        first = cached(server.complete(context + prompt_ids(8, 7))["usage"])
        server.reset()
        server.complete(context + prompt_ids(8, 8))
    finally:
        server.stop()
    return first, {path.name for path in (node.nvme / "lmcache").glob("*.pt")}


def test_the_same_seed_finds_the_chunks_another_seed_does_not(node):
    hit, names_0 = run(node, "0")
    assert hit == 0 and len(names_0) == CONTEXT // 256
    hit, names_0_again = run(node, "0")         # a restart with the same seed: the files are found
    assert hit == CONTEXT and names_0_again == names_0
    hit, names_both = run(node, "1")            # another seed: nothing found, other names written
    assert hit == 0 and len(names_both - names_0) == CONTEXT // 256
    hit, _ = run(node, "1", algorithm="sha256")  # another function, same seed: nothing found either
    assert hit == 0
