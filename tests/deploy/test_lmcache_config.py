"""The rendered LMCache YAML: keys and types LMCache's config loader takes; every LMCache arm runs the DRAM tier and
the internal API server on loopback; the two disk arms differ only in the path; the dram arm has no disk tier."""
from __future__ import annotations

import pytest
import yaml

from runners.config import default_simulated, validate_deployment
from runners.lmcache import render_lmcache_config

# Keys and types from LMCache's lmcache/v1/config.py (_CONFIG_DEFINITIONS) that fxpilot writes.
LMCACHE_TYPES = {"chunk_size": int, "local_cpu": bool, "max_local_cpu_size": float, "local_disk": str,
                 "max_local_disk_size": float, "remote_url": str, "remote_serde": str, "extra_config": dict,
                 "pre_caching_hash_algorithm": str, "internal_api_server_enabled": bool,
                 "internal_api_server_host": str, "internal_api_server_port_start": int}


@pytest.fixture
def settings():
    return validate_deployment(default_simulated()).with_home("/home/fxpilot")


def rendered(settings, arm, **kwargs) -> dict:
    return yaml.safe_load(render_lmcache_config(settings, arm, run_id="abc123", **kwargs))


@pytest.mark.parametrize("arm", ["dram", "local_nvme", "fx"])
def test_each_key_is_one_lmcache_knows_with_its_type(settings, arm):
    config = rendered(settings, arm, share_pool=True)
    assert set(config) <= set(LMCACHE_TYPES)
    for key, value in config.items():
        assert isinstance(value, LMCACHE_TYPES[key]), key


def test_the_cache_arms_differ_only_in_where_the_files_live(settings):
    local, fx = rendered(settings, "local_nvme"), rendered(settings, "fx")
    assert local.pop("local_disk") == "file:///home/fxpilot/mnt/nvme0/fxpilot/kv/abc123/"
    assert fx.pop("local_disk") == "file:///home/fxpilot/mnt/fx/fxpilot/kv/abc123/"
    # each arm has its own run of internal API ports (runners.config.ARM_PORT_OFFSETS × (1 + TP) from ports.lmcache_api)
    assert (local.pop("internal_api_server_port_start"), fx.pop("internal_api_server_port_start")) == (7000 + 9, 7000 + 18)
    assert local == fx == {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 1.0, "max_local_disk_size": 200.0,
                           "pre_caching_hash_algorithm": "sha256_cbor", "extra_config": {"use_odirect": True},
                           "internal_api_server_enabled": True, "internal_api_server_host": "127.0.0.1"}


def test_the_dram_arm_is_lmcache_with_its_dram_tier_only(settings):
    dram = rendered(settings, "dram", share_pool=True)
    assert dram == {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 1.0,
                    "pre_caching_hash_algorithm": "sha256_cbor", "internal_api_server_enabled": True,
                    "internal_api_server_host": "127.0.0.1", "internal_api_server_port_start": 7000 + 27}
    from runners.lmcache import cache_dirs

    assert cache_dirs(settings, "dram", "abc123") == (None, None)


def test_the_dram_size_is_the_settings_and_the_api_ports_the_deploys(settings):
    from dataclasses import replace

    from runners.lmcache import api_urls

    big = replace(settings, sizes=replace(settings.sizes, max_local_cpu_size=48.0))
    config = rendered(big, "fx", api_port_start=23000)
    assert config["max_local_cpu_size"] == 48.0 and config["internal_api_server_port_start"] == 23000
    # the scheduler listens on the start port, worker w on start + 1 + w: the URLs are the workers' (they own a cache)
    assert api_urls(23000, 2) == ["http://127.0.0.1:23001", "http://127.0.0.1:23002"]
    with pytest.raises(ValueError, match="no room"):
        render_lmcache_config(settings, "fx", api_port_start=65530)


def test_the_production_default_dram_size_is_tens_of_gib_per_rank():
    from runners.config import MAX_LOCAL_CPU_SIZE_DEFAULT

    data = default_simulated()
    del data["sizes"]
    assert validate_deployment(data).sizes.max_local_cpu_size == MAX_LOCAL_CPU_SIZE_DEFAULT == 32.0


