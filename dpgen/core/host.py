"""The host allocator of a training process: freed memory is kept for the next step instead of being returned.

glibc's malloc hands a freed block back to the system when it was mapped on its own (blocks above the mmap
threshold, 128 KiB at first, raised step by step as such blocks are freed) or when the free space at the top of
the heap passes the trim threshold. A training step allocates and frees the same activations and gradients
every step, so on a CPU the next step maps them again and touches every 4 KiB page afresh: one minor page fault
each. dpgan's quick discriminator step (64 rows) took 1,000–1,900 faults per step, 2–7 ms of a 13–19 ms step on
this project's VM, more than a private step adds (docs/performance.md). :func:`keep_freed_memory` raises both
thresholds with ``mallopt`` once per process: blocks up to 32 MiB (glibc's largest mmap threshold on 64-bit) come
from the heap and stay there when freed, and the heap's top is trimmed only past 1 GiB of free space. Larger
blocks are still mapped and returned. What a step computes is unchanged; only where its memory comes from.

``DPGEN_MALLOC=system`` keeps glibc's defaults; other C libraries (no ``mallopt``) are left as they are.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("dpgen")

__all__ = ["keep_freed_memory", "ENV", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

ENV = "DPGEN_MALLOC"
#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap (glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: 4 MiB · sizeof(long))
MMAP_THRESHOLD = 32 << 20
#: free space at the heap's top that glibc keeps before returning it
TRIM_THRESHOLD = 1 << 30

_done: dict[str, bool] = {}


def _mallopt():
    """glibc's ``mallopt`` in this process, or None (another C library)."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return fn


def keep_freed_memory() -> bool:
    """Keep freed host memory for reuse (module docstring), once per process, with one log line saying so or
    why not. True where the thresholds are set."""
    if "kept" in _done:
        return _done["kept"]
    if os.environ.get(ENV, "keep").strip().lower() in ("system", "default", "0", "off"):
        log.info("host memory: %s=system, glibc's allocator keeps its defaults", ENV)
        _done["kept"] = False
        return False
    mallopt = _mallopt()
    kept = mallopt is not None and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and \
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if kept:
        log.info("host memory: freed blocks up to %d MiB are kept for the next step (glibc mallopt; %s=system "
                 "keeps the defaults)", MMAP_THRESHOLD >> 20, ENV)
    else:
        log.info("host memory: no glibc mallopt here, the allocator keeps its defaults")
    _done["kept"] = kept
    return kept
