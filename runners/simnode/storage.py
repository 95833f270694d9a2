"""The simulated node's storage model: FX = 4-disk RAID0 behind one 100 GbE RoCEv2 port; local = one PCIe Gen4 disk.

Figures are sequential-read bandwidths in GB/s (10^9 bytes/s). Standard library only (used on the node side).
"""
from __future__ import annotations

DISK_READ_GBPS = 6.8            # one PCIe Gen4 x4 enterprise NVMe disk, 1 MiB sequential read
DISK_WRITE_GBPS = 4.0
FX_DISKS = 4                    # RAID0 pool
FX_LINK_GBITS = 100.0           # one 100 GbE RoCEv2 port
ROCE_EFFICIENCY = 0.92          # payload share of the line rate after RoCEv2/NVMe-oF framing


def fx_read_gbps(faults: dict) -> float:
    pool = FX_DISKS * DISK_READ_GBPS
    wire = FX_LINK_GBITS / 8 * ROCE_EFFICIENCY
    return min(pool, wire) / float(faults.get("fx_degraded") or 1.0) / float(faults.get("slow_disk") or 1.0)


def fx_write_gbps(faults: dict) -> float:
    return min(FX_DISKS * DISK_WRITE_GBPS, FX_LINK_GBITS / 8 * ROCE_EFFICIENCY) / float(faults.get("fx_degraded") or 1.0) \
        / float(faults.get("slow_disk") or 1.0)


def local_read_gbps(faults: dict) -> float:
    return DISK_READ_GBPS / float(faults.get("slow_disk") or 1.0)


def local_write_gbps(faults: dict) -> float:
    return DISK_WRITE_GBPS / float(faults.get("slow_disk") or 1.0)
