"""Float8 matmuls for training on NVIDIA GPUs of compute capability 8.9 and newer.

``--precision fp8`` is bf16 autocast with the large ``nn.Linear`` layers swapped for torchao's
``Float8Linear`` (float8 training: each matmul of the forward and of both backward products
runs on float8 operands scaled on the fly, e4m3 for activations and weights, e5m2 for
gradients, and accumulates in higher precision). The weights, the optimizer and the
checkpoints stay as they are: a Float8Linear holds the same ``weight`` and ``bias`` as the
Linear it replaces, so a run's checkpoint loads anywhere vitkit's do.

Which layers: float8 pays only where a matmul is large enough for the saved time to cover the
casts and scale computations around it, so a layer is swapped when both of its sides are
multiples of 16 (what the float8 kernels take) and it holds at least ``min_params`` weights.
The default, 2**20, swaps ViT-B's qkv (768x2304) and MLP (768x3072, 3072x768) layers and keeps
the 768x768 attention projection and the classifier in bf16; ``bench/speed.py`` measures each
choice (``vitkit+fp8``, ``vitkit+fp8all``, ...). Recipes (torchao's): ``tensorwise`` (one scale
per tensor, the fastest) and ``rowwise`` (one scale per row, closer to bf16).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from vitkit.errors import VitkitError

FP8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise")
FP8_MIN_PARAMS = 2**20  # the smallest Linear (in x out weights) that gets float8 matmuls
FP8_MIN_CAPABILITY = (8, 9)  # Ada; Hopper is 9.0, Blackwell 10.0


def torchao_float8() -> Any:
    """torchao's float8 training module, or a one-line refusal naming the extra."""
    try:
        import torchao.float8 as float8
    except ImportError:
        raise VitkitError(
            "--precision fp8 uses torchao's float8 training: pip install 'vitkit[fp8]'"
        ) from None
    return float8


def check_fp8_device(device: torch.device) -> None:
    """Float8 matmuls run on NVIDIA GPUs of compute capability 8.9 or newer; anything else is
    refused in one line (the CPU would emulate them, far slower than bf16)."""
    if device.type != "cuda":
        raise VitkitError(
            f"--precision fp8 needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, "
            f"Hopper, Blackwell); this run's device is {device.type}: use --precision bf16"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise VitkitError(
            f"--precision fp8 needs compute capability 8.9 or newer; {name} is "
            f"{capability[0]}.{capability[1]}: use --precision bf16"
        )


def fp8_eligible(module: nn.Module, min_params: int = FP8_MIN_PARAMS) -> bool:
    """Whether ``module`` gets float8 matmuls: an ``nn.Linear`` whose sides are multiples of
    16, holding at least ``min_params`` weights."""
    if type(module) is not nn.Linear:
        return False
    fan_in, fan_out = module.in_features, module.out_features
    return fan_in % 16 == 0 and fan_out % 16 == 0 and fan_in * fan_out >= min_params


def convert_to_fp8(
    model: nn.Module,
    recipe: str = "tensorwise",
    min_params: int = FP8_MIN_PARAMS,
    batch: int | None = None,
) -> list[str]:
    """Swap every eligible Linear of ``model`` (in place) for torchao's ``Float8Linear`` with
    ``recipe``; returns the swapped layers' names. Call it before ``torch.compile`` and before
    wrapping the model for DDP or FSDP.

    The weight gradient's matmul runs over the batch's tokens, which float8 kernels take only
    in multiples of 16: a (micro-)``batch`` that is not a multiple of 16 (so neither may be its
    tokens) turns on torchao's zero padding of that dimension (a copy per matmul, so only then).
    """
    if recipe not in FP8_RECIPES:
        raise VitkitError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if min_params < 0:
        raise VitkitError(f"fp8_min_params must be at least 0, got {min_params}")
    float8 = torchao_float8()
    chosen = [name for name, m in model.named_modules() if fp8_eligible(m, min_params)]
    if chosen:
        config = float8.Float8LinearConfig.from_recipe_name(recipe)
        if batch is not None and batch % 16:
            config = dataclasses.replace(config, pad_inner_dim=True)
        wanted = set(chosen)
        float8.convert_to_float8_training(
            model, config=config, module_filter_fn=lambda m, fqn: fqn in wanted
        )
    return chosen
