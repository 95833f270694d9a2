"""deploy.sh on a simulated node's sandbox: preflight checks, the manifest, the exact launch of each arm."""
from __future__ import annotations

import json
import socket

import pytest

from runners.config import default_simulated, validate_deployment
from runners.lmcache import CHUNK_HASH_ALGORITHM, LMCACHE_TROUBLE, PYTHONHASHSEED, cache_dirs, render_lmcache_config


def arm_params(sandbox, arm: str, **overrides) -> str:
    settings = validate_deployment(default_simulated()).with_home(str(sandbox.root))
    arm_dir = sandbox.root / "runs" / "r1" / arm
    arm_dir.mkdir(parents=True, exist_ok=True)
    disk_dir, pool_dir = cache_dirs(settings, arm, "r1")
    config = None
    if arm != "recompute":
        config = str(arm_dir / "lmcache.yaml")
        (arm_dir / "lmcache.yaml").write_text(render_lmcache_config(settings, arm, run_id="r1", simulated=True))
    values = {
        "RUN_ID": "r1", "ARM": arm, "NODE": "node1", "SIMULATED": True, "MODEL": settings.model, "TP": 8, "PORT": 0,
        "CACHE_DIR": disk_dir, "SHARED_DIR": None, "KV_CONFIG_PATH": config, "USE_ODIRECT": True,
        "DROP_PAGE_CACHE": False, "PAGE_CACHE_METHOD": "odirect", "MAX_LOCAL_DISK_SIZE": 200.0,
        "EXTRA_VLLM_FLAGS": ["--max-model-len", "131072"], "SIM_TIME_SCALE": 0.001,
        "CHUNK_HASH": CHUNK_HASH_ALGORITHM if config else "", "HASH_SEED": PYTHONHASHSEED, "LMCACHE_FAILED": LMCACHE_TROUBLE,
    }
    values.update(overrides)
    sandbox.write_env(f"runs/r1/{arm}/params.env", values)
    return str(arm_dir)


@pytest.fixture
def echo_vllm(tmp_path):
    """A vllm that prints its command line and the environment deploy.sh gave it, then exits."""
    shim = tmp_path / "echo-vllm"
    shim.mkdir()
    (shim / "vllm").write_text(
        "#!/usr/bin/env bash\n"
        "[[ $1 == --version ]] && { echo 0.20.1+rocm721; exit 0; }\n"
        "python3 -c 'import json, os, sys; print(json.dumps({\"argv\": sys.argv[1:], \"env\": {k: os.environ.get(k) "
        "for k in (\"LMCACHE_CONFIG_FILE\", \"VLLM_SERVER_DEV_MODE\", \"PROMETHEUS_MULTIPROC_DIR\", "
        "\"FXPILOT_SIM_TIME_SCALE\", \"PYTHONHASHSEED\")}}))' \"$@\"\n")
    (shim / "vllm").chmod(0o755)
    return shim


def test_preflight_picks_a_port_and_writes_the_manifest_with_versions(sandbox):
    arm_dir = arm_params(sandbox, "fx")
    result = sandbox.run("deploy.sh", "preflight", arm_dir)
    assert result.returncode == 0, result.stderr
    port = int(result.stdout.split("FXPILOT_PORT=")[1].split()[0])
    manifest = json.loads((sandbox.root / "runs" / "r1" / "fx" / "manifest.json").read_text())
    assert manifest["port"] == port and manifest["simulated"] is True
    assert manifest["versions"]["vllm"] == "0.20.1+rocm721"
    assert manifest["versions"]["rocm"] == "7.2.1"
    assert manifest["versions"]["lmcache"] == {"version": "0.3.15.dev12", "commit": "4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39",
                                               "hip": True}
    assert manifest["page_cache"] == {"use_odirect": True, "drop_page_cache": False, "method": "odirect"}
    assert manifest["kv_connector"] == "LMCacheConnectorV1"
    # one stated chunk hash: the algorithm the YAML names and the seed every process gets
    assert manifest["chunk_hash"] == {"algorithm": "sha256_cbor", "pythonhashseed": "0"}
    assert manifest["environment"]["PYTHONHASHSEED"] == "0"
    assert manifest["command"][:4] == ["vllm", "serve", "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "--tensor-parallel-size"]
    assert (sandbox.root / "mnt" / "fx" / "fxpilot" / "kv" / "r1").is_dir()
    assert manifest["cache_device"] == "/dev/nvme1n1"
    assert manifest["cache_mount"] == str(sandbox.root / "mnt" / "fx")


def test_a_port_in_use_fails_with_the_reason(sandbox):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "local_nvme", PORT=port))
    finally:
        holder.close()
    assert result.returncode != 0
    assert f"port {port} is already in use" in result.stderr


