#!/usr/bin/env python3
"""Client benchmark (issue 5): our workload client against `vllm bench serve` and guidellm, in one run,
against one zero-delay streaming server (stream_server.py), concurrency 64, 128 output tokens.

For each client the harness samples, every 20 ms, the server's counters (tokens written, requests
done, requests in flight) and the CPU time of the client's whole process tree (/proc). The timed
window is the middle of the run, from 10 % to 90 % of the requests done, so start-up (imports, prompt
generation, worker spawn) and shutdown are outside it for every client alike.
Figures per client: CPU µs per streamed token over the window, tokens/s, mean and minimum in-flight
as the server saw it. For our client also: its first-token time against the server's own first-token
stamp (wall clock, same machine), matched by completion id.

    python3 benchmarks/client/bench_clients.py [--requests 3200] [--install] [--no-pin] [--nice -15]

Results: benchmarks/out/client-<UTC time>.json and a table on stdout (copied to benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PEERS = HERE.parent / ".peers"
OUT = HERE.parent / "out"
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    """`root` and every live process below it (a full /proc walk: done twice a second, not per sample)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                parents[int(entry)] = int(fields[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [p for p, parent in parents.items() if parent == pid]
    return found


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds (user+system, own and reaped children) of these processes."""
    total = 0.0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            total += sum(int(v) for v in fields[11:15]) / TICKS
    return total


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


class Stats:
    """The server's /stats over one kept-alive connection (the sampler must cost the server little)."""

    def __init__(self, host: str, port: int):
        self.conn = http.client.HTTPConnection(host, port, timeout=10)

    def get(self) -> dict:
        self.conn.request("GET", "/stats")
        return json.loads(self.conn.getresponse().read())


def run_client(name: str, cmd: list[str], stats: Stats, requests: int, env: dict, log: Path) -> dict:
    stats0 = stats.get()
    samples = []
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        pids, found_at = [proc.pid], 0.0
        while proc.poll() is None:
            if time.monotonic() - found_at > 0.5:
                pids, found_at = descendants(proc.pid), time.monotonic()
            s = stats.get()
            samples.append((time.monotonic(), tree_cpu(pids), s["done"] - stats0["done"],
                            s["tokens"] - stats0["tokens"], s["in_flight"]))
            time.sleep(0.02)
    done = samples[-1][2] if samples else 0
    lo = [x for x in samples if x[2] >= 0.1 * requests]
    hi = [x for x in samples if x[2] >= 0.9 * requests]
    result = {"client": name, "command": " ".join(cmd), "exit_code": proc.returncode, "requests_done": done}
    if not lo or not hi or hi[0][0] <= lo[0][0]:
        result["error"] = f"too few samples in the window (done {done} of {requests}); see {log}"
        return result
    a, b = lo[0], hi[0]
    window = [x for x in samples if a[0] <= x[0] <= b[0]]
    result.update({
        "window_s": round(b[0] - a[0], 3), "tokens": b[3] - a[3], "cpu_s": round(b[1] - a[1], 3),
        "cpu_us_per_token": round((b[1] - a[1]) / max(b[3] - a[3], 1) * 1e6, 3),
        "tokens_per_s": round((b[3] - a[3]) / (b[0] - a[0]), 1),
        "in_flight_mean": round(statistics.mean(x[4] for x in window), 2),
        "in_flight_min": min(x[4] for x in window),
        "cpu_share_of_one_core": round((b[1] - a[1]) / (b[0] - a[0]), 3),
    })
    return result


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def stamp_check(records_path: Path, stamps: list) -> dict:
    """Our first-token wall time vs the server's first-token stamp; our TTFT vs the server's."""
    by_id = {s[0]: s for s in stamps}
    stamp_gap, ttft_gap = [], []
    with open(records_path) as f:
        for line in f:
            r = json.loads(line)
            s = by_id.get(r.get("request_id"))
            if r["status"] != "ok" or s is None or s[2] is None:
                continue
            stamp_gap.append(r["wall_anchor"] + r["t_first_token"] - s[2])
            ttft_gap.append((r["t_first_token"] - r["t_send"]) - (s[2] - s[1]))
    if not stamp_gap:
        return {"error": "no record matched a server stamp"}
    return {"matched": len(stamp_gap),
            "first_token_minus_server_stamp_ms": {k: round(quantile(stamp_gap, q) * 1e3, 3)
                                                  for k, q in (("p50", .5), ("p99", .99), ("max", 1.0))},
            "abs_p99_ms": round(quantile([abs(x) for x in stamp_gap], .99) * 1e3, 3),
            "ttft_minus_server_ttft_ms": {k: round(quantile(ttft_gap, q) * 1e3, 3)
                                          for k, q in (("p50", .5), ("p99", .99), ("max", 1.0))}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3200)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--input-tokens", type=int, default=1024)
    p.add_argument("--port", type=int, default=8020)
    p.add_argument("--install", action="store_true", help="run install_peers.sh first")
    p.add_argument("--no-pin", action="store_true", help="do not pin the server to CPU 1 and clients to CPU 0")
    p.add_argument("--clients", default="ours,vllm,guidellm")
    p.add_argument("--coalesce-ms", type=float, default=10.0, help="our client's --coalesce-ms")
    p.add_argument("--realtime", action="store_true",
                   help="run server and clients under SCHED_FIFO (chrt -f 10; root): other work on a shared machine "
                        "then cannot delay their wake-ups, which is what the first-token check measures")
    p.add_argument("--nice", type=int, default=0,
                   help="run server and clients at this niceness (e.g. -15 on a shared machine; needs root)")
    a = p.parse_args()
    if a.install:
        subprocess.run([str(HERE / "install_peers.sh")], check=True)
    OUT.mkdir(exist_ok=True)
    load_before = list(os.getloadavg())  # other work on the machine shows up as scheduling delay
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    work = OUT / f"client-{stamp}"
    work.mkdir()
    nice = ["nice", "-n", str(a.nice)] if a.nice else []
    realtime = ["chrt", "-f", "10"] if a.realtime else []
    pin_server = nice + realtime + ([] if a.no_pin else ["taskset", "-c", "1"])
    pin_client = nice + realtime + ([] if a.no_pin else ["taskset", "-c", "0"])
    pin_multiprocess = nice + ([] if a.no_pin else ["taskset", "-c", "0"])
    if not a.no_pin:
        os.sched_setaffinity(0, {1})  # the sampler stays off the client's core
    if a.realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))  # a busy real-time server must not starve it
    server_url = f"http://127.0.0.1:{a.port}"
    server = subprocess.Popen(pin_server + [sys.executable, str(HERE / "stream_server.py"), "--port", str(a.port)],
                              stdout=subprocess.DEVNULL)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    tok = str(PEERS / "tok-qwen3")
    clients = {
        "ours": pin_client + ["python3", "runners/remote/workload.py", "measure", "--url", server_url, "--arm", "bench",
                              "--model", "mock", "--out", str(work / "ours.jsonl"), "--evict", "none",
                              "--prompt-tokens", str(a.input_tokens), "--turn-tokens", "0",
                              "--output-tokens", str(a.output_tokens), "-c", str(a.concurrency), "--repetitions", "1",
                              "--sessions", str(a.requests), "--coalesce-ms", str(a.coalesce_ms), "--requests-per-client",
                              str(-(-a.requests // a.concurrency)), "--quiet"],
        "vllm": pin_client + [str(PEERS / "vllm-venv/bin/vllm"), "bench", "serve", "--backend", "openai",
                              "--base-url", server_url, "--model", "mock", "--tokenizer", tok,
                              "--dataset-name", "random", "--random-input-len", str(a.input_tokens),
                              "--random-output-len", str(a.output_tokens), "--num-prompts", str(a.requests),
                              "--max-concurrency", str(a.concurrency), "--ignore-eos", "--save-result",
                              "--save-detailed", "--result-dir", str(work), "--result-filename", "vllm.json",
                              "--disable-tqdm"],
        # guidellm's worker processes starve one another under SCHED_FIFO on one core: never real-time
        "guidellm": pin_multiprocess + [str(PEERS / "guidellm-venv/bin/guidellm"), "run", "--backend",
                                  f"kind=openai_http,target={server_url},model=mock,request_format=/v1/completions",
                                  "--profile", f"kind=concurrent,streams={a.concurrency}",
                                  "--data", f"kind=synthetic_text,prompt_tokens={a.input_tokens},"
                                            f"output_tokens={a.output_tokens}",
                                  "--tokenizer", f"kind=huggingface_auto,model={tok}",
                                  "--constraint", f"kind=max_requests,count={a.requests}",
                                  "--output", f"kind=json,path={work / 'guidellm.json'}", "--disable-progress"],
    }
    results = []
    try:
        for _ in range(100):
            try:
                get(server_url + "/health")
                break
            except OSError:
                time.sleep(0.05)
        for name in a.clients.split(","):
            cmd = clients[name]
            program = next(x for x in cmd if "/" in x)
            if name != "ours" and not Path(program).exists():
                results.append({"client": name, "error": f"not installed: {program} (run with --install)"})
                continue
            get(server_url + "/stamps")
            print(f"running {name} …", flush=True)
            result = run_client(name, cmd, Stats("127.0.0.1", a.port), a.requests, env, work / f"{name}.log")
            if name == "ours":
                result["ttft"] = stamp_check(work / "ours.jsonl", json.loads(get(server_url + "/stamps")))
                summary = json.loads((work / "ours.summary.json").read_text().splitlines()[-1])
                result["own_summary"] = {k: summary[k] for k in ("max_in_flight", "client_cpu_s", "output_tokens",
                                                                 "duration_s", "errors")}
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        server.terminate()
        server.wait()
    ours = next((r for r in results if r["client"] == "ours" and "cpu_us_per_token" in r), None)
    verdicts = []
    for r in results:
        if ours and r is not ours and "cpu_us_per_token" in r:
            ratio = ours["cpu_us_per_token"] / r["cpu_us_per_token"]
            r["ours_cpu_ratio"] = round(ratio, 3)
            verdicts.append(f"ours/{r['client']} CPU per token = {ratio:.2f} ({'ok' if ratio <= 0.5 else 'MISSED'} ≤ 0.5)")
    if ours:
        ttft = ours.get("ttft", {})
        verdicts.append(f"ours max in flight {ours['own_summary']['max_in_flight']} of {a.concurrency}, "
                        f"server-seen mean {ours['in_flight_mean']}")
        if "abs_p99_ms" in ttft:
            verdicts.append(f"ours |first token − server stamp| p99 {ttft['abs_p99_ms']} ms "
                            f"({'ok' if ttft['abs_p99_ms'] < 2 else 'MISSED'} < 2 ms)")
    report = {"when": stamp, "setup": vars(a), "results": results, "verdicts": verdicts,
              "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
              "python": sys.version.split()[0], "cpus": os.cpu_count()}
    (OUT / f"client-{stamp}.json").write_text(json.dumps(report, indent=1))
    print("\n| client | µs CPU / token | tok/s | mean in flight (server) | min in flight | window |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "cpu_us_per_token" in r:
            print(f"| {r['client']} | {r['cpu_us_per_token']} | {r['tokens_per_s']:.0f} | {r['in_flight_mean']} | "
                  f"{r['in_flight_min']} | {r['window_s']} s |")
        else:
            print(f"| {r['client']} | — | — | — | — | {r.get('error')} |")
    print("\n" + "\n".join(verdicts))
    print(f"\nresults: {OUT / f'client-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
