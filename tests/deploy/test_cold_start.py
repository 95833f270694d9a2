"""G1's cold start: empty compile caches, the start measured on the node, recorded; later deploys' health waits."""
from __future__ import annotations

import json
import time

import pytest

from runners import ssh
from runners.config import (
    COLD_START_FACTOR,
    COLD_START_FLOOR_S,
    HEALTH_TIMEOUT_MAX_S,
    default_simulated,
    health_timeout,
    validate_deployment,
)
from runners.deploy import deploy_arm
from runners.deployment import DeployError, server_log_tail
from runners.models import Artifact, Node, Step
from runners.sim.model import COLD_START, QWEN3_CODER_480B
from runners.simnode.state import update_state
from runners.teardown import teardown_arm
from tests.deploy.test_deploy_script import arm_params

MODEL = "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
CACHES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def settings(**changes):
    return validate_deployment(default_simulated() | changes)


def measured(seconds: float, **changes) -> dict:
    return {"seconds": seconds, "caches": "empty", "model": MODEL, "tensor_parallel_size": 8, "time_scale": None,
            **changes}


# ── the wait that follows from a measurement (runners.config.health_timeout) ────────────────────────────────────


def test_before_g1_measured_the_fixed_setting_is_the_wait():
    timeout = health_timeout(settings(health_timeout_s=120), {})
    assert (timeout.seconds, timeout.basis, timeout.why) == (120, "fixed", "not-measured")
    assert "G1 has not measured this node's cold start" in timeout.sentence


def test_g1s_own_cold_start_waits_the_fixed_setting_whatever_was_measured_before():
    timeout = health_timeout(settings(health_timeout_s=900), measured(1000.0), measuring=True)
    assert (timeout.seconds, timeout.basis, timeout.why) == (900, "fixed", "cold-start")


