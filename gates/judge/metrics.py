"""Metrics: per request, per cell (arm × phase × concurrency × repetition), per node (inventory)."""
from __future__ import annotations

import math
import re

import numpy as np

from gates.judge.lazy import pd
from gates.plan import INVENTORY_METRICS

CELL = ["arm", "phase", "concurrency", "repetition"]
# metrics measured per request (a cell's statistic is taken over its requests) or per repetition
REQUEST_METRICS = {"ttft", "hit_ratio", "error_rate", "goodput"}
REPETITION_METRICS = {"throughput"}
# statistics of time: positive, multiplicative, judged on the log scale over repetitions (≥ 2 needed)
TIMING_METRICS = {"ttft", "throughput"}
PROPORTIONS = {"hit_ratio", "error_rate", "output_match", "external_hit_ratio", "capacity_agreement", "goodput"}
# metrics read from the phase summaries' /metrics deltas, not from the request records
SUMMARY_METRICS = {"external_hit_ratio", "capacity_agreement"}
INVENTORY_ONLY = INVENTORY_METRICS
METRIC_UNITS = {"capacity_agreement": "fraction", "goodput": "fraction", "ttft": "s", "throughput": "tok/s", "error_rate": "fraction", "hit_ratio": "fraction", "external_hit_ratio": "fraction",
                "read_bw": "GB/s", "output_match": "fraction", "gpu_count": "GPUs", "gpu_model_match": "fraction",
                "rocm_version": "version", "versions_recorded": "fraction", "link_speed_gbps": "Gb/s",
                "fx_mounted_writable": "fraction", "fio_read_gbps": "GB/s"}


def latency_start(requests: pd.DataFrame) -> np.ndarray:
    """When each request's latency starts: its send, or for an open-loop request to a real server the time it was
    due (`t_scheduled`, issue 45): a request the client sent late — because its in-flight cap was full while the
    server was slow, or the client could not keep up — counts its wait, so a slow server cannot hide behind a late
    client (coordinated omission). A simulated record's first token is on the simulator's model clock (t_send plus
    the modelled delays, workload.simulated_clock), which a wall-clock lateness cannot be added to: its latency
    starts at the send, and the lateness is bounded by the soak's `schedule-kept` check instead."""
    t_send = requests["t_send"].to_numpy(dtype=np.float64)
    if "t_scheduled" not in requests.columns:
        return t_send
    due = pd.to_numeric(requests["t_scheduled"], errors="coerce").to_numpy(dtype=np.float64)
    real = ~requests["simulated"].to_numpy(dtype=bool)
    use = real & np.isfinite(due) & (due <= t_send)
    return np.where(use, due, t_send)


