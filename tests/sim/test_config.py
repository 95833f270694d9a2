"""The server refuses a configuration LMCache or vLLM would refuse, and says what and where."""
import subprocess
import sys

import pytest

from runners.sim.config import ConfigError, parse_serve, read_lmcache
from tests.sim.conftest import MODEL, REPO, TRANSFER


def serve(argv, environ):
    return parse_serve([MODEL, "--tensor-parallel-size", "8", *argv], environ)


def test_an_unknown_key_in_the_yaml_names_the_key_and_the_known_ones(tmp_path):
    config = tmp_path / "lmcache.yaml"
    config.write_text("chunk_size: 256\nlocal_disks: file:///tmp/x\n")
    with pytest.raises(ConfigError) as error:
        read_lmcache({"LMCACHE_CONFIG_FILE": str(config)})
    message = str(error.value)
    assert "'local_disks'" in message and str(config) in message and "local_disk," in message


def test_an_unknown_lmcache_variable_is_refused():
    with pytest.raises(ConfigError, match="LMCACHE_CHUNK_SIZ.*unknown LMCache configuration key 'chunk_siz'"):
        read_lmcache({"LMCACHE_CHUNK_SIZ": "256"})


def test_environment_variables_override_the_file_and_are_typed(tmp_path):
    config = tmp_path / "lmcache.yaml"
    config.write_text("chunk_size: 256\nlocal_cpu: true\n")
    settings = read_lmcache({"LMCACHE_CONFIG_FILE": str(config), "LMCACHE_CHUNK_SIZE": "512",
                             "LMCACHE_LOCAL_CPU": "False", "LMCACHE_EXTRA_CONFIG": '{"use_odirect": true}'})
    assert settings.chunk_size == 512 and settings.local_cpu is False and settings.use_odirect is True


def test_bad_values_name_their_source(tmp_path):
    config = tmp_path / "lmcache.yaml"
    config.write_text("chunk_size: many\n")
    with pytest.raises(ConfigError, match=r"lmcache.yaml: chunk_size='many' is not an integer"):
        read_lmcache({"LMCACHE_CONFIG_FILE": str(config)})
    config.write_text("chunk_size: [1\n")
    with pytest.raises(ConfigError, match=r"lmcache.yaml, line 2: not valid YAML"):
        read_lmcache({"LMCACHE_CONFIG_FILE": str(config)})
    with pytest.raises(ConfigError, match="cannot read it"):
        read_lmcache({"LMCACHE_CONFIG_FILE": str(tmp_path / "missing.yaml")})


def test_both_spellings_of_the_fs_pool_are_understood():
    legacy = read_lmcache({"LMCACHE_REMOTE_URL": "fs://localhost:0/mnt/fx/lmcache"})
    plugin = read_lmcache({"LMCACHE_REMOTE_STORAGE_PLUGINS": '["fs"]',
                           "LMCACHE_EXTRA_CONFIG": '{"remote_storage_plugin.fs.base_path": "/mnt/fx/lmcache"}'})
    assert str(legacy.fs_pool) == str(plugin.fs_pool) == "/mnt/fx/lmcache"
    with pytest.raises(ConfigError, match="implements the fs:// backend"):
        read_lmcache({"LMCACHE_REMOTE_URL": "redis://localhost:6379"})


def test_a_disk_path_that_is_not_on_the_node_is_refused(node):
    environ = {"FXPILOT_SIM_ROOT": str(node.root), "LMCACHE_LOCAL_DISK": "file:///nonexistent/fx/lmcache",
               "LMCACHE_MAX_LOCAL_DISK_SIZE": "10"}
    with pytest.raises(ConfigError, match="LMCache local_disk: /nonexistent/fx/lmcache is not on this node"):
        serve(["--kv-transfer-config", TRANSFER], environ)


def test_a_path_on_the_fx_mount_point_is_refused_while_fx_is_not_mounted(node):
    node.unmount_fx()
    environ = {"FXPILOT_SIM_ROOT": str(node.root), "LMCACHE_LOCAL_DISK": f"file://{node.fx}/lmcache",
               "LMCACHE_MAX_LOCAL_DISK_SIZE": "10"}
    with pytest.raises(ConfigError, match="FX is not mounted on node node1"):
        serve(["--kv-transfer-config", TRANSFER], environ)


def test_the_vllm_command_line_is_checked(node, tmp_path):
    environ = {"FXPILOT_SIM_ROOT": str(node.root)}
    with pytest.raises(ConfigError, match="kv_connector='NixlConnector'"):
        serve(["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'], environ)
    with pytest.raises(ConfigError, match="unrecognized arguments: --no-such-flag"):
        serve(["--no-such-flag"], environ)
    with pytest.raises(ConfigError, match="model path .* does not exist"):
        parse_serve([str(tmp_path / "weights")], environ)
    config = serve(["--no-enable-prefix-caching", "--trust-remote-code", "--max-num-seqs", "64"], environ)
    assert config.lmcache is None and not config.prefix_caching and config.time_scale == 0.0005


def test_the_serve_command_exits_with_the_reason(tmp_path):
    config = tmp_path / "lmcache.yaml"
    config.write_text("chunk_size: 256\nbogus: 1\n")
    result = subprocess.run([sys.executable, "-m", "runners.sim", "serve", MODEL, "--kv-transfer-config", TRANSFER],
                            env={"PATH": "/usr/bin:/bin", "LMCACHE_CONFIG_FILE": str(config)}, cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "unknown LMCache configuration key 'bogus'" in result.stderr


def test_without_a_state_file_paths_are_local_unless_named_as_fx(tmp_path, capsys):
    fx = tmp_path / "fx"
    environ = {"FXPILOT_SIM_ROOT": str(tmp_path / "nowhere"), "FXPILOT_SIM_FX_PATHS": str(fx)}
    config = serve(["--sim-time-scale", "0.5"], environ)
    assert "no readable state.json" in capsys.readouterr().err
    assert config.node.storage_kind(fx / "lmcache") == "fx"
    assert config.node.storage_kind(tmp_path / "nvme") == "local_nvme"
    assert config.node.fx_up() and config.time_scale == 0.5
