"""The deployment settings validator: defaults, every field checked, errors naming the field."""
from __future__ import annotations

import pytest

from runners.config import DEFAULT_SIMULATED, DeploymentSettingsError, default_simulated, validate_deployment


def settings_with(path: str, value):
    data = default_simulated()
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


def refused(path: str, value) -> DeploymentSettingsError:
    with pytest.raises(DeploymentSettingsError) as caught:
        validate_deployment(settings_with(path, value))
    return caught.value


def test_the_simulated_defaults_validate_with_the_published_sizes():
    settings = validate_deployment(DEFAULT_SIMULATED)
    assert settings.tensor_parallel_size == 8
    assert settings.sizes.chunk_size == 256
    assert settings.fx_target.service_id == 4420
    assert settings.page_cache_method == "odirect"
    assert settings.ports.for_arm("fx") == 0


def test_defaults_fill_what_a_real_site_leaves_out():
    settings = validate_deployment({"model": "/models/qwen3", "fx_target": {"address": "10.0.0.5",
                                                                           "nqn": "nqn.2026-01.com.fx:pool0"}})
    assert settings.ports.for_arm("recompute") == 8000
    assert settings.ports.for_arm("local_nvme") == 8001
    assert settings.ports.for_arm("fx") == 8002
    assert settings.health_timeout_s == 1800
    assert settings.mkfs_if_empty is False


def test_a_per_arm_port_overrides_the_base():
    data = settings_with("ports", {"base": 9000, "arms": {"fx": 9100}})
    settings = validate_deployment(data)
    assert settings.ports.for_arm("fx") == 9100
    assert settings.ports.for_arm("local_nvme") == 9001


def test_home_paths_expand_under_the_ssh_users_home():
    settings = validate_deployment(DEFAULT_SIMULATED).with_home("/srv/sim/node1")
    assert settings.paths.fx_mount == "/srv/sim/node1/mnt/fx"
    assert settings.paths.run_root == "/srv/sim/node1/fxpilot-runs"


@pytest.mark.parametrize("path, value, field", [
    ("model", "not a model", "model"),
    ("model", "../etc/passwd", "model"),
    ("tensor_parallel_size", "8", "tensor_parallel_size"),
    ("tensor_parallel_size", 0, "tensor_parallel_size"),
    ("ports.base", 70000, "ports.base"),
    ("ports.base", 22, "ports.base"),
    ("ports.arms", {"gpu": 9000}, "ports.arms.gpu"),
    ("paths.fx_mount", "mnt/fx", "paths.fx_mount"),
    ("paths.run_root", "~/runs/../../etc", "paths.run_root"),
    ("paths.shared_pool", "/srv/pool", "paths.shared_pool"),
    ("paths.local_nvme_path", "~/mnt/fx/local", "paths.local_nvme_path"),
    ("sizes.chunk_size", 3.5, "sizes.chunk_size"),
    ("sizes.max_local_cpu_size", 500.0, "sizes.max_local_cpu_size"),
    ("sizes.max_local_disk_size", -1, "sizes.max_local_disk_size"),
    ("use_odirect", "yes", "use_odirect"),
    ("fx_target.transport", "tcp", "fx_target.transport"),
    ("fx_target.address", "not_a host!", "fx_target.address"),
    ("fx_target.service_id", 0, "fx_target.service_id"),
    ("fx_target.nqn", "iqn.2001-04.com.example:disk", "fx_target.nqn"),
    ("fx_target.host_nqn", "nqn.2014-08.org.nvmexpress:uuid:x y", "fx_target.host_nqn"),
    ("fx_target.fstype", "btrfs", "fx_target.fstype"),
    ("mkfs_if_empty", 1, "mkfs_if_empty"),
    ("roce_interface", "eth0; reboot", "roce_interface"),
    ("health_timeout_s", -5, "health_timeout_s"),
    ("health_timeout_s", 3600, "health_timeout_s"),
    ("launcher", {"prefix": ["env", "LD_PRELOAD=/tmp/x.so"]}, "launcher.prefix[1]"),
    ("launcher", {"env": {"PYTHONHASHSEED": "1"}}, "launcher.env.PYTHONHASHSEED"),
    ("launcher", {"prefix": ["docker", "run", "-ePYTHONHASHSEED=random", "img"]}, "launcher.prefix[2]"),
    ("launcher", {"prefix": ["docker", "run", "-e", "VLLM_PLUGINS=evil", "img"]}, "launcher.prefix[3]"),
    ("launcher", {"prefix": ["docker", "run", "--env=LMCACHE_CONFIG_FILE=/x", "img"]}, "launcher.prefix[2]"),
    ("launcher", {"prefix": ["podman", "run", "-eVLLM_SERVER_DEV_MODE=1", "img"]}, "launcher.prefix[2]"),
    ("extra_vllm_flags", "--enforce-eager", "extra_vllm_flags"),
    ("extra_vllm_flags", ["--port=9"], "extra_vllm_flags[0]"),
    ("extra_vllm_flags", ["--max-model-len", "131072", "4096"], "extra_vllm_flags[2]"),
    ("colour", "blue", "colour"),
])
def test_each_bad_value_is_refused_naming_its_field(path, value, field):
    error = refused(path, value)
    assert error.field == field
    assert str(error).startswith(f"deployment.{field}:")