def derive(requests: pd.DataFrame) -> pd.DataFrame:
    """The judge's working frame: only the columns it computes with, plus ok, failed, ttft (ok requests
    with a first token) and hit (cached ÷ prompt tokens). Same index as the request rows."""
    # a request that says ok but never produced a first token did not answer: it is an error record
    ok = ((requests["status"] == "ok") & requests["t_first_token"].notna()).to_numpy()
    t_send = requests["t_send"].to_numpy()
    start = latency_start(requests)
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.float64)
    cached = requests["cached_tokens"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        hit = np.where(ok & (prompt > 0), cached / prompt, np.nan)
    return pd.DataFrame({
        "arm": requests["arm"], "phase": requests["phase"], "concurrency": requests["concurrency"],
        "repetition": requests["repetition"], "t_send": t_send, "t_end": requests["t_end"].to_numpy(),
        "output_tokens": requests["output_tokens"].to_numpy(), "prompt_tokens": requests["prompt_tokens"].to_numpy(),
        "cached_tokens": cached, "ok": ok, "failed": (~ok).astype(np.float64),
        "ttft": np.where(ok, requests["t_first_token"].to_numpy() - start, np.nan), "hit": hit,
    }, index=requests.index)


def request_values(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """The per-request values of a metric, sorted ascending (missing values left out)."""
    column = {"ttft": "ttft", "hit_ratio": "hit", "error_rate": "failed", "goodput": "good"}[metric]
    values = frame[column].to_numpy(dtype=np.float64)
    return np.sort(values[~np.isnan(values)], kind="stable")


def throughput(frame: pd.DataFrame, concurrency: int | None = None) -> float:
    """A cell's throughput that one request cannot move (judge version 3): the closed loop's clients each keep
    one request in flight, so the cell streams min(concurrency, requests) × the median request's output rate,
    output tokens ÷ (t_end − t_send) over its successful requests. Version 2's Σ tokens ÷ (last t_end − first
    t_send) was set by the single slowest request, and by any clock that disagreed. Each request's rate is read
    on one clock (its own t_send and t_end), so a skewed instance cannot stretch the span either."""
    ok = frame[frame["ok"]] if "ok" in frame else frame
    if len(ok) == 0:
        return math.nan
    spans = (ok["t_end"] - ok["t_send"]).to_numpy(dtype=np.float64)
    tokens = ok["output_tokens"].to_numpy(dtype=np.float64)
    good = spans > 0
    if not good.any():
        return math.nan
    rate = float(np.median(tokens[good] / spans[good]))
    level = concurrency if concurrency is not None else (int(ok["concurrency"].iloc[0]) if "concurrency" in ok
                                                          else len(ok))
    return min(level, len(ok)) * rate


def cell_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per arm × phase × concurrency × repetition, sorted."""
    if len(frame) == 0:
        return pd.DataFrame(columns=CELL + ["n", "n_ok", "ttft_p50", "ttft_p90", "ttft_p99", "ttft_mean",
                                            "throughput", "error_rate", "hit_ratio", "duration_s"])
    groups = frame.groupby(CELL, sort=True, observed=True)
    table = groups.agg(n=("ok", "size"), n_ok=("ok", "sum"), ttft_mean=("ttft", "mean"), error_rate=("failed", "mean"),
                       hit_ratio=("hit", "mean"), tokens=("output_tokens", "sum"), first=("t_send", "min"),
                       last=("t_end", "max"))
    quantiles = groups["ttft"].quantile([0.5, 0.9, 0.99]).unstack()
    table["ttft_p50"], table["ttft_p90"], table["ttft_p99"] = quantiles[0.5], quantiles[0.9], quantiles[0.99]
    table["duration_s"] = table["last"] - table["first"]
    table["throughput"] = [throughput(sub, int(key[2])) for key, sub in groups]
    return table.drop(columns=["tokens", "first", "last"]).reset_index()


def ttft_distribution(values: np.ndarray) -> list[float]:
    """21 quantiles q0, q5, …, q100 of a TTFT sample (the report's distribution chart)."""
    return [float(v) for v in np.quantile(values, np.linspace(0, 1, 21))] if len(values) else []


# ---- inventories (G1), docs/contracts.md §3 ----

def version_tuple(text: str | None) -> tuple[int, ...]:
    """'7.10.1-abc' → (7, 10, 1): versions compare part by part, never as decimals (7.10 is newer than 7.2)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text or ""))
    return tuple(int(p) for p in match[1].split(".")) if match else ()


def version_number(text: str | None) -> float:
    """major.minor as a number, for display only ('7.2.1' → 7.2); decisions use version_tuple."""
    parts = version_tuple(text)
    if not parts:
        return 0.0
    return float(f"{parts[0]}.{parts[1] if len(parts) > 1 else 0}")


def version_threshold(threshold: float, expected_text: str | None = None) -> tuple[int, ...]:
    """The bar of a version criterion as a tuple: the plan's `expect.rocm_min` text when it names the same
    number (it keeps '7.10', which a YAML number cannot), else the threshold's shortest decimal form."""
    if expected_text and version_number(str(expected_text)) == float(f"{threshold:g}"):
        return version_tuple(str(expected_text))
    return version_tuple(repr(float(threshold)))


def decide_version(op: str, found: tuple[int, ...], wanted: tuple[int, ...]) -> str:
    if not found:
        return "fail"
    width = max(len(found), len(wanted))
    a, b = found + (0,) * (width - len(found)), wanted + (0,) * (width - len(wanted))
    ok = {">=": a >= b, ">": a > b, "<=": a <= b, "<": a < b, "==": a == b}[op]
    return "pass" if ok else "fail"


def rocm_text(inventory: dict) -> str | None:
    value = inventory.get("rocm")
    return value if isinstance(value, str) else None


def nic_list(inventory: dict) -> list[dict]:
    """The inventory's NICs as a list, whether recorded as a list or keyed by name."""
    nics = inventory.get("nics") or []
    if isinstance(nics, dict):
        return [{"name": name, **(nic if isinstance(nic, dict) else {})} for name, nic in sorted(nics.items())]
    return [nic for nic in nics if isinstance(nic, dict)]


def rdma_active(nic: dict) -> bool:
    state = str(nic.get("rdma_state") or "").upper().removeprefix("PORT_")
    return state == "ACTIVE"


def gpu_devices(inventory: dict) -> list[dict] | None:
    devices = (inventory.get("gpus") or {}).get("devices")
    return devices if isinstance(devices, list) else None


def inventory_metric(inventory: dict, metric: str, *, candidate: str = "", expect: dict | None = None) -> float:
    """One node's value of a G1 metric; what was not recorded counts as 0 (it cannot pass a '> 0' bar)."""
    expect = expect or {}
    gpus = inventory.get("gpus") or {}
    devices = gpu_devices(inventory)
    if metric == "gpu_count":
        return float(len(devices) if devices is not None else gpus.get("count") or 0)
    if metric == "gpu_model_match":
        # every GPU, not the most common model: the share of the node's GPUs that are the planned model
        wanted = str(expect.get("gpu_model", "")).lower()
        if not wanted or not devices:
            return 0.0
        return sum(1 for d in devices if isinstance(d, dict) and wanted in str(d.get("model") or "").lower()) / len(devices)
    if metric == "rocm_version":
        return version_number(inventory.get("rocm"))
    if metric == "versions_recorded":
        lmcache = inventory.get("lmcache") or {}
        lmcache_version = lmcache.get("version") or lmcache.get("commit") if isinstance(lmcache, dict) else lmcache
        return 1.0 if inventory.get("vllm") and lmcache_version and inventory.get("rocm") else 0.0
    if metric == "link_speed_gbps":
        # up means the Ethernet link is up and the RDMA port ACTIVE (a PORT_DOWN port carries no RoCE traffic)
        speeds = [float(nic.get("speed_gbps") or 0) for nic in nic_list(inventory)
                  if nic.get("rdma_device") and nic.get("state") == "up" and rdma_active(nic)]
        return min(speeds) if speeds else 0.0
    if metric == "fx_mounted_writable":
        fx = inventory.get("fx") or {}
        return 1.0 if fx.get("transport") == "rdma" and fx.get("mounted") and fx.get("writable") else 0.0
    if metric == "fio_read_gbps":
        fio = (inventory.get("fio") or {}).get(candidate or "fx") or {}
        value = fio.get("read_gbps")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
    raise ValueError(f"{metric!r} is not an inventory metric")
