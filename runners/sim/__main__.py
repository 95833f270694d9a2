"""`python -m runners.sim serve MODEL [vllm serve flags]`: the simulated vLLM server (simulated: true).

`python -m runners.sim calibrate` prints Table 1 as the cost model gives it in model time (no server).
"""
from __future__ import annotations

import sys

from runners.sim.config import ConfigError, parse_serve


def calibrate() -> int:
    from runners.sim.calibration import TABLE1, table
    print("cell            TTFT p50 s (published)      tok/s (published)   [model time, simulated]")
    for (arm, concurrency), figures in table().items():
        ttft, throughput = TABLE1[(arm, concurrency)]
        print(f"{arm:<11} {concurrency:>3}  {figures['ttft_p50']:8.2f} ({ttft:6.2f}, {figures['ttft_p50'] / ttft - 1:+6.1%})"
              f"  {figures['throughput']:6.1f} ({throughput:5.1f}, {figures['throughput'] / throughput - 1:+6.1%})")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["calibrate"]:
        return calibrate()
    if not argv or argv[0] != "serve":
        print("usage: python -m runners.sim serve MODEL [--tensor-parallel-size N] [--kv-transfer-config JSON] "
              "[--port N] [--no-enable-prefix-caching] [--sim-time-scale X] ...\n"
              "       python -m runners.sim calibrate", file=sys.stderr)
        return 2
    try:
        config = parse_serve(argv[1:])
    except ConfigError as error:
        print(f"ERROR: {error}", file=sys.stderr, flush=True)
        return 1
    from runners.sim.server import run
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