def test_a_missing_model_path_fails_with_the_reason(sandbox):
    result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "recompute", MODEL=str(sandbox.root / "models" / "none")))
    assert result.returncode != 0
    assert "model path" in result.stderr and "does not exist" in result.stderr


@pytest.mark.parametrize("arm", ["recompute", "local_nvme", "fx"])
def test_each_arm_launches_vllm_as_the_published_test_did(sandbox, echo_vllm, arm):
    arm_dir = arm_params(sandbox, arm)
    assert sandbox.run("deploy.sh", "preflight", arm_dir, extra_path=echo_vllm).returncode == 0
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=echo_vllm)
    assert served.returncode == 0, served.stderr
    launch = json.loads(served.stdout.strip().splitlines()[-1])
    port = (sandbox.root / "runs" / "r1" / arm / "port").read_text().strip()
    assert launch["argv"][:9] == ["serve", "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "--tensor-parallel-size", "8",
                                  "--host", "127.0.0.1", "--port", port, "--enable-prompt-tokens-details"]
    assert launch["argv"][-2:] == ["--max-model-len", "131072"]
    assert launch["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert launch["env"]["PROMETHEUS_MULTIPROC_DIR"] == f"{arm_dir}/prometheus"
    assert launch["env"]["FXPILOT_SIM_TIME_SCALE"] == "0.001"
    assert launch["env"]["PYTHONHASHSEED"] == "0"      # every arm: vLLM seeds its first block hash from it
    if arm == "recompute":
        assert "--kv-transfer-config" not in launch["argv"] and "--no-enable-prefix-caching" in launch["argv"]
        assert launch["env"]["LMCACHE_CONFIG_FILE"] is None
    else:
        index = launch["argv"].index("--kv-transfer-config")
        assert json.loads(launch["argv"][index + 1]) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        assert launch["env"]["LMCACHE_CONFIG_FILE"] == f"{arm_dir}/lmcache.yaml"


def test_cleanup_removes_only_this_runs_cache(sandbox):
    arm_dir = arm_params(sandbox, "local_nvme")
    assert sandbox.run("deploy.sh", "preflight", arm_dir).returncode == 0
    kept = sandbox.root / "mnt" / "nvme0" / "fxpilot" / "kv" / "older-run"
    kept.mkdir(parents=True)
    assert sandbox.run("deploy.sh", "cleanup", arm_dir).returncode == 0
    assert not (sandbox.root / "mnt" / "nvme0" / "fxpilot" / "kv" / "r1").exists()
    assert kept.is_dir()


@pytest.mark.parametrize(("prefix", "expected"), [
    (["docker", "run", "--rm", "--network=host", "rocm/vllm:x"],
     ["docker", "run", "-e", "PYTHONHASHSEED", "--rm", "--network=host", "rocm/vllm:x"]),
    (["SHIM/podman", "run", "-e", "PYTHONHASHSEED", "img"], ["SHIM/podman", "run", "-e", "PYTHONHASHSEED", "img"]),
    (["sudo", "-n", "nerdctl", "--namespace=k8s", "run", "img"],
     ["sudo", "-n", "nerdctl", "--namespace=k8s", "run", "-e", "PYTHONHASHSEED", "img"]),
    (["env", "X=1"], ["env", "X=1"]),
])
def test_a_container_launcher_is_given_the_hash_seed(sandbox, echo_vllm, tmp_path, prefix, expected):
    """A container does not inherit the shell's PYTHONHASHSEED: `docker|podman|nerdctl … run` is given `-e
    PYTHONHASHSEED` unless the prefix passes it on already; the prefix runs (here a shim that prints its argv)."""
    shim = tmp_path / "shims"
    shim.mkdir()
    for name in ("docker", "podman", "nerdctl", "sudo", "env"):
        (shim / name).write_text("#!/usr/bin/env bash\npython3 -c 'import json, os, sys; print(json.dumps("
                                 "{\"argv\": sys.argv[1:], \"seed\": os.environ.get(\"PYTHONHASHSEED\")}))' \"$0\" \"$@\"\n")
        (shim / name).chmod(0o755)
    prefix = [word.replace("SHIM", str(shim)) for word in prefix]
    arm_dir = arm_params(sandbox, "local_nvme", LAUNCH_KIND="prefix", LAUNCH_PREFIX=prefix)
    (sandbox.root / "runs" / "r1" / "local_nvme" / "port").write_text("8123\n")
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=shim)
    assert served.returncode == 0, served.stderr
    launch = json.loads(served.stdout.strip().splitlines()[-1])
    words = [launch["argv"][0].rsplit("/", 1)[-1], *launch["argv"][1:]]
    assert words[:len(expected)] == [expected[0].rsplit("/", 1)[-1], *expected[1:]]
    assert words[len(expected):len(expected) + 2] == ["vllm", "serve"]
    assert launch["seed"] == "0"


