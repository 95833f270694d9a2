"""`python -m runners.sim serve MODEL [vllm serve flags]`: the simulated vLLM server (simulated: true)."""
from __future__ import annotations

import sys

from runners.sim.config import ConfigError, parse_serve


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: python -m runners.sim serve MODEL [--tensor-parallel-size N] [--kv-transfer-config JSON] "
              "[--port N] [--no-enable-prefix-caching] [--sim-time-scale X] ...", file=sys.stderr)
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
