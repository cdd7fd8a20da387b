"""Hugging Face's ``preprocessor_config.json`` ↔ :class:`PreprocessConfig`, setting by setting.

Read: ``do_resize``, ``size`` (``height``/``width``: both sides, the aspect ratio not kept;
``shortest_edge``: the shorter side, aspect kept; an int: a square, or the shortest edge for
CLIP's and BiT's processors, as transformers reads it), ``resample``, ``do_center_crop``,
``crop_size``, ``do_rescale``, ``rescale_factor``, ``do_normalize``, ``image_mean``,
``image_std`` and ``do_convert_rgb`` (vitkit always converts to the model's channels). A key
absent takes the processor class's default, as transformers does. Any other key that would
change the pixels (``do_pad: true``, ``crop_pct``, any key it does not know) is refused by
name; bookkeeping keys and steps switched off (``do_pad: false``, null, 0) are not. What
cannot be one fixed input size (``shortest_edge`` without a crop, ``longest_edge``) is
refused too. Without a resize, an image is centre-cropped (or zero-padded) to the size.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from vitkit.checkpoints.provenance import Assumption
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
# Processor family → its class defaults that differ from ViTImageProcessor's: an int size is the
# shortest edge; crops by default; resample; mean; std.
_FAMILY: dict[str, tuple[bool, bool, int, tuple[float, ...], tuple[float, ...]]] = {
    "ViT": (False, False, 2, (0.5,) * 3, (0.5,) * 3),
    "Siglip": (False, False, 3, (0.5,) * 3, (0.5,) * 3),
    "CLIP": (True, True, 3, _CLIP_MEAN, _CLIP_STD),
    "ChineseCLIP": (True, True, 3, _CLIP_MEAN, _CLIP_STD),
    "Bit": (True, True, 3, _CLIP_MEAN, _CLIP_STD),
    "DeiT": (False, True, 3, _IMAGENET_MEAN, _IMAGENET_STD),
    "DINOv3ViT": (False, False, 2, _IMAGENET_MEAN, _IMAGENET_STD),
    "Beit": (False, False, 3, (0.5,) * 3, (0.5,) * 3),
}
_READ = {
    "do_resize",
    "size",
    "resample",
    "do_center_crop",
    "crop_size",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_convert_rgb",
}
_BOOKKEEPING = {
    "image_processor_type",
    "processor_class",
    "feature_extractor_type",
    "_processor_class",
    "do_reduce_labels",  # segmentation labels, not pixels
    "reduce_labels",
    "auto_map",
    "use_fast",
    "input_data_format",
    "data_format",
    "return_tensors",
    "device",
    "disable_grouping",
}


def _family(pp: dict[str, Any]) -> str:
    kind = str(pp.get("image_processor_type") or pp.get("feature_extractor_type") or "ViT")
    for suffix in ("ImageProcessorFast", "ImageProcessorPil", "ImageProcessor", "FeatureExtractor"):
        kind = kind.removesuffix(suffix)
    return kind if kind in _FAMILY else "ViT"


def _side_pair(name: str, value: Any) -> tuple[int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value), int(value)
    if isinstance(value, dict) and set(value) == {"height", "width"}:
        return int(value["height"]), int(value["width"])
    raise VitkitError(f"{name}={value!r}: expected {{'height', 'width'}} or an int")


def _per_channel(name: str, value: Any, c: int) -> tuple[float, ...]:
    v = tuple(value) if isinstance(value, list | tuple) else (value,)
    if len(v) == 1:
        v = v * c
    if len(v) < c:
        raise VitkitError(f"{name}={value!r}: {len(v)} values for {c} channels")
    return tuple(float(x) for x in v[:c])


def _refuse_unknown(pp: dict[str, Any]) -> None:
    """Any key vitkit does not read, unless bookkeeping or switched off (false, null, 0)."""
    for key, value in pp.items():
        if key in _READ or key in _BOOKKEEPING or not value:
            continue
        raise VitkitError(
            f"{key}={value!r}: a preprocessing setting vitkit does not read (it may change the "
            "pixels); remove the key to use the checkpoint without it"
        )


def hf_preprocess(pp: dict[str, Any] | None, cfg: ViTConfig) -> PreprocessConfig:
    """``preprocessor_config.json`` → :class:`PreprocessConfig` (see the module's docstring).
    The crop (else the resized size) is the size fed to the model: DINOv2's 224 px on a 518 px
    model interpolates E_pos, as transformers does."""
    c = cfg.in_chans
    if not pp:
        return PreprocessConfig.for_model(cfg)
    if not isinstance(pp, dict):
        raise VitkitError(f"expected a JSON object, got {type(pp).__name__}")
    _refuse_unknown(pp)
    shortest_int, crops, resample, mean, std = _FAMILY[_family(pp)]
    do_resize = pp.get("do_resize", True) is not False
    do_crop = bool(pp.get("do_center_crop", crops))
    size = pp.get("size")
    crop = _side_pair("crop_size", pp.get("crop_size", 224)) if do_crop else None
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = {"shortest_edge": int(size)} if shortest_int else {"height": size, "width": size}
    if size is None:
        size = {"height": cfg.image_size[0], "width": cfg.image_size[1]}
    resize, crop_pct = "none", 1.0
    image_size = crop or cfg.image_size
    if do_resize and isinstance(size, dict) and set(size) == {"shortest_edge"}:
        if crop is None:
            raise VitkitError(
                f"size={size} without a centre crop gives every image its own size; vitkit "
                "feeds the model one size"
            )
        if crop[0] != crop[1]:
            raise VitkitError(f"crop_size={crop} is not square; with size.shortest_edge")
        resize, crop_pct = "shortest_edge", crop[0] / int(size["shortest_edge"])
    elif do_resize:
        h, w = _side_pair("size", size)
        resize = "squash"
        if crop is None:
            image_size = (h, w)
        else:
            crop_pct = crop[0] / h
            if math.floor(crop[1] / crop_pct + 1e-6) != w:
                raise VitkitError(f"crop_size={crop} is not the same fraction of size={size}")
    if crop_pct > 1:
        raise VitkitError(f"crop_size={crop} is larger than the resized size={size}")
    if pp.get("do_normalize", True) is False:
        mean, std = (0.0,) * c, (1.0,) * c
    else:
        mean = _per_channel("image_mean", pp.get("image_mean", mean), c)
        std = _per_channel("image_std", pp.get("image_std", std), c)
    factor = float(pp.get("rescale_factor", 1 / 255))
    resample = pp.get("resample", resample)
    if resample not in RESAMPLE:
        raise VitkitError(f"resample={resample!r}: not one of PIL's filters {sorted(RESAMPLE)}")
    return PreprocessConfig(
        image_size=image_size,
        channels=c,
        mean=mean,
        std=std,
        interpolation=RESAMPLE[int(resample)],
        crop_pct=crop_pct,
        resize=resize,
        rescale_factor=factor if pp.get("do_rescale", True) is not False else 1.0,
    )


def no_resize_assumption(pp: dict[str, Any] | None, cfg: ViTConfig) -> Assumption | None:
    """The one line said when a processor neither resizes nor crops (``do_resize: false``, no
    centre crop): transformers feeds an image as it is and refuses one that is not the model's
    size; vitkit centre-crops it (zero-padded where smaller) to that size."""
    if not isinstance(pp, dict) or pp.get("do_resize", True) is not False:
        return None
    if bool(pp.get("do_center_crop", _FAMILY[_family(pp)][1])):
        return None  # (a crop to the size: transformers' pixels too)
    h, w = cfg.image_size
    return Assumption(
        "resize",
        "none",
        f"do_resize is false and there is no centre crop: transformers feeds each image as it "
        f"is and refuses one that is not {h}x{w} px; vitkit centre-crops (zero-pads a smaller "
        f"one) each image to {h}x{w} px, the same pixels only for images of that size",
        f"to resize every image to {h}x{w} px instead",
        "squash",
    )


def vit_to_hf_preprocess(p: PreprocessConfig) -> dict[str, Any]:
    """The settings transformers reads back as ``p``: ViTImageProcessor (both sides resized),
    DeiT's (both sides resized, then a centre crop; no resize, only the crop) or BiT's (the
    shorter side resized, then a centre crop, as CLIP's and DINOv2's). Not representable: a
    non-square size with the shorter side (written as its shorter side) and timm's rounding
    of the crop's offset (``crop_offset="round"``; Hugging Face floors)."""
    resample = {v: k for k, v in RESAMPLE.items()}[p.interpolation]
    h, w = p.image_size
    crop = {"height": h, "width": w}
    if p.resize == "shortest_edge" and h != w:
        raise VitkitError(
            f"a non-square input {h}x{w} resized keeping the aspect ratio (timm's "
            "ResizeKeepRatio) has no Hugging Face image processor that computes it; write a "
            "timm folder (--to timm), or set -o resize=squash first"
        )
    if p.resize == "shortest_edge":
        short = math.floor(min(h, w) / p.crop_pct + 1e-6)
        resize: dict[str, Any] = {
            "image_processor_type": "BitImageProcessor",
            "do_resize": True,
            "size": {"shortest_edge": short},
            "do_center_crop": True,
            "crop_size": crop,
        }
    elif p.resize == "squash" and p.crop_pct == 1.0:
        resize = {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": crop}
    else:
        size = [math.floor(s / p.crop_pct + 1e-6) for s in (h, w)]
        resize = {
            "image_processor_type": "DeiTImageProcessor",
            "do_resize": p.resize == "squash",
            "size": {"height": size[0], "width": size[1]},
            "do_center_crop": True,
            "crop_size": crop,
        }
    plain = all(m == 0 for m in p.mean) and all(s == 1 for s in p.std)
    return {
        **resize,
        "resample": resample,
        "do_rescale": p.rescale_factor != 1.0,
        "rescale_factor": p.rescale_factor if p.rescale_factor != 1.0 else 1 / 255,
        "do_normalize": not plain,
        "image_mean": list(p.mean),
        "image_std": list(p.std),
        "do_convert_rgb": p.channels == 3,
    }
