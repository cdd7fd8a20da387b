"""What the eval transform will allocate for an image, known from its size before decoding.

:class:`vitkit.data.transforms.PilEvalTransform` resizes the whole image, then crops the
centre. An image of extreme aspect ratio (1 x 1,000,000 pixels is a 1 KB PNG) is resized to
a strip of billions of pixels before the crop; its header says so before a pixel is decoded.
PIL resizes the width first (an intermediate of the new width x the old height), then the
height: :func:`resize_pixels` counts both.
"""

from __future__ import annotations

from vitkit.data.transforms import PilEvalTransform


def resize_pixels(transform: PilEvalTransform, width: int, height: int) -> int:
    """Pixels the resize of ``transform`` allocates for a ``width`` x ``height`` image (its
    two passes' outputs; 0 where the image is not resized)."""
    new_w, new_h = transform.resized_size(width, height)
    pixels = new_w * height if new_w != width else 0
    return pixels + (new_w * new_h if new_h != height else 0)


def resize_refusal(transform: PilEvalTransform, width: int, height: int, budget: int) -> str:
    """Why a ``width`` x ``height`` image is refused under ``budget`` pixels of resize
    intermediates ("" where it is not)."""
    need = resize_pixels(transform, width, height)
    if need <= budget:
        return ""
    new_w, new_h = transform.resized_size(width, height)
    return (
        f"{width}x{height} pixels would be resized to {new_w:,}x{new_h:,} before the "
        f"{transform.size[1]}x{transform.size[0]} centre crop ({need:,} pixels of "
        f"intermediates; at most {budget:,})"
    )