def test_a_measured_cold_start_sets_the_wait_to_the_factor_times_it():
    timeout = health_timeout(settings(health_timeout_s=120), measured(400.2))
    assert timeout.seconds == int(-(-COLD_START_FACTOR * 400.2 // 1)) == 801
    assert timeout.basis == "measured" and timeout.cold_start_s == 400.2
    assert timeout.sentence == "801 s (2 × the measured cold start of 400.2 s)"


def test_a_quick_cold_start_waits_the_floor_and_a_slow_one_the_most_a_deploy_may_wait():
    quick = health_timeout(settings(), measured(12.0))
    assert (quick.seconds, quick.basis) == (COLD_START_FLOOR_S, "floor")
    assert "the floor; 2 × the measured cold start of 12.0 s is less" in quick.sentence
    slow = health_timeout(settings(), measured(2000.0))
    assert (slow.seconds, slow.basis) == (HEALTH_TIMEOUT_MAX_S, "cap")


def test_a_cold_start_of_another_model_or_tensor_parallel_size_does_not_count():
    other = health_timeout(settings(health_timeout_s=120), measured(400.0, model="org/another-model"))
    assert (other.seconds, other.basis, other.why) == (120, "fixed", "other-model")
    tp = health_timeout(settings(health_timeout_s=120), measured(400.0, tensor_parallel_size=4))
    assert (tp.seconds, tp.why) == (120, "other-model")


def test_a_simulated_cold_start_is_rescaled_to_the_deploys_time_scale():
    at_scale = measured(400.0 * 0.5, time_scale=0.5)       # 400 model seconds, measured at ×0.5
    assert health_timeout(settings(), at_scale, time_scale=1.0).seconds == 800
    assert health_timeout(settings(), at_scale, time_scale=0.5).seconds == 400   # as measured: 2 × 200 wall seconds
    assert health_timeout(settings(), at_scale, time_scale=0.03).basis == "floor"  # 12 wall seconds


# ── deploy.sh: the caches and the launch of a cold start ──────────────────────────────────────────────────────────


@pytest.fixture
def echo_caches(tmp_path):
    """A vllm that prints the compile caches it was given and whether they were empty, then exits."""
    shim = tmp_path / "echo-vllm"
    shim.mkdir()
    (shim / "vllm").write_text(
        "#!/usr/bin/env bash\n"
        "[[ $1 == --version ]] && { echo 0.20.1+rocm721; exit 0; }\n"
        "python3 -c 'import json, os; print(json.dumps({k: [os.environ.get(k), os.path.isdir(os.environ.get(k, \"-\")) "
        "and not os.listdir(os.environ[k])] for k in (\"VLLM_CACHE_ROOT\", \"TORCHINDUCTOR_CACHE_DIR\", "
        "\"TRITON_CACHE_DIR\")}))'\n")
    (shim / "vllm").chmod(0o755)
    return shim


def test_a_cold_start_launches_vllm_with_empty_compile_caches_of_its_own(sandbox, echo_caches):
    arm_dir = arm_params(sandbox, "recompute", COLD_START=True, LAUNCH_ENV=["VLLM_CACHE_ROOT=/somewhere/warm"])
    stale = sandbox.root / "runs" / "r1" / "recompute" / "compile-cache" / "triton" / "old-kernel"
    stale.parent.mkdir(parents=True)
    stale.write_text("compiled before")
    assert sandbox.run("deploy.sh", "preflight", arm_dir, extra_path=echo_caches).returncode == 0
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=echo_caches)
    assert served.returncode == 0, served.stderr
    caches = json.loads(served.stdout.strip().splitlines()[-1])
    assert caches == {"VLLM_CACHE_ROOT": [f"{arm_dir}/compile-cache/vllm", True],
                      "TORCHINDUCTOR_CACHE_DIR": [f"{arm_dir}/compile-cache/torchinductor", True],
                      "TRITON_CACHE_DIR": [f"{arm_dir}/compile-cache/triton", True]}
    assert float((sandbox.root / "runs" / "r1" / "recompute" / "launched_at").read_text()) <= time.time()
    manifest = json.loads((sandbox.root / "runs" / "r1" / "recompute" / "manifest.json").read_text())
    assert manifest["environment"]["TRITON_CACHE_DIR"] == f"{arm_dir}/compile-cache/triton"


def test_an_ordinary_start_keeps_the_caches_the_settings_name(sandbox, echo_caches):
    arm_dir = arm_params(sandbox, "recompute", LAUNCH_ENV=["VLLM_CACHE_ROOT=/somewhere/warm"])
    assert sandbox.run("deploy.sh", "preflight", arm_dir, extra_path=echo_caches).returncode == 0
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=echo_caches)
    caches = json.loads(served.stdout.strip().splitlines()[-1])
    assert caches["VLLM_CACHE_ROOT"] == ["/somewhere/warm", False] and caches["TRITON_CACHE_DIR"][0] is None
    assert not (sandbox.root / "runs" / "r1" / "recompute" / "compile-cache").exists()


def test_a_cold_start_that_finds_its_caches_filled_refuses_to_launch(sandbox, echo_caches):
    arm_dir = arm_params(sandbox, "recompute", COLD_START=True)
    assert sandbox.run("deploy.sh", "preflight", arm_dir, extra_path=echo_caches).returncode == 0
    (sandbox.root / "runs" / "r1" / "recompute" / "compile-cache" / "vllm" / "x").write_text("warm")
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=echo_caches)
    assert served.returncode != 0 and "is not empty: this start would not be cold" in served.stderr


