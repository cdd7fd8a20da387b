"""Hugging Face's SigLIP 2 NaFlex image tower (``Siglip2VisionModel``) ↔ vitkit: pure functions.

``Siglip2VisionModel`` (``model_type: siglip2_vision_model``; the image tower of a whole
``Siglip2Model``, ``siglip2``) is SigLIP's tower (:mod:`vitkit.checkpoints.hf.siglip`: same block,
norm and MAP head keys) made NaFlex (:mod:`vitkit.models.naflex_packing`, ``naflex=True``):

- ``embeddings.patch_embedding`` is a ``Linear(C*P*P, D)`` over patches flattened (row, column,
  channel), the same matrix as vitkit's convolution kernel [D, C, P, P], permuted;
- ``embeddings.position_embedding.weight`` [num_patches, D] is E_pos on a square grid of
  sqrt(num_patches) (``naflex_grid``), resampled to each image's (h, w) patch grid with
  ``F.interpolate(mode="bilinear", antialias=True, align_corners=False)``
  (``naflex_interp="bilinear"``), on the CPU in float32 and at its own grid too
  (``naflex_resample_own``);
- its inputs are vitkit's NaFlex batch under other names: ``pixel_values`` [B, N, C*P*P] are
  ``patches``, ``pixel_attention_mask`` [B, N] is ``patch_valid``, ``spatial_shapes`` [B, 2]
  the (h, w) whose row-major grid is ``patch_coord`` (:func:`vitkit.models.naflex_packing.pack`
  makes all three); padding is masked as keys in the encoder and the MAP head, as there.

``Siglip2ImageProcessor`` resizes each image, keeping its aspect ratio, to at most
``max_num_patches`` patches; vitkit does that with ``vitkit predict --max-seq-len N``, and
otherwise resizes to the square grid at native size (said once when read).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from vitkit.checkpoints.hf import siglip as hf_siglip
from vitkit.checkpoints.hf.processor import hf_preprocess, vit_to_hf_preprocess
from vitkit.checkpoints.hf.vit_model import ACTIVATIONS, ENCODER_FIELDS, encoder_shape
from vitkit.checkpoints.provenance import Assumption
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

MODEL_TYPES = ("siglip2_vision_model", "siglip2")
CLASSES = ("Siglip2VisionModel", "Siglip2Model")
FIELDS = {
    **ENCODER_FIELDS,
    "naflex_grid": "num_patches",
    "pool": "vision_use_head",
    "attn_dropout": "attention_dropout",
    # fixed by the class (None: no key): how E_pos is resampled; the size is the grid's
    **dict.fromkeys(
        "image_size naflex naflex_pos naflex_interp naflex_antialias naflex_ar_preserving "
        "naflex_align_corners naflex_resample_own class_token".split()
    ),
}
_READS = "Siglip2VisionModel and the image tower of Siglip2Model"


def is_siglip2(hf: dict[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is a SigLIP 2 model's."""
    return hf.get("model_type") in MODEL_TYPES


def _vision(hf: dict[str, Any]) -> dict[str, Any]:
    if hf.get("model_type") != "siglip2":
        return hf
    vision = hf.get("vision_config")
    if not isinstance(vision, dict):
        raise VitkitError("a Siglip2Model config.json without a vision_config")
    return vision


def siglip2_to_vit_config(hf: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """A ``Siglip2VisionConfig`` dict (or a ``Siglip2Config``'s ``vision_config``) →
    :class:`ViTConfig`: NaFlex with E_pos on its square grid, no class token, the MAP head
    (``vision_use_head``) or the masked mean of the tokens."""
    hf = _vision(hf)
    act = hf.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise VitkitError(f"{source}: hidden_act {act!r} is not a GELU vitkit has")
    n, p = hf.get("num_patches", 256), hf.get("patch_size", 16)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or math.isqrt(n) ** 2 != n:
        raise VitkitError(f"{source}: num_patches={n!r} is not a square grid of patches")
    if not isinstance(p, int) or isinstance(p, bool):
        raise VitkitError(f"{source}: patch_size={p!r}: SigLIP 2 has square patches (an int)")
    side = math.isqrt(n)
    try:
        return ViTConfig(
            image_size=(side * p, side * p),
            patch_size=(p, p),
            num_classes=0,
            **encoder_shape(hf),
            pool="map" if hf.get("vision_use_head", True) else "gap",
            attn_dropout=float(hf.get("attention_dropout", 0.0)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-6)),
            gelu=ACTIVATIONS[act],
            naflex=True,
            naflex_grid=(side, side),
            naflex_interp="bilinear",
            naflex_antialias=True,
            naflex_resample_own=True,
        )
    except (TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"{source}: malformed SigLIP 2 vision config ({e})") from None


def _fixed(cfg: ViTConfig) -> ViTConfig:
    """The same tower at its own grid without NaFlex: SigLIP 1's layout
    (:mod:`vitkit.checkpoints.hf.siglip`)."""
    gh, gw = cfg.naflex_grid
    size = (gh * cfg.patch_size[0], gw * cfg.patch_size[1])
    return cfg.replace(
        naflex=False,
        image_size=size,
        naflex_interp="bicubic",
        naflex_grid=(16, 16),
        naflex_resample_own=False,
    )


