"""``precision="auto"`` of :func:`vitkit.engines.runner` (``vitkit serve``'s default, and
``--precision auto`` of predict and eval): bf16 where the CPU multiplies bf16 natively
(AVX512-BF16 or AMX: :func:`vitkit.hardware.native_bf16`) and the model's bf16 top-1 agrees
with its fp32 top-1 on :data:`IMAGES` images measured when it loads; fp32 elsewhere; an
exported engine or a .pt2 package at its own. The runner's ``precision_why`` says which and
why (serve's ready line and ``GET /v1/info`` show it).

The images are synthetic (smooth random fields at the model's input size, its own
normalisation): a server has the checkpoint, not its data. A checkpoint whose bf16 answers
differ on more than :data:`MAX_DISAGREEMENTS` of them runs fp32; ``precision="bf16"`` or
``"fp32"`` overrides the choice either way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

IMAGES = 32
MAX_DISAGREEMENTS = 1  # of IMAGES: more and the model runs fp32


def auto_choice(own_precision: bool) -> tuple[str | None, str]:
    """The precision ``auto`` tries first (None: an exported model's own) and why."""
    from vitkit.hardware import native_bf16

    if own_precision:
        return None, "auto: an exported engine runs at the precision it was exported at"
    if not native_bf16(torch.device("cpu")):
        return "fp32", "auto: fp32, this CPU has no native bf16 (AVX512-BF16 or AMX)"
    return "bf16", "auto: bf16, native on this CPU"


def synthetic_images(channels: int, height: int, width: int, n: int = IMAGES) -> Tensor:
    """``n`` uint8 [C, H, W] images: random fields at 1/8 of the size, upsampled (bilinear),
    plus a little noise; the same every time (seeded)."""
    g = torch.Generator().manual_seed(0)
    small = torch.rand(n, channels, max(1, height // 8), max(1, width // 8), generator=g)
    big = torch.nn.functional.interpolate(small, size=(height, width), mode="bilinear")
    noise = torch.rand(n, channels, height, width, generator=g) * 0.1
    return ((big * 0.9 + noise) * 255).round().clamp(0, 255).to(torch.uint8)


def top1_agreement(reference: Any, candidate: Any, preprocess: Any) -> tuple[int, int]:
    """How many of :func:`synthetic_images` ``candidate`` and the fp32 ``reference`` put in
    the same class (normalised as ``preprocess``, the checkpoint's, says), of how many."""
    from vitkit.data.transforms import normalize

    pre = preprocess
    images = synthetic_images(pre.channels, *pre.image_size)
    x = normalize(images.float(), pre.mean, pre.std, pre.rescale_factor)
    with torch.inference_mode():
        a = reference(x).float().argmax(-1)
        b = candidate(x).float().argmax(-1)
    return int((a == b).sum()), len(images)


def agreement_why(agree: int, n: int) -> tuple[bool, str]:
    """Whether bf16 stays, given ``agree`` of ``n`` top-1 answers the same as fp32's, and the
    words added to (or replacing) the choice's reason."""
    if n - agree > MAX_DISAGREEMENTS:
        return False, (
            f"auto: fp32, the bf16 top-1 agreed with fp32's on only {agree} of {n} synthetic "
            "images measured at start"
        )
    return True, (
        f", top-1 agreeing with fp32's on {agree} of {n} synthetic images measured at start "
        "(--precision fp32 to run fp32)"
    )
