"""What the machine computes natively (whether bf16 autocast is fast here) and what it holds.

bf16 autocast pays off only where the hardware multiplies bf16 natively: CUDA GPUs from Ampere
on, and CPUs with AVX512-BF16 or AMX (oneDNN's bf16 kernels). On a CPU without them (AVX2 only,
e.g. many AMD EPYC and laptop CPUs) PyTorch emulates bf16 matmuls, measured 15-53x slower
than fp32, a training step 5x (bench/precision.py). ``precision="auto"`` picks bf16 exactly
where it is native.

And what the machine holds: a model whose weights (or an input whose sequence) cannot fit in
the available memory is refused before anything is allocated (:func:`check_fits`), and an
out-of-memory step is said in one line with what to change.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any, Literal

import torch

from vitkit.errors import VitkitError

PRECISIONS = ("auto", "fp32", "bf16")


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 matmuls natively (not emulated)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        try:  # oneDNN's own test for AVX512-BF16 / AMX (private, so guarded)
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def resolve_precision(precision: str, device: torch.device) -> Literal["fp32", "bf16"]:
    """``"auto"`` → ``"bf16"`` where it is native on ``device``, else ``"fp32"``; an explicit
    ``"bf16"`` on a device that would emulate it is kept, with a warning."""
    if precision not in PRECISIONS:
        raise VitkitError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and device.type == "cpu" and not native_bf16(device):
        warnings.warn(
            "bf16 on this CPU is emulated (no AVX512-BF16 or AMX): training runs many times "
            "slower than fp32; --precision auto picks fp32 here",
            stacklevel=2,
        )
    return "bf16" if precision == "bf16" else "fp32"


def is_out_of_memory(err: BaseException) -> bool:
    """An allocation that did not fit: CUDA's OutOfMemoryError, the CPU allocator's
    RuntimeError ("can't allocate memory") or Python's MemoryError."""
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    )


def out_of_memory_message(
    err: BaseException, device: torch.device | str, batch_size: int, accum_steps: int, micro: int
) -> str:
    """One line for a training step that did not fit: the batch, the images per micro-batch on
    this process (``micro``), the memory the allocation asked for (from PyTorch's message) and
    what to change (a smaller batch, or the same batch in more micro-batches)."""
    found = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGTP]?i?B)", str(err))
    in_bytes = re.search(r"tried to allocate (\d+) bytes", str(err))  # the CPU allocator's
    asked = found.group(1) if found else None
    if in_bytes:
        asked = f"{int(in_bytes.group(1)) / 2**30:.1f} GiB"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # name the card, as PyTorch's text does
        gpu = re.search(r"GPU (\d+) has", str(err))
        index = int(gpu.group(1)) if gpu else None
        if index is None and torch.cuda.is_available():
            index = torch.cuda.current_device()
        device = torch.device("cuda", index) if index is not None else device
    fix = "use a smaller model"
    if batch_size > 1:
        fix = f"lower --batch-size (e.g. {batch_size // 2})"
    if micro > 1 and batch_size % (accum_steps * 2) == 0:
        fix += f" or keep it with --accum-steps {accum_steps * 2} (half the memory per step)"
    return (
        f"out of memory on {device} at batch size {batch_size} ({micro} images per micro-batch)"
        + (f", asking for {asked} more" if asked else "")
        + f": {fix}"
    )


def available_memory() -> int | None:
    """Bytes this machine can still allocate (Linux's MemAvailable), None where unknown."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) * 1024 if found else None


def check_fits(what: str, need: int, fix: str) -> None:
    """Refuse, before anything is allocated, ``what`` that needs ``need`` bytes where the
    machine has fewer available, naming the estimate and what to change."""
    free = available_memory()
    if free is not None and need > free:
        raise VitkitError(
            f"{what} needs about {need / 2**30:,.1f} GiB, more than the {free / 2**30:,.1f} GiB "
            f"this machine has available: {fix}"
        )


def check_model_fits(cfg: Any) -> None:
    """A model whose fp32 weights alone do not fit in memory is refused before it is built
    (the exact parameter count, :func:`vitkit.registry.counts.count_params`)."""
    from vitkit.registry.counts import count_params

    if torch.get_default_device().type == "meta":  # shapes only (a checkpoint's key check)
        return
    params = count_params(cfg)
    check_fits(f"{cfg.short_name} ({params:,} parameters, fp32)", 4 * params, "a smaller model")


def cpu_name() -> str:
    """The CPU as a benchmark names it: vendor and model, family/model numbers, vCPUs, the
    vector extensions that decide the speed of fp32, bf16 and int8 paths, and AMX or not
    (``lscpu``; the platform's name where it is missing), e.g. "AMD EPYC, family 25 model 17
    (2 vCPUs; avx2, avx512f, avx512_vnni, avx512_bf16; no AMX)"."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor() or "unknown CPU"
    return describe_lscpu(out, os.cpu_count())


def describe_lscpu(out: str, vcpus: int | None) -> str:
    """:func:`cpu_name` from ``lscpu``'s text."""
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines())}
    name = fields.get("Model name") or platform.processor() or "unknown CPU"
    if "CPU family" in fields and "Model" in fields:
        name += f", family {fields['CPU family']} model {fields['Model']}"
    flags = fields.get("Flags", "").split()
    known = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    isa = ", ".join(f for f in known if f in flags) or "no AVX2"
    amx = "" if "amx_bf16" in flags else "; no AMX"
    return f"{name} ({vcpus} vCPUs; {isa}{amx})"
