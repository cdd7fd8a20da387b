"""Where float8 matmuls run, and on which Linear layers: the rules ``--precision fp8`` follows
in training (:mod:`vitkit.train.float8`) and in inference
(:mod:`vitkit.engines.float8_inference`), kept in one place.

Where: NVIDIA GPUs of compute capability 8.9 and newer (Ada 8.9, Hopper 9.0, Blackwell 10.0),
which multiply float8 natively. Anywhere else PyTorch would emulate the matmuls, far slower than
bf16, so ``--precision fp8`` is refused there in one line that says what to use instead.

Which layers: float8 pays only where a matmul is large enough for the saved time to cover the
casts and scale computations around it, so a layer takes float8 when it is an ``nn.Linear``
whose sides are both multiples of 16 (what the float8 kernels take) holding at least
``min_params`` weights. The default, 2**20, picks ViT-B's qkv (768x2304) and MLP (768x3072,
3072x768) layers and keeps the 768x768 attention projection and the classifier in bf16.
Scaling (torchao's names): ``tensorwise`` (one scale per tensor, the fastest) or ``rowwise``
(one scale per row, closer to bf16).
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.errors import VitkitError

FP8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise")
FP8_MIN_PARAMS = 2**20  # the smallest Linear (in x out weights) that gets float8 matmuls
FP8_MIN_CAPABILITY = (8, 9)  # Ada; Hopper is 9.0, Blackwell 10.0


def fp8_refusal(
    device_type: str,
    capability: tuple[int, int] | None = None,
    name: str = "",
    gpu_visible: bool = False,
) -> str | None:
    """Why ``--precision fp8`` cannot run on a device of ``device_type`` (for a CUDA device,
    its compute ``capability`` and ``name``), or None where it can. ``gpu_visible``: a CUDA
    GPU is there though the run's device is not it (then the line names ``--device cuda``)."""
    if device_type != "cuda":
        instead = "--device cuda, or --precision bf16" if gpu_visible else "use --precision bf16"
        return (
            "--precision fp8 needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, "
            f"Hopper, Blackwell); this run's device is {device_type}: {instead}"
        )
    if capability is None or capability < FP8_MIN_CAPABILITY:
        shown = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return (
            f"--precision fp8 needs compute capability 8.9 or newer; {name or 'this GPU'} is "
            f"{shown}: use --precision bf16"
        )
    return None


def check_fp8_device(device: torch.device) -> None:
    """Float8 matmuls run on NVIDIA GPUs of compute capability 8.9 or newer; anything else is
    refused in one line (the CPU would emulate them, far slower than bf16)."""
    if device.type != "cuda":
        why = fp8_refusal(device.type, gpu_visible=torch.cuda.is_available())
    else:
        why = fp8_refusal(
            "cuda", torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device)
        )
    if why is not None:
        raise VitkitError(why)


def check_fp8_settings(recipe: str, min_params: int) -> None:
    """A scaling recipe torchao has and a layer size that can be (one line each otherwise)."""
    if recipe not in FP8_RECIPES:
        raise VitkitError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if min_params < 0:
        raise VitkitError(f"fp8_min_params must be at least 0, got {min_params}")


def fp8_eligible(module: nn.Module, min_params: int = FP8_MIN_PARAMS) -> bool:
    """Whether ``module`` gets float8 matmuls: an ``nn.Linear`` whose sides are multiples of
    16, holding at least ``min_params`` weights."""
    if type(module) is not nn.Linear:
        return False
    fan_in, fan_out = module.in_features, module.out_features
    return fan_in % 16 == 0 and fan_out % 16 == 0 and fan_in * fan_out >= min_params


def fp8_layer_names(model: nn.Module, min_params: int = FP8_MIN_PARAMS) -> list[str]:
    """The names of the layers of ``model`` that get float8 matmuls (:func:`fp8_eligible`)."""
    return [name for name, m in model.named_modules() if fp8_eligible(m, min_params)]


__all__ = [
    "FP8_MIN_CAPABILITY",
    "FP8_MIN_PARAMS",
    "FP8_RECIPES",
    "check_fp8_device",
    "check_fp8_settings",
    "fp8_eligible",
    "fp8_layer_names",
    "fp8_refusal",
]