@pytest.mark.parametrize(("prefix", "cold", "expected"), [
    (["docker", "run", "--rm", "img"], True,
     ["docker", "run", "-e", "PYTHONHASHSEED", "-e", "VLLM_CACHE_ROOT", "-e", "TORCHINDUCTOR_CACHE_DIR", "-e",
      "TRITON_CACHE_DIR", "--rm", "img"]),
    (["docker", "run", "-e", "PYTHONHASHSEED", "-e", "TRITON_CACHE_DIR", "img"], True,
     ["docker", "run", "-e", "VLLM_CACHE_ROOT", "-e", "TORCHINDUCTOR_CACHE_DIR", "-e", "PYTHONHASHSEED", "-e",
      "TRITON_CACHE_DIR", "img"]),
    (["docker", "run", "--rm", "img"], False, ["docker", "run", "-e", "PYTHONHASHSEED", "--rm", "img"]),
])
def test_a_container_is_given_the_empty_caches_of_a_cold_start(sandbox, tmp_path, prefix, cold, expected):
    shim = tmp_path / "shims"
    shim.mkdir()
    (shim / "docker").write_text("#!/usr/bin/env bash\npython3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "
                                 "\"$@\"\n")
    (shim / "docker").chmod(0o755)
    arm_dir = arm_params(sandbox, "recompute", LAUNCH_KIND="prefix", LAUNCH_PREFIX=prefix, COLD_START=cold)
    for sub in ("vllm", "torchinductor", "triton"):
        (sandbox.root / "runs" / "r1" / "recompute" / "compile-cache" / sub).mkdir(parents=True, exist_ok=True)
    (sandbox.root / "runs" / "r1" / "recompute" / "port").write_text("8123\n")
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=shim)
    assert served.returncode == 0, served.stderr
    words = json.loads(served.stdout.strip().splitlines()[-1])
    assert ["docker", *words[:len(expected) - 1]] == expected


def test_a_container_prefix_that_sets_a_compile_cache_cannot_make_a_cold_start(sandbox, tmp_path):
    arm_dir = arm_params(sandbox, "recompute", LAUNCH_KIND="prefix", COLD_START=True,
                         LAUNCH_PREFIX=["docker", "run", "-eTRITON_CACHE_DIR=/cache/triton", "img"])
    for sub in ("vllm", "torchinductor", "triton"):
        (sandbox.root / "runs" / "r1" / "recompute" / "compile-cache" / sub).mkdir(parents=True, exist_ok=True)
    (sandbox.root / "runs" / "r1" / "recompute" / "port").write_text("8123\n")
    served = sandbox.run("deploy.sh", "serve", arm_dir)
    assert served.returncode != 0
    assert "launcher.prefix sets TRITON_CACHE_DIR itself: G1's cold start needs its own empty compile caches" \
        in served.stderr


# ── over SSH on simulated nodes: measured on the node, recorded, and the wait of a later deploy ──────────────────


def test_a_cold_start_is_measured_on_the_node_from_launch_to_health(sim_nodes):
    node = sim_nodes.nodes[0]
    sim_nodes.pilot.deployment = default_simulated()
    sim_nodes.pilot.save()
    scale = 0.01
    step = Step.objects.create(job=sim_nodes.job, seq=1, name="deploy", node=node, arm="recompute",
                               params={"cold_start": True})
    started = time.time()
    deployment = deploy_arm(sim_nodes.job, step, node, "recompute", time_scale=scale, cold_start=True)
    try:
        took = time.time() - started
        cold = deployment.cold_start
        modelled = COLD_START.cold_seconds(QWEN3_CODER_480B) * scale      # the simulator's cold start, 3.9 s here
        assert modelled <= cold["seconds"] <= took, (cold, took)
        assert cold["caches"] == "empty" and cold["simulated"] is True and cold["time_scale"] == scale
        assert (cold["model"], cold["tensor_parallel_size"]) == (MODEL, 8)
        assert cold["healthy_at"] - cold["launched_at"] == pytest.approx(cold["seconds"], abs=0.01)
        assert cold["measured_at"].endswith("Z")
        assert set(cold["compile_caches"]) == set(CACHES)
        assert deployment.health_timeout_s == 120                        # the fixed setting: this is the measurement
        # the manifest on the node says it too, and the deploy kept it as evidence
        manifest = json.loads(next(sim_nodes.servers[0].root.rglob(f"{deployment.arm}-{deployment.deploy_id}"
                                                                   "/manifest.json")).read_text())
        assert manifest["cold_start"] == cold
        kept = Artifact.objects.get(job=sim_nodes.job, kind="cold-start")
        assert kept.name == f"node1/recompute-{deployment.deploy_id}/cold-start.json" and kept.simulated
        # the simulated server compiled into the caches it was given: they were the ones it used
        compiled = list(sim_nodes.servers[0].root.rglob("compile-cache/vllm/torch_compile_cache/fxpilot-sim-compiled.json"))
        assert compiled
        text = "".join(sim_nodes.job.chunks.values_list("text", flat=True))
        assert "with empty compile caches (cold start)" in text
        assert f"cold start {cold['seconds']:.1f} s from launch to /health" in text
    finally:
        teardown_arm(sim_nodes.job, step, node, deployment)


