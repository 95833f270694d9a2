"""Simulated blkid (fxpilot simnode): the filesystem type of the node's namespaces, from state.json.

Only what the deploy step asks: `blkid [-o value] [-s TYPE] DEVICE`. Exit 2 (as blkid) when the device
holds no filesystem or is not there, so attach_fx.sh can refuse to mount and mkfs only when asked.
"""
from __future__ import annotations

import os
import sys

from runners.simnode.state import fx_visible, load_state


def main(args: list[str]) -> int:
    devices = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-o", "-s"))]
    if len(devices) != 1:
        print("blkid: simulated node: use `blkid [-o value] [-s TYPE] DEVICE`", file=sys.stderr)
        return 4
    state = load_state(os.environ["FXPILOT_SIM_ROOT"])
    device = devices[0]
    fx = state["fx"]
    if device == state["local_nvme"]["namespace"]:
        fstype = "xfs"
    elif device == fx["namespace"] and fx_visible(state) and fx.get("connected") and fx.get("formatted", True):
        fstype = "xfs"
    else:
        return 2
    if "value" in args:
        print(fstype)
    else:
        print(f'{device}: UUID="5e1f0a2b-fx00-4000-8000-000000000001" BLOCK_SIZE="4096" TYPE="{fstype}"')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
