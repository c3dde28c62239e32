"""Keep glibc malloc from handing big buffers back to the kernel after every step.

Entry points (`lbtrain`, `python -m lbtrain`, `python -m hyperspectral`) call
`tune_malloc()` before torch is imported. Programs that embed lbtrain can call it first
thing, or set ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824
MALLOC_TOP_PAD_=268435456`` in the environment.

PyTorch's CPU convolutions allocate and free buffers of many MiB on every forward and
backward pass. With glibc's defaults those are fresh ``mmap`` regions (or trimmed heap tops),
so every step faults its pages in again: on the HybridSN benchmark the kernel's share was
about 40% of the CPU time and one training step took 2.4 times longer. Raising the mmap and
trim thresholds keeps the memory in the process for reuse. It must run before torch is
imported (measured: applied later, it recovers only part of the loss).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["tune_malloc"]

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def tune_malloc(
    mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30, top_pad: int = 256 << 20
) -> bool:
    """Raise glibc's mmap/trim thresholds for this process; a no-op off glibc.

    It overrides any ``MALLOC_*_`` environment settings, so only entry points call it.

    Args:
        mmap_threshold: allocations below this come from the heap (glibc caps it at 32 MiB).
        trim_threshold: free memory kept at the heap top before returning it to the kernel.
        top_pad: extra memory requested whenever the heap grows.

    Returns:
        True if all three settings were accepted.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    settings = (
        (_M_MMAP_THRESHOLD, mmap_threshold),
        (_M_TRIM_THRESHOLD, trim_threshold),
        (_M_TOP_PAD, top_pad),
    )
    return all(mallopt(key, value) == 1 for key, value in settings)