def test_disk_io_threads_are_rendered_when_set(settings):
    data = default_simulated() | {"lmcache": {"disk_io_threads": 8}}
    threaded = validate_deployment(data).with_home("/home/fxpilot")
    assert rendered(threaded, "fx")["extra_config"] == {"use_odirect": True, "disk_io_threads": 8}
    assert "extra_config" not in rendered(threaded, "dram")


def test_the_shared_pool_is_the_fs_remote_backend_on_the_fx_mount(settings):
    config = rendered(settings, "fx", share_pool=True)
    assert config["remote_url"] == "fs://localhost:0/home/fxpilot/mnt/fx/fxpilot-shared/abc123"
    assert config["remote_serde"] == "naive"
    assert "remote_url" not in rendered(settings, "local_nvme", share_pool=True)


def test_recompute_renders_no_lmcache_settings(settings):
    assert rendered(settings, "recompute") is None
    assert "without a KV connector" in render_lmcache_config(settings, "recompute")


def test_a_page_cache_drop_instead_of_odirect_is_written_as_such():
    data = default_simulated() | {"use_odirect": False, "drop_page_cache": True}
    settings = validate_deployment(data).with_home("/home/fxpilot")
    assert rendered(settings, "fx")["extra_config"] == {"use_odirect": False}
    assert settings.page_cache_method == "drop_caches"


def test_a_simulated_deployment_says_so(settings):
    assert "# simulated: true" in render_lmcache_config(settings, "fx", simulated=True)


def test_home_paths_must_be_resolved_before_rendering():
    with pytest.raises(ValueError, match="with_home"):
        render_lmcache_config(validate_deployment(default_simulated()), "fx")


@pytest.mark.parametrize("arm", ["local_nvme", "fx"])
def test_the_simulated_servers_lmcache_reader_takes_the_rendered_file(settings, arm, tmp_path):
    from runners.sim.config import read_lmcache

    path = tmp_path / "lmcache.yaml"
    path.write_text(render_lmcache_config(settings, arm, run_id="abc123", share_pool=True, simulated=True))
    read = read_lmcache({"LMCACHE_CONFIG_FILE": str(path)})
    root = "/home/fxpilot/mnt/nvme0/fxpilot" if arm == "local_nvme" else "/home/fxpilot/mnt/fx/fxpilot"
    assert str(read.local_disk) == f"{root}/kv/abc123"
    assert read.use_odirect is True and read.chunk_size == 256 and read.max_local_cpu_size == 1.0
    assert read.local_cpu is True
    assert read.fs_pool == (None if arm == "local_nvme" else type(read.local_disk)("/home/fxpilot/mnt/fx/fxpilot-shared/abc123"))


def test_retrievals_are_the_arms_tier_only_when_no_other_tier_can_answer(settings):
    # LMCache names no tier in its retrieval lines: only a configuration without LMCache's DRAM tier attributes them;
    # the arms fxpilot renders run the DRAM tier, so the device counters attribute, not the configuration
    from runners.lmcache import render_lmcache_config, retrieval_tier

    for arm in ("dram", "fx", "local_nvme"):
        assert retrieval_tier(arm, render_lmcache_config(settings, arm, run_id="abc123")) is None
    without_dram = render_lmcache_config(settings, "fx", run_id="abc123").replace("local_cpu: true", "local_cpu: false")
    assert retrieval_tier("fx", without_dram) == "fx"
    with_dram = without_dram.replace("local_cpu: false", "local_cpu: true")
    assert retrieval_tier("fx", with_dram) is None
    assert retrieval_tier("fx", with_dram.replace("local_cpu: true\n", "")) is None  # LMCache's default is true
    assert retrieval_tier("fx", "local_cpu: false\nlocal_disk: file:///x/\nremote_url: redis://h:6379\n") is None
    assert retrieval_tier("recompute", "local_cpu: false\nlocal_disk: file:///x/\n") is None
    assert retrieval_tier("fx", None) is None
