"""Which kernel PyTorch's ``scaled_dot_product_attention`` runs: one switch for training,
evaluation and the benchmarks.

``auto`` leaves the choice to PyTorch (on CUDA, flash attention where it applies, then the
memory-efficient kernel, then cuDNN's, then the plain math). ``cudnn`` asks for cuDNN's fused
attention (Hopper's fastest at ViT's head size 64 in some PyTorch releases: ``bench/speed.py``'s
``vitkit+cudnn`` measures it); ``flash``, ``efficient`` and ``math`` pin the others. Pinning a
kernel that cannot run the inputs fails at the first attention call with PyTorch's own reasons.

``torch.compile`` does not see a context entered around a compiled call (its graph keeps the
kernel chosen when it was traced, without a guard), so the choice is also an attribute of
every attention layer, ``Attention.attention_backend``, set by :func:`set_attention_backend`; the
layer enters the context itself, inside the traced code.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from vitkit.errors import VitkitError

SDPA_BACKENDS: tuple[str, ...] = ("auto", "flash", "efficient", "cudnn", "math")
_CUDA_ONLY = ("efficient", "cudnn")


def _check_name(name: str) -> None:
    if name not in SDPA_BACKENDS:
        choices = ", ".join(SDPA_BACKENDS)
        raise VitkitError(f"attention backend must be one of {choices}, got {name!r}")


def check_sdpa_backend(name: str, device: torch.device) -> None:
    """Refuse an unknown backend, or one the device does not have, in one line."""
    _check_name(name)
    if name in _CUDA_ONLY and device.type != "cuda":
        raise VitkitError(
            f"attention backend {name} runs on CUDA GPUs only; this run's device is "
            f"{device.type}: use auto, flash or math"
        )


def set_attention_backend(model: torch.nn.Module, name: str) -> int:
    """Set every attention layer of ``model`` that takes the choice to ``name``; returns how
    many did (0 for a model whose attention has no such layer: the families whose attention is
    a function of their own, such as the parallel blocks, follow the context alone)."""
    _check_name(name)
    layers: list[Any] = [m for m in model.modules() if hasattr(m, "attention_backend")]
    for m in layers:
        m.attention_backend = name
    return len(layers)


def sdpa_backend(name: str) -> Any:
    """A context in which every ``scaled_dot_product_attention`` call uses ``name``'s kernel
    (``auto``: PyTorch's own choice, no context)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return sdpa_kernel([backend])
