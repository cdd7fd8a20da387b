"""Float8 matmuls for training on NVIDIA GPUs of compute capability 8.9 and newer.

``--precision fp8`` is bf16 autocast with the large ``nn.Linear`` layers swapped for torchao's
``Float8Linear`` (float8 training: each matmul of the forward and of both backward products
runs on float8 operands scaled on the fly, e4m3 for activations and weights, e5m2 for
gradients, and accumulates in higher precision). The weights, the optimizer and the
checkpoints stay as they are: a Float8Linear holds the same ``weight`` and ``bias`` as the
Linear it replaces, so a run's checkpoint loads anywhere vitkit's do.

Which layers and where (:mod:`vitkit.float8_layers`, the rules inference follows too): the
``nn.Linear`` layers whose sides are multiples of 16 holding at least ``min_params`` weights
(default 2**20: ViT-B's qkv and MLP layers, not its 768x768 projection nor the classifier), on
NVIDIA GPUs of compute capability 8.9 and newer; ``bench/speed.py`` measures each choice
(``vitkit+fp8``, ``vitkit+fp8all``, ...). Recipes (torchao's): ``tensorwise`` (one scale per
tensor, the fastest) and ``rowwise`` (one scale per row, closer to bf16).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from vitkit.errors import VitkitError
from vitkit.float8_layers import (
    FP8_MIN_PARAMS,
    FP8_RECIPES,
    check_fp8_device,
    check_fp8_settings,
    fp8_eligible,
    fp8_layer_names,
)


def torchao_float8() -> Any:
    """torchao's float8 training module, or a one-line refusal naming the extra."""
    try:
        import torchao.float8 as float8
    except ImportError:
        raise VitkitError(
            "--precision fp8 uses torchao's float8 training: pip install '.[fp8]' in vitkit's clone"
        ) from None
    return float8


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
    check_fp8_settings(recipe, min_params)
    float8 = torchao_float8()
    chosen = fp8_layer_names(model, min_params)
    if chosen:
        config = float8.Float8LinearConfig.from_recipe_name(recipe)
        if batch is not None and batch % 16:
            config = dataclasses.replace(config, pad_inner_dim=True)
        wanted = set(chosen)
        float8.convert_to_float8_training(
            model, config=config, module_filter_fn=lambda m, fqn: fqn in wanted
        )
    return chosen


__all__ = [  # (the shared rules re-exported: training's callers import them from here)
    "FP8_MIN_PARAMS",
    "FP8_RECIPES",
    "check_fp8_device",
    "convert_to_fp8",
    "fp8_eligible",
    "torchao_float8",
]