@pytest.mark.parametrize("line", [
    "(EngineCore pid=77) \x1b[33;20m[2026-12-01 21:59:01,002] LMCache WARNING:\x1b[0m Using builtin hash without "
    "PYTHONHASHSEED set. For production environments (non-testing scenarios), you MUST set PYTHONHASHSEED to ensure "
    "consistent hashing across processes. Example: export PYTHONHASHSEED=0 \x1b[3m(token_database.py:170)\x1b[0m",
    "[2026-12-01 21:59:01,001] LMCache WARNING: Could not load 'builtin' from vLLM. Using builtin hash. This may "
    "cause inconsistencies in distributed caching. (token_database.py:162:lmcache.v1.token_database)",
    "(Worker pid=5355) WARNING 12-01 21:59:00 [kv_cache_utils.py:100] PYTHONHASHSEED is not set. This will lead to "
    "non-reproducible block-hashes when using CBOR-based hash functions such as sha256_cbor or xxhash_cbor.",
])
def test_health_refuses_a_server_whose_chunk_hash_is_not_the_stated_one(sandbox, line):
    """LMCache's own warnings (LMCache 0.5.6, lmcache/v1/token_database.py) and vLLM's (init_none_hash): such a
    server stores chunks under keys no other process makes, so it would never hit: exit 5, the line quoted."""
    import http.server
    import threading

    arm_dir = arm_params(sandbox, "local_nvme")
    server = http.server.HTTPServer(("127.0.0.1", 0), type("H", (http.server.BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.end_headers()), "log_message": lambda *a: None}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        folder = sandbox.root / "runs" / "r1" / "local_nvme"
        (folder / "port").write_text(f"{server.server_address[1]}\n")
        (folder / "server").mkdir(exist_ok=True)
        (folder / "server" / "stdout").write_text("INFO starting\n")
        (folder / "server" / "stderr").write_text("INFO loading\n" + line + "\n")
        result = sandbox.run("deploy.sh", "health", arm_dir, "10")
        assert result.returncode == 5, (result.stdout, result.stderr)
        assert "LMCache failed to initialise" in result.stderr
        assert any(part in result.stderr for part in ("Using builtin hash without PYTHONHASHSEED set",
                                                      "Could not load 'builtin' from vLLM", "PYTHONHASHSEED is not set"))
        assert "\x1b" not in result.stderr
        (folder / "server" / "stderr").write_text("INFO loading\nLMCache INFO: Loaded 'sha256_cbor' from vllm.utils.hashing\n")
        assert sandbox.run("deploy.sh", "health", arm_dir, "10").returncode == 0
    finally:
        server.shutdown()


def test_deploy_sh_refuses_params_without_a_hash_seed_or_failure_lines(sandbox):
    for missing in ("HASH_SEED", "LMCACHE_FAILED"):
        result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "fx", **{missing: ""}))
        assert result.returncode == 1 and missing in result.stderr, result.stderr


