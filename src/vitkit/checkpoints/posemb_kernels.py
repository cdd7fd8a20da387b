"""Which kernel moves a checkpoint's position embeddings to another patch grid: its source's.

The weights do not say how E_pos is resampled for another input size; each library that runs
them there has its own kernel, and two bicubics differ by about 1e-3 on small grids
(:mod:`vitkit.models.posemb_resample`). vitkit takes the kernel from the source, keeps it in the
config's ``pos_resample`` (written into vitkit's own checkpoints, so a converted file keeps it)
and uses it both on the fly (``model.resample``) and when loading at another size
(``vitkit.load(..., image_size=...)``, ``vitkit convert --image-size``, fine-tuning's
``init_resample``) unless a mode is given. The sources (timm 1.0.31, transformers 5.23):

- timm, every reader (folders, bare state dicts, eva.py): ``"bicubic-antialias"``, the defaults
  of ``timm.layers.resample_abs_pos_embed(..., interpolation='bicubic', antialias=True)``, which
  ``VisionTransformer._pos_embed`` (``dynamic_img_size``), eva.py's and both modules'
  ``checkpoint_filter_fn`` use. A bare state dict is assumed to be timm's (said in one line).
  At load time only, timm's FlexiViT and RADIO entries filter with
  ``partial(checkpoint_filter_fn, interpolation='bilinear', antialias=False)`` (RADIO base and
  huge v3 with ``align_corners=True``: ``"zoom"``; ``_create_vision_transformer``).
- Hugging Face: each class's ``interpolate_pos_encoding``. ``F.interpolate(mode="bicubic",
  align_corners=False)`` in ViT, DeiT, Dinov2, ViTMAE, CLIP, SigLIP and BEiT: ``"bicubic"``;
  Dinov2WithRegisters adds ``antialias=True``: ``"bicubic-antialias"``. (DINOv3 has no table;
  SigLIP 2's NaFlex table has its own ``naflex_*`` settings.)
- Google's ``.npz``: ``"zoom"``: both codebases that write and read these files resample a
  checkpoint's table at load time with ``scipy.ndimage.zoom(grid, ..., order=1)``
  (vision_transformer's ``vit_jax/checkpoint.py`` ``load_pretrained``, big_vision's
  ``models/vit.py`` ``resample_posemb``).
- vitkit: its config's ``pos_resample``; a config written before it held one gets the kernel
  of the source it was converted from where that is timm (or Dinov2WithRegisters, the one
  Hugging Face class with registers and a table) or ``.npz``, else ``"bicubic"``
  (:func:`vitkit.checkpoints.native.safetensors_io.load_checkpoint`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitkit.checkpoints.native.safetensors_io import CONFIG, Checkpoint
from vitkit.checkpoints.provenance import Assumption, Provenance
from vitkit.registry.model_config import Resample, ViTConfig

TIMM: Resample = "bicubic-antialias"
HF_ANTIALIAS = frozenset({"dinov2_with_registers"})  # model_type of the classes that antialias
# timm's entries whose checkpoint filter resamples otherwise (at load time only)
_TIMM_FILTER: dict[str, Resample] = {"flexi": "bilinear", "radio": "bilinear"}
_TIMM_FILTER_CORNERS = ("base_patch16_radio_v3", "huge_patch16_radio_v3")  # align_corners=True


def _config(path: Path) -> dict[str, Any]:
    try:
        found = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError, RecursionError):  # (read already by the format's reader)
        return {}
    return found if isinstance(found, dict) else {}


def _has_table(cfg: ViTConfig) -> bool:
    """A learned E_pos that ``pos_resample`` resamples (NaFlex: its own settings; a relative
    position table refuses another grid)."""
    return cfg.abs_pos_embed and not cfg.naflex and cfg.rel_pos != "bias"


BARE_TIMM = Assumption(
    "pos_resample",
    TIMM,
    "timm's kernel, antialiased bicubic; a state dict does not say how its position "
    "embeddings are resampled for another input size",
    "the DeiT and MAE authors' code and Hugging Face's ViT resample with plain bicubic",
    "bicubic",
)


def source_kernel(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with ``pos_resample`` and its provenance set from where it was read
    (``ckpt.format``); a model without a table it resamples (RoPE, NaFlex, a relative
    position table) keeps vitkit's default, and a BiT ResNet is as it is."""
    cfg, prov = ckpt.model_config, ckpt.provenance or Provenance()
    if not isinstance(cfg, ViTConfig):
        return ckpt
    fmt, path = ckpt.format, Path(ckpt.path)
    mode, source, note = cfg.pos_resample, "format", ""
    if not _has_table(cfg) and fmt != "vitkit":
        note = "no learned E_pos table to resample" if not cfg.naflex else "naflex_* instead"
    elif fmt == "timm":
        mode, note = TIMM, "timm's resample_abs_pos_embed"
        if path.is_dir() or "timm_arch" in ckpt.meta:  # a folder's name, or arch=
            source = "name"
        else:
            prov.assume(BARE_TIMM)
            source = "assumed"
    elif fmt == "hf":
        hf = _config(path)
        kind = str(hf.get("model_type", ""))
        mode = TIMM if kind in HF_ANTIALIAS else "bicubic"
        note = f"transformers' {kind or 'ViT'} interpolate_pos_encoding"
    elif fmt == "npz":
        mode, note = "zoom", "vit_jax's and big_vision's loaders: scipy.ndimage.zoom, order 1"
    elif fmt == "vitkit":  # (one written without it: native.safetensors_io says which)
        source = prov.sources.get("pos_resample", "file")
    if source != "assumed":
        prov.set(source, ["pos_resample"], note)
    ckpt.model_config = cfg.replace(pos_resample=mode)
    ckpt.provenance = prov
    return ckpt


def load_time_kernel(ckpt: Checkpoint) -> Resample | None:
    """The kernel that moves E_pos when ``ckpt`` is loaded at another size, where its source's
    loader uses another than ``pos_resample`` (timm's FlexiViT and RADIO filters); else None."""
    if ckpt.format != "timm" or not Path(ckpt.path).is_dir():
        return None
    arch = str(_config(Path(ckpt.path)).get("architecture", "")).split(".")[0]
    if arch.startswith("naflexvit"):  # (its table: the naflex_* settings)
        return None
    if any(n in arch for n in _TIMM_FILTER_CORNERS):
        return "zoom"
    return next((mode for key, mode in _TIMM_FILTER.items() if key in arch), None)