def test_a_later_deploy_waits_as_long_as_the_measured_cold_start_says_and_starts_warm(sim_nodes):
    node = sim_nodes.nodes[1]
    sim_nodes.pilot.deployment = default_simulated()
    sim_nodes.pilot.save()
    Node.objects.filter(pk=node.pk).update(cold_start=measured(387.0 * 0.01, time_scale=0.01, simulated=True))
    deployment = deploy_arm(sim_nodes.job, None, node, "recompute", time_scale=0.5)
    try:
        # 387 model seconds at ×0.5: 193.5 s, twice that
        assert deployment.health_timeout_s == 387 and not deployment.cold_start_measured
        assert deployment.cold_start == {}
        # a warm start: the compile caches the earlier deploy filled are found, so the simulated server models no
        # cold start (its log says "cold start (simulated)" when it does) — read from its log, not the wall clock
        with ssh.connect(node) as conn:
            log = server_log_tail(conn, deployment, lines=10_000)
        assert log.strip(), "the server wrote no log"
        assert "cold start (simulated)" not in log
        text = "".join(sim_nodes.job.chunks.values_list("text", flat=True))
        assert "waiting for /health up to 387 s (2 × the measured cold start of 193.5 s)" in text
    finally:
        teardown_arm(sim_nodes.job, None, node, deployment)


def test_a_server_slower_than_the_wait_fails_naming_where_the_wait_came_from(sim_nodes):
    node, server = sim_nodes.nodes[0], sim_nodes.servers[0]
    sim_nodes.pilot.deployment = default_simulated() | {"health_timeout_s": 2}
    sim_nodes.pilot.save()
    Node.objects.filter(pk=node.pk).update(cold_start={})
    update_state(server.root, lambda state: state["faults"].update(slow_start_seconds=30))
    try:
        with pytest.raises(DeployError, match=r"did not answer within 2 s \(deployment.health_timeout_s: G1 has not "
                                              r"measured this node's cold start\)"):
            deploy_arm(sim_nodes.job, None, node, "recompute", time_scale=0.001)
    finally:
        update_state(server.root, lambda state: state["faults"].pop("slow_start_seconds", None))


@pytest.mark.parametrize(("line", "kept"), [
    ('FXPILOT_COLD_START={"seconds": 12.5, "model": "m/x", "tensor_parallel_size": 8, "time_scale": 0.03}', True),
    ('FXPILOT_COLD_START={"seconds": "12.5", "model": "m/x", "tensor_parallel_size": 8}', False),
    ('FXPILOT_COLD_START={"seconds": 12.5, "model": "m/x", "tensor_parallel_size": 8, "time_scale": "fast"}', False),
    ('FXPILOT_COLD_START={"seconds": -1, "model": "m/x", "tensor_parallel_size": 8}', False),
    ('FXPILOT_COLD_START=[12.5]', False),
    ("fxpilot: healthy on port 8000", False),
])
def test_what_a_node_says_of_its_cold_start_is_kept_only_when_its_figures_hold_up(line, kept):
    from runners.deploy import _cold_start_of

    assert (_cold_start_of(f"fxpilot: cold start\n{line}\n") is not None) == kept