def siglip2_to_state_dict(sd: dict[str, Tensor], cfg: ViTConfig, source: str) -> dict[str, Tensor]:
    """SigLIP 2 weights → vitkit state dict (the patch embedding's matrix as a kernel)."""
    out = hf_siglip.siglip_to_state_dict(sd, _fixed(cfg), source, reads=_READS)
    w = out["patch_embed.proj.weight"]
    (ph, pw), c = cfg.patch_size, cfg.in_chans
    if w.ndim != 2 or w.shape[1] != ph * pw * c:
        raise VitkitError(
            f"{source}: embeddings.patch_embedding.weight {tuple(w.shape)} is not a linear map "
            f"of {ph}x{pw}x{c} patch values"
        )
    out["patch_embed.proj.weight"] = w.reshape(-1, ph, pw, c).permute(0, 3, 1, 2).contiguous()
    return out


def siglip2_write_refusal(cfg: ViTConfig) -> str | None:
    """Why ``Siglip2VisionModel`` cannot hold ``cfg`` (None when it can)."""
    gh, gw = cfg.naflex_grid
    odd = {
        "a factorised E_pos": cfg.naflex_pos != "learned",
        "a non-square E_pos grid": gh != gw,
        "non-square patches": cfg.patch_size[0] != cfg.patch_size[1],
        "E_pos resampling other than bilinear, antialiased, corners not aligned, to (h, w)": (
            cfg.naflex_interp != "bilinear"
            or not cfg.naflex_antialias
            or cfg.naflex_align_corners
            or cfg.naflex_ar_preserving
        ),
        "a pooling other than the MAP head": cfg.pool != "map",
    }
    bad = [k for k, v in odd.items() if v]
    if bad:
        return (
            f"Hugging Face's NaFlex tower (Siglip2VisionModel) cannot hold {'; '.join(bad)}; "
            "write timm instead"
        )
    return None


def state_dict_to_siglip2(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit → ``Siglip2VisionModel`` weights (transformers 5's names, no prefix)."""
    why = siglip2_write_refusal(cfg)
    if why:
        raise VitkitError(why)
    out = hf_siglip.state_dict_to_siglip(sd, _fixed(cfg))
    w = sd["patch_embed.proj.weight"]
    out["embeddings.patch_embedding.weight"] = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)
    return {k: v.contiguous() for k, v in out.items()}


def vit_to_siglip2_config(cfg: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` of the written ``Siglip2VisionModel``."""
    gh, gw = cfg.naflex_grid
    out = hf_siglip.vit_to_siglip_config(_fixed(cfg))
    del out["image_size"]
    out.update(
        architectures=["Siglip2VisionModel"],
        model_type="siglip2_vision_model",
        num_patches=gh * gw,
    )
    return out


def siglip2_preprocess(pp: dict[str, Any] | None, cfg: ViTConfig) -> PreprocessConfig:
    """``Siglip2ImageProcessor``'s settings at the model's native square size (its
    ``max_num_patches`` resize is ``--max-seq-len``; see :func:`processor_assumption`)."""
    if not pp:
        return PreprocessConfig.for_model(cfg)
    p = pp.get("patch_size", 16)
    if p != cfg.patch_size[0]:
        raise VitkitError(f"patch_size={p!r} is not the model's {cfg.patch_size[0]}")
    rest = {k: v for k, v in pp.items() if k not in ("patch_size", "max_num_patches")}
    h, w = cfg.image_size
    # ViTImageProcessor's defaults are Siglip2ImageProcessor's: bilinear, mean = std = 0.5
    rest.update(image_processor_type="ViTImageProcessor", size={"height": h, "width": w})
    return hf_preprocess(rest, cfg)


def processor_assumption(pp: dict[str, Any] | None, cfg: ViTConfig) -> Assumption | None:
    """The one line said when a folder's processor resizes by ``max_num_patches``."""
    if not pp or not pp.get("do_resize", True):
        return None
    n = pp.get("max_num_patches", 256)
    return Assumption(
        "image_size",
        cfg.image_size,
        f"resized to the native square grid; Siglip2ImageProcessor keeps each image's aspect "
        f"ratio with at most max_num_patches={n} patches",
        f"vitkit predict does that with --max-seq-len {n}",
        None,
    )


def vit_to_siglip2_preprocess(p: PreprocessConfig, cfg: ViTConfig) -> dict[str, Any]:
    """``preprocessor_config.json``: ``Siglip2ImageProcessor`` with ``p``'s normalisation and
    filter, at most the model's native grid of patches."""
    base = vit_to_hf_preprocess(p)
    gh, gw = cfg.naflex_grid
    keep = ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std", "resample")
    out = {k: base[k] for k in keep if k in base}
    out.update(
        image_processor_type="Siglip2ImageProcessor",
        do_resize=True,
        patch_size=cfg.patch_size[0],
        max_num_patches=gh * gw,
    )
    return out