@pytest.fixture
def immutable(sandbox):
    """A directory nobody, root included, may create files in (chattr +i); made writable again after the test."""
    import shutil
    import subprocess

    made = []

    def make(path):
        path.mkdir(parents=True, exist_ok=True)
        if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here")
        made.append(path)
        return path

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_a_kv_directory_lmcache_could_not_write_fails_preflight_with_what_the_write_said(sandbox, immutable):
    """LMCache 0.5.6 drops a chunk whose disk write fails without a log line: preflight writes one block the way
    LMCache would (O_DIRECT when use_odirect) and fails quoting the error."""
    immutable(sandbox.root / "mnt" / "nvme0" / "fxpilot" / "kv" / "r1")
    result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "local_nvme"))
    assert result.returncode == 1
    assert "LMCache cannot write its KV files to" in result.stderr and "with O_DIRECT" in result.stderr
    assert "Operation not permitted" in result.stderr, result.stderr
    assert not (sandbox.root / "runs" / "r1" / "local_nvme" / "manifest.json").exists()


def test_drop_page_cache_needs_a_user_who_can_drop_it_without_sudo(sandbox, tmp_path):
    """The client drops the page cache as the SSH user without sudo: preflight refuses drop_page_cache when that user
    cannot write drop_caches (here a stand-in file made immutable), whatever sudo would allow."""
    import subprocess

    stand_in = tmp_path / "drop_caches"
    stand_in.write_text("0\n")
    if subprocess.run(["chattr", "+i", str(stand_in)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        sandbox.env["FXPILOT_DROP_CACHES"] = str(stand_in)
        result = sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "local_nvme", USE_ODIRECT=False,
                                                                    DROP_PAGE_CACHE=True, PAGE_CACHE_METHOD="drop_caches"))
        assert result.returncode == 1
        assert f"cannot write {stand_in}, and the workload client drops the page cache" in result.stderr, result.stderr
        subprocess.run(["chattr", "-i", str(stand_in)], check=True)
        assert sandbox.run("deploy.sh", "preflight", arm_params(sandbox, "local_nvme", USE_ODIRECT=False,
                                                                DROP_PAGE_CACHE=True,
                                                                PAGE_CACHE_METHOD="drop_caches")).returncode == 0
    finally:
        subprocess.run(["chattr", "-i", str(stand_in)], check=False)


def test_g4s_recompute_arm_keeps_vllms_own_prefix_cache_when_asked(sandbox, echo_vllm):
    """Issue 44, item 3: G4's baseline is vLLM as a customer runs it without a KV tier (PREFIX_CACHING=1 from
    deploy_arm(prefix_caching=True)); every other recompute arm runs with the prefix cache off."""
    arm_dir = arm_params(sandbox, "recompute", PREFIX_CACHING=True)
    assert sandbox.run("deploy.sh", "preflight", arm_dir, extra_path=echo_vllm).returncode == 0
    served = sandbox.run("deploy.sh", "serve", arm_dir, extra_path=echo_vllm)
    assert served.returncode == 0, served.stderr
    launch = json.loads(served.stdout.strip().splitlines()[-1])
    assert "--no-enable-prefix-caching" not in launch["argv"] and "--kv-transfer-config" not in launch["argv"]