@pytest.mark.parametrize("path, value", [
    ("model", "Qwen/Qwen3; rm -rf ~"),
    ("model", "/models/$(reboot)"),
    ("paths.fx_mount", "/mnt/fx`id`"),
    ("paths.run_root", "~/runs\nrm -rf /"),
    ("fx_target.address", "10.0.0.1 && halt"),
    ("fx_target.nqn", "nqn.2026-01.com.fx:pool0'$(id)'"),
    ("extra_vllm_flags", ["--served-model-name=$(id)"]),
    ("extra_vllm_flags", ["--max-model-len", "1;id"]),
])
def test_a_hostile_shell_value_never_passes_the_validator(path, value):
    refused(path, value)


def test_a_prefix_may_set_an_ordinary_variable_and_docker_options():
    settings = validate_deployment(settings_with("launcher", {"prefix": [
        "docker", "run", "--rm", "--network=host", "-e", "HIP_VISIBLE_DEVICES=0,1", "rocm/vllm:latest"]}))
    assert settings.launcher.prefix[-2:] == ("HIP_VISIBLE_DEVICES=0,1", "rocm/vllm:latest")


def test_the_health_wait_ends_before_the_deploy_steps_time_limit():
    from runners.config import HEALTH_TIMEOUT_MAX_S
    from runners.kinds import get_kind

    assert HEALTH_TIMEOUT_MAX_S + 300 <= get_kind("deploy").soft_time_limit
    assert validate_deployment(settings_with("health_timeout_s", HEALTH_TIMEOUT_MAX_S)).health_timeout_s == 3000


def test_turning_off_both_odirect_and_the_page_cache_drop_is_refused():
    data = settings_with("use_odirect", False)
    data["drop_page_cache"] = False
    with pytest.raises(DeploymentSettingsError, match="page cache") as caught:
        validate_deployment(data)
    assert caught.value.field == "use_odirect"


def test_empty_settings_say_what_to_do():
    with pytest.raises(DeploymentSettingsError, match="no deployment settings"):
        validate_deployment({})


def test_allowed_extra_flags_pass_as_given():
    data = settings_with("extra_vllm_flags", ["--max-model-len", "131072", "--enforce-eager", "--gpu-memory-utilization=0.9"])
    assert validate_deployment(data).extra_vllm_flags == ("--max-model-len", "131072", "--enforce-eager",
                                                          "--gpu-memory-utilization=0.9")


def test_values_reach_bash_exactly_as_given_and_never_run(tmp_path):
    import subprocess

    from runners.config import shell_env_file

    hostile = {"A": "$(touch pwned)", "B": "it's `id` & \"quoted\"", "C": ["--x", "a b", "$HOME"], "D": None, "E": True}
    env = tmp_path / "params.env"
    env.write_text(shell_env_file(hostile))
    out = subprocess.run(["bash", "-c", f'source {env}; printf "%s|" "$A" "$B" "${{C[@]}}" "$D" "$E"'], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out == "$(touch pwned)|it's `id` & \"quoted\"|--x|a b|$HOME||1|"
    assert not (tmp_path / "pwned").exists()


def test_a_line_break_never_reaches_the_env_file():
    from runners.config import shell_env_file

    with pytest.raises(ValueError, match="line break"):
        shell_env_file({"A": "x\nrm -rf /"})


def test_saved_settings_validate_again_unchanged():
    settings = validate_deployment(DEFAULT_SIMULATED)
    assert validate_deployment(settings.to_dict()) == settings
