"""bench/speed.py's float8 inference levers: vitkit's ``--precision fp8`` inference path
(``vitkit.engines.float8_inference.fp8_model``: bf16 weights with the chosen Linear layers'
weights cast to float8 once, activations scaled per call), timed compiled beside timm and
vitkit at bf16 autocast, and its top-1 agreement with vitkit's bf16 on the same inputs.

    vitkit+fp8infer      tensorwise scales, the Linear layers of at least 2**20 weights
    vitkit+fp8inferr     rowwise scales, the same layers
    vitkit+fp8inferall   tensorwise scales, every Linear whose sides are multiples of 16

The model is compiled by the bench with inductor's defaults, like every other impl (torchao's
recommended inductor settings are not applied: they would change the other impls' graphs too).
The inputs are random and the weights random (``speed.build``), so the agreement measures how
far float8 moves the logits, not accuracy on images (``vitkit eval --precision fp8`` measures
that on a dataset).
"""

from __future__ import annotations

import copy
import sys

import torch

from vitkit.engines.float8_inference import fp8_model
from vitkit.float8_layers import FP8_MIN_PARAMS

# lever -> (scaling, min_params)
INFER_LEVERS: dict[str, tuple[str, int]] = {
    "fp8infer": ("tensorwise", FP8_MIN_PARAMS),
    "fp8inferr": ("rowwise", FP8_MIN_PARAMS),
    "fp8inferall": ("tensorwise", 0),
}


def fp8_inference_model(
    model: torch.nn.Module, levers: list[str], device: torch.device
) -> torch.nn.Module:
    """A copy of ``model`` as ``--precision fp8`` inference runs it (refused in one line on a
    device without float8 matmuls)."""
    recipe, min_params = next(INFER_LEVERS[lever] for lever in levers if lever in INFER_LEVERS)
    gpu = fp8_model(copy.deepcopy(model), device, recipe, min_params)
    print(f"{'+'.join(levers)}: {gpu.summary()}", file=sys.stderr)
    return gpu


def agreement_with_bf16(
    source: torch.nn.Module, fp8: torch.nn.Module, x: torch.Tensor
) -> dict[str, float]:
    """Top-1 agreement of ``fp8`` with ``source`` (fp32 weights) under bf16 autocast on the
    inputs ``x``, and the logits' relative difference (uncompiled both)."""
    with torch.inference_mode():
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            ref = source(x).float()
        got = fp8(x).float()
    return {
        "images": int(x.shape[0]),
        "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
        "logits_relative_difference": float((got - ref).norm() / ref.norm()),
    }
