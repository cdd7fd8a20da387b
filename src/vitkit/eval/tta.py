"""Test-time augmentation by small jitters: the mean of the class probabilities over the image
and copies of it moved a little, as the training's affine jitter moves digits.

- ``shift``: four copies shifted by ``shift`` pixels left, right, up and down;
- ``rotate``: two copies rotated by ``+rotate`` and ``-rotate`` degrees about the centre;
- ``zoom``: two copies scaled by ``1 + zoom`` and ``1 - zoom`` about the centre.

Every border that a view uncovers repeats the edge pixels (``replicate``/``border``), so a
digit's background stays background after normalisation; rotations and zooms sample bilinearly.
The output is the log of the mean probability: its softmax is that mean (top-k and the
confusion matrix read it as logits) and the cross-entropy on it is the ensemble's. One forward
pass per view: counted in whatever is timed (``vitkit train --tta-shift/--tta-rotate/--tta-zoom``
evaluates the test split this way, inside the run's wall time; ``vitkit eval`` the same options
on any checkpoint). No flips: digits and text are not mirror symmetric.
"""

from __future__ import annotations

import math

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


def affine_view(x: Tensor, degrees: float = 0.0, scale: float = 1.0) -> Tensor:
    """``x`` (N, C, H, W) rotated by ``degrees`` (counter-clockwise as displayed, y down) and
    scaled by ``scale`` (> 1 enlarges the content) about the centre; bilinear, edges repeated.

    The rotation is one in pixel space, written in normalised coordinates, so non-square images
    are not sheared."""
    h, w = x.shape[-2:]
    a = math.radians(degrees)
    cos, sin = math.cos(a) / scale, math.sin(a) / scale
    theta = torch.tensor(
        [[cos, -sin * h / w, 0.0], [sin * w / h, cos, 0.0]], dtype=torch.float32, device=x.device
    )
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    out = F.grid_sample(
        x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False
    )
    return out.to(x.dtype)


def jitter_views(x: Tensor, shift: int = 0, rotate: float = 0.0, zoom: float = 0.0) -> list[Tensor]:
    """``x``, its :func:`shifted_views` by ``shift`` pixels, its rotations by ±``rotate``
    degrees and its zooms by 1 ± ``zoom``: 1 + 4 + 2 + 2 views with all three on."""
    views = shifted_views(x, shift)
    if rotate:
        views += [affine_view(x, degrees=rotate), affine_view(x, degrees=-rotate)]
    if zoom:
        views += [affine_view(x, scale=1 + zoom), affine_view(x, scale=1 - zoom)]
    return views


def check_jitter(shift: int, rotate: float, zoom: float, options: bool = False) -> str | None:
    """The problem with a test-time jitter, or None: shift 0-8 px, rotate 0-45 deg, zoom 0-0.5.
    Named as config fields (``tta_shift``), or with ``options`` as command-line options."""
    name = "--tta-{}".format if options else "tta_{}".format
    if not isinstance(shift, int) or not 0 <= shift <= 8:
        return f"{name('shift')} must be 0 (off) to 8 pixels, got {shift!r}"
    if not 0.0 <= rotate <= 45.0:
        return f"{name('rotate')} must be 0 (off) to 45 degrees, got {rotate!r}"
    if not 0.0 <= zoom <= 0.5:
        return f"{name('zoom')} must be 0 (off) to 0.5 (a fraction of the size), got {zoom!r}"
    return None


class JitterTTA(nn.Module):
    """``model`` evaluated on :func:`jitter_views` of its input, probabilities averaged."""

    def __init__(self, model: nn.Module, shift: int = 0, rotate: float = 0.0, zoom: float = 0.0):
        super().__init__()
        problem = check_jitter(shift, rotate, zoom)
        if problem is not None:
            raise ValueError(problem)
        if not (shift or rotate or zoom):
            raise ValueError("test-time augmentation needs a shift, a rotation or a zoom")
        self.model = model
        self.shift, self.rotate, self.zoom = shift, rotate, zoom

    def forward(self, x: Tensor) -> Tensor:
        views = jitter_views(x, self.shift, self.rotate, self.zoom)
        probs = torch.stack([self.model(v).float().softmax(-1) for v in views]).mean(0)
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
