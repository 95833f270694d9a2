"""The real-engine tier: real `vllm serve` (vLLM 0.20.1's CPU build) started by the real deploy.sh over
OpenSSH's sshd on loopback, with a tiny model the tests build (random weights, Qwen3's real tokenizer).

The engine's environment is built once per machine outside the clone by `scripts/real-engine` (`.ci/run`
and `make test-real` call it); without it these tests skip and say how to build it. The servers are
started once per test session and shared: a recompute arm and a cache arm running the real LMCache 0.5.6
(`LMCacheConnectorV1`, the YAML the product renders: its DRAM tier on, local_disk with O_DIRECT, the internal API
server on loopback, the stated chunk hash), both deployed together. Run as root, the cache arm's disk tier is an
ext4 file system on a loop device of its own (LOOP_IMAGE_MIB), so /proc/diskstats counts only LMCache's reads;
otherwise it is a folder of the test's temporary directory and the device counts are not compared (said once). LMCache runs on this CPU build through a small connector of fxpilot's own that the engine
recipe adds (scripts/real-engine-lmcache.py).
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.lifetime import watch_files
from tests.runners.conftest import SSHD, Sshd, _free_port, sshd, user_key  # noqa: F401  (shared fixtures)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "real-engine"
MODEL_RECIPE = REPO / "tests" / "real" / "make_model.py"
MAX_MODEL_LEN = 4096
# LMCache stores a prompt in 256-token chunks (chunk_size) and vLLM computes at least the prompt's last token
# itself: with 1,030 tokens four whole chunks, 1,024 tokens, come back from LMCache after the prefix cache is reset.
PROMPT_TOKENS = 1030
EXTERNAL_HIT = 1024

# The tier's time limits, in this one place (docs/real-engine.md, "Time limits"). pytest's timeout of a test covers
# the set-up and tear-down of the fixtures it uses, and the first test sets the servers up: each test of the tier
# gets the sum of the waits one test can meet plus a margin, so pytest never stops the tier inside a wait of its
# own (pytest.ini's 600 s for every other test is shorter than the wait for /health alone).
ENGINE_BUILD_S = 1800   # CI only: waiting for (or doing) the engine environment's build (once per machine)
MODEL_BUILD_S = 600     # building the tiny model (once per machine)
HEALTH_WAIT_S = 900     # each server's wait for /health (deployment.health_timeout_s); both servers start at once
WORKLOAD_S = 900        # one workload run on the node (flow.cold_recovery)
MARGIN_S = 600          # the rest: preflight, SSH round trips, collecting, tearing down
TEST_TIMEOUT_S = ENGINE_BUILD_S + MODEL_BUILD_S + HEALTH_WAIT_S + WORKLOAD_S + MARGIN_S


def engine_dir() -> Path:
    return Path(subprocess.run([str(SCRIPT), "--path"], capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="session")
def engine() -> SimpleNamespace:
    """The engine environment, or a skip that says how to build it."""
    folder = engine_dir()
    if os.environ.get("FXPILOT_CI") and subprocess.run([str(SCRIPT), "--check"]).returncode != 0:
        # CI builds the environment in the background while the rest of the suite runs (.ci/run): wait for that
        # build (the script waits on its lock, or builds if none ran), and fail with its log rather than skip.
        built = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=ENGINE_BUILD_S)
        if built.returncode != 0:
            log = Path(os.environ.get("FXPILOT_ENGINE_LOG", "/nonexistent"))
            earlier = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            pytest.fail(f"the real-engine environment could not be built at {folder}:\n{earlier}\n{built.stderr[-3000:]}")
    if subprocess.run([str(SCRIPT), "--check"]).returncode != 0:
        pytest.skip(f"the real-engine environment is not built at {folder}: run scripts/real-engine "
                    "(about 4 minutes and 6 GB, once per machine), or make test-real")
    python = folder / "venv" / "bin" / "python"
    return SimpleNamespace(dir=folder, venv=folder / "venv", python=python, tokenizer=folder / "tokenizer",
                           cache=folder / "cache")


@pytest.fixture(scope="session")
def tiny_model(engine) -> Path:
    """A random-init Qwen3ForCausalLM (2 layers, hidden 128) with the real Qwen3 tokenizer, built once and kept
    beside the engine (its recipe's hash names it)."""
    import hashlib

    digest = hashlib.sha256(MODEL_RECIPE.read_bytes()).hexdigest()[:12]
    target = engine.dir / f"model-{digest}"
    if not (target / "config.json").exists():
        scratch = engine.dir / f".model-{uuid.uuid4().hex[:6]}"
        subprocess.run([str(engine.python), str(MODEL_RECIPE), str(engine.tokenizer), str(scratch), str(MAX_MODEL_LEN)],
                       check=True, capture_output=True, timeout=MODEL_BUILD_S)
        try:
            scratch.rename(target)
        except OSError:  # another run built it first
            subprocess.run(["rm", "-rf", str(scratch)], check=False)
    return target


# LMCache's DRAM per rank and its disk tier's cap (GiB, LMCache's units). The tier's largest retrieval is one
# --max-model-len prompt: 4,096 tokens × 1,024 B/token (2 layers × 2 KV heads × 64 × bf16 × K and V) = 4 MiB; the
# DRAM pool is well above it (the sizing preflight), the disk cap well above what the tier stores (~40 MiB).
DRAM_GIB = 0.125
DISK_GIB = 0.25
LOOP_IMAGE_MIB = 512


def real_deployment(engine, model: Path, root: Path, *, health_timeout_s: int = HEALTH_WAIT_S,
                    dram_gib: float = DRAM_GIB) -> dict:
    """Deployment settings for the engine venv: paths under `root`, eager mode, a 1 GiB KV cache."""
    return {
        "model": str(model), "tensor_parallel_size": 1, "ports": {"base": 0},
        "paths": {"fx_mount": str(root / "fx"), "local_nvme_path": str(root / "nvme"),
                  "shared_pool": str(root / "fx" / "shared"), "run_root": str(root / "runs")},
        "sizes": {"chunk_size": 256, "max_local_cpu_size": dram_gib, "max_local_disk_size": DISK_GIB},
        "use_odirect": True, "drop_page_cache": False,
        "fx_target": {"transport": "rdma", "address": "192.0.2.10", "service_id": 4420,
                      "nqn": "nqn.2026-01.com.example.fx:fx100.pool0"},
        "extra_vllm_flags": ["--enforce-eager", f"--max-model-len={MAX_MODEL_LEN}", "--max-num-seqs=8"],
        "health_timeout_s": health_timeout_s, "kv_connector": "LMCacheConnectorV1",
        "launcher": {"venv": str(engine.venv), "env": {
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(engine.cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(engine.cache / "inductor")}},
    }


class LoopDisk(SimpleNamespace):
    """The cache arm's disk tier on a loop device of its own: `device` (loopN, its /proc/diskstats name) or None and
    `reason` (why not)."""


def loop_disk(mount: Path) -> LoopDisk:
    """An ext4 file system on a fresh loop device mounted at `mount` (root only); LoopDisk(device=None, reason=…)
    when it cannot be made here. Undo with `release_loop`."""
    import shutil

    mount.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return LoopDisk(device=None, reason="not root: the disk tier is a folder, its device reads are not counted")
    missing = [tool for tool in ("losetup", "mkfs.ext4", "mount", "umount") if not shutil.which(tool)]
    if missing:
        return LoopDisk(device=None, reason=f"{', '.join(missing)} not installed: the disk tier is a folder")
    image = mount.parent / f"{mount.name}.img"
    with open(image, "wb") as handle:
        handle.truncate(LOOP_IMAGE_MIB << 20)
    made = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        image.unlink()
        return LoopDisk(device=None, reason=f"losetup refused: {made.stderr.strip()[-300:]}")
    path = made.stdout.strip()
    for command in (["mkfs.ext4", "-q", "-F", path], ["mount", path, str(mount)]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["losetup", "-d", path], capture_output=True)
            image.unlink()
            return LoopDisk(device=None, reason=f"{command[0]} failed: {done.stderr.strip()[-300:]}")
    return LoopDisk(device=os.path.basename(path), path=path, mount=mount, image=image, reason=None)


def release_loop(disk: LoopDisk) -> None:
    if not disk.device:
        return
    subprocess.run(["umount", "--lazy", str(disk.mount)], capture_output=True)
    subprocess.run(["losetup", "-d", disk.path], capture_output=True)
    disk.image.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def real_site(django_db_setup, django_db_blocker, engine, tiny_model, sshd, user_key, tmp_path_factory):  # noqa: F811
    """A pilot, site and node (this machine's sshd) in the test database for the whole session; removed after."""

    root = tmp_path_factory.mktemp("real-node")
    disk = loop_disk(root / "nvme")
    try:
        yield from _real_site(django_db_blocker, engine, tiny_model, sshd, user_key, root, disk)
    finally:
        release_loop(disk)


def _real_site(django_db_blocker, engine, tiny_model, sshd, user_key, root, disk):  # noqa: F811
    from gates.models import Organisation, Pilot
    from runners.credentials import create_credential
    from runners.models import Job, Node, Site

    # The servers run detached on the "node" (children of sshd, not of pytest): they carry the session's mark (the
    # sshd fixture passes it on), and the session's watcher also ends the process groups their pgid files name.
    watch_files(root / "runs" / "*" / "*" / "server" / "pgid")
    with django_db_blocker.unblock():
        suffix = uuid.uuid4().hex[:6]
        vendor = Organisation.objects.create(name=f"Vendor {suffix}", kind=Organisation.Kind.VENDOR)
        customer = Organisation.objects.create(name=f"Customer {suffix}", kind=Organisation.Kind.CUSTOMER)
        pilot = Pilot.objects.create(name=f"Real {suffix}", vendor=vendor, customer=customer,
                                     deployment=real_deployment(engine, tiny_model, root))
        site = Site.objects.create(pilot=pilot, name="Loopback", queue=f"real-{suffix}")
        credential = create_credential(site, "test key", user_key.text)
        key = sshd.host_key
        node = Node.objects.create(site=site, name="loopback", host="127.0.0.1", port=sshd.port,
                                   username=sshd.username, credential=credential, simulated=False,
                                   host_key_state=Node.HostKeyState.ACCEPTED, host_key_type=key.get_name(),
                                   host_key=key.get_base64(), host_key_fingerprint=key.fingerprint)
        # one run per arm: the two servers are deployed at once, and one run's arms share a directory
        jobs = {arm: Job.objects.create(pilot=pilot, site=site, kind=Job.Kind.GATE_RUN) for arm in ("recompute", "local_nvme")}
        try:
            yield SimpleNamespace(pilot=pilot, site=site, node=node, jobs=jobs, root=root, engine=engine,
                                  model=tiny_model, blocker=django_db_blocker, disk=disk)
        finally:
            from django.db.models import ProtectedError

            try:
                pilot.delete()
                vendor.delete()
                customer.delete()
            except ProtectedError:  # evidence rows protect the pilot; they name this module's own pilot only
                pass


@pytest.fixture(scope="session")
def real_servers(real_site):
    """The recompute arm and the LMCache cache arm, deployed together by deploy_arm; torn down after."""
    from runners.models import Job
    from runners.teardown import teardown_arm
    from tests.real.flow import ARMS, deploy, start_both_arms

    site = real_site
    with site.blocker.unblock():
        futures = start_both_arms(lambda arm: deploy(site, arm))
        try:
            concurrent.futures.wait(futures.values())
        except BaseException:
            # Stopped while the servers start (pytest's timeout, Ctrl-C): each deploy stops at its next look at
            # /health, as a canceled run's does, and tears its server down before this fixture gives up.
            Job.objects.filter(pk__in=[site.jobs[arm].pk for arm in ARMS]).update(cancel_requested=True)
            concurrent.futures.wait(futures.values(), timeout=600)
            raise
        deployments = {}
        errors = []
        for arm, future in futures.items():
            try:
                deployments[arm] = future.result()
            except Exception as exc:  # noqa: BLE001 — both arms are torn down before the failure is raised
                errors.append(f"{arm}: {exc}")
        try:
            if errors:
                raise AssertionError("deploying the real servers failed: " + "; ".join(errors))
            yield SimpleNamespace(site=site, **deployments)
        finally:
            for deployment in deployments.values():
                if not deployment.torn_down:
                    teardown_arm(site.jobs[deployment.arm], None, site.node, deployment)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Mark the tier, give each of its tests the tier's timeout (TEST_TIMEOUT_S), and run it last: its session-wide
    pilot, site and credential are committed rows, which the other tests (counting credentials, re-encrypting them)
    must never see."""
    real = [item for item in items if "/tests/real/" in str(item.fspath)]
    for item in real:
        item.add_marker(pytest.mark.real_engine)
        item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))
    items[:] = [item for item in items if item not in real] + real


__all__ = ["SSHD", "Sshd", "_free_port", "os"]
