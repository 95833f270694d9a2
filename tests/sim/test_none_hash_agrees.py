"""The simulated processes log the NONE_HASH the deploy expects (runners.lmcache.expected_none_hash): the simulator
computes it itself (runners/sim imports nothing of the Django project), the same way."""
import pytest

from runners.lmcache import expected_none_hash
from runners.sim.nonehash import none_hash


@pytest.mark.parametrize("algorithm", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("seed", ["0", "42", "4294967295", "1" * 30])
def test_the_simulator_and_the_deploy_agree_on_the_first_block_hash(algorithm, seed):
    assert str(none_hash(algorithm, seed)) == expected_none_hash(algorithm, seed)


def test_without_a_seed_each_call_draws_its_own():
    assert len({none_hash("sha256_cbor", None) for _ in range(5)}) == 5
