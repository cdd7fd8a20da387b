"""Test-time augmentation by small translations: the mean of the class probabilities over the
image and its four copies shifted by ``shift`` pixels left, right, up and down.

The border that a shift uncovers repeats the edge pixels (``replicate``), so a digit's
background stays background after normalisation. The output is the log of the mean
probability: its softmax is that mean (top-k and the confusion matrix read it as logits) and
the cross-entropy on it is the ensemble's. Five forward passes per image: counted in whatever
is timed (``vitkit train --tta-shift`` evaluates the test split this way, inside the run's wall
time; ``vitkit eval --tta-shift`` any checkpoint). No flips: digits and text are not mirror
symmetric.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def shifted_views(x: Tensor, shift: int) -> list[Tensor]:
    """``x`` (N, C, H, W) and its copies moved by ``shift`` pixels along each axis, both ways."""
    if shift <= 0:
        return [x]
    h, w = x.shape[-2:]
    s = shift
    padded = F.pad(x, (s, s, s, s), mode="replicate")
    views = [x]
    for dy, dx in ((0, s), (0, -s), (s, 0), (-s, 0)):  # content moves right, left, down, up
        views.append(padded[..., s - dy : s - dy + h, s - dx : s - dx + w])
    return views


class ShiftTTA(nn.Module):
    """``model`` evaluated on :func:`shifted_views` of its input, probabilities averaged."""

    def __init__(self, model: nn.Module, shift: int) -> None:
        super().__init__()
        if shift < 1:
            raise ValueError(f"shift must be >= 1 pixel, got {shift}")
        self.model = model
        self.shift = shift

    def forward(self, x: Tensor) -> Tensor:
        views = shifted_views(x, self.shift)
        probs = torch.stack([self.model(v).float().softmax(-1) for v in views]).mean(0)
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
