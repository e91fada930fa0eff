"""The links KV blocks cross and how the host tier is written: the names the simulator's options take.

The options (`config.SimConfig`) are checked against these and the tiers (`tiers`) and the disaggregated
fleet (`disagg`) use them, so they live below all three.
"""

from __future__ import annotations

from prefixscan.errors import UsageError

# Named links, GB/s (1e9 bytes per second) per direction.
LINKS: dict[str, float] = {
    # PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b encoding = 63 GB/s per direction (PCI-SIG PCIe 5.0)
    "pcie5-x16": 63.0,
    # PCIe Gen4 x16: 16 GT/s x 16 lanes = 31.5 GB/s per direction (PCI-SIG PCIe 4.0)
    "pcie4-x16": 31.5,
    # one 400 Gb/s RDMA NIC per GPU (InfiniBand NDR / ConnectX-7 class, as in Mooncake's and NIXL's setups)
    "rdma-400g": 50.0,
    # 200 Gb/s RDMA NIC (HDR / ConnectX-6 class)
    "rdma-200g": 25.0,
    # NVLink 4 (H100): 450 GB/s per direction per GPU (NVIDIA H100 datasheet, 900 GB/s bidirectional)
    "nvlink4": 450.0,
}
DEFAULT_HOST_LINK = "pcie5-x16"
DEFAULT_SHARED_LINK = "rdma-400g"
DEFAULT_PD_LINK = "rdma-400g"
HOST_WRITES = ("through", "back")


def link_gbs(value: str | float) -> float:
    """A link speed in GB/s from a name in LINKS or a number."""
    if isinstance(value, (int, float)):
        gbs = float(value)
    elif value in LINKS:
        gbs = LINKS[value]
    else:
        try:
            gbs = float(value)
        except ValueError:
            raise UsageError(f"link speed must be GB/s or one of {', '.join(LINKS)}, got {value!r}") from None
    if not gbs > 0:
        raise UsageError(f"link speed must be > 0 GB/s, got {value!r}")
    return gbs
