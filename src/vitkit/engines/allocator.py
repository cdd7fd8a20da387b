"""glibc malloc settings for large activations: keep freed memory for reuse.

glibc serves an allocation above its mmap threshold with a fresh ``mmap`` and returns it with
``munmap`` when freed. The threshold adapts upwards to the largest freed block but stops at
32 MB, so a ViT-B/16 forward at batch 32 (activations of 40-150 MB) maps, faults in and unmaps
its largest tensors on every call. Raising the threshold keeps those blocks in the heap for the
next call: measured on a 2-vCPU AMD EPYC (bench/malloc.py), B/16 batch-32 inference ran
1.10x (fp32) to 1.23x (bf16) faster, and the slow PyTorch calls right after an OpenVINO call
disappeared (docs/experiments.md, "CPU inference"). The cost: the
process keeps its peak memory instead of returning freed blocks to the system.

``keep_freed_memory()`` is called once at the start of the ``vitkit`` command, before PyTorch
loads. It does nothing off glibc, when the user set ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` themselves (theirs win), or with ``VITKIT_MALLOC=0``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30  # blocks up to 1 GiB come from the heap and stay there when freed
# the heap's free top goes back to the system only above this much (glibc's own choice when it
# raises the mmap threshold dynamically is twice the threshold; mallopt takes a C int)
TRIM = 2**31 - 1


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module docstring); True if done."""
    if sys.platform != "linux" or os.environ.get("VITKIT_MALLOC", "1") == "0":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False  # the user's own malloc settings
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this Python runs on
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM))


def release_freed_memory() -> bool:
    """Give the memory glibc holds free, in every thread's arena, back to the system
    (``malloc_trim(0)``): what a server calls after a large image's decode, so that its resident
    memory follows what it holds now rather than the sum of each decode thread's peak. True if
    glibc released something."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
