"""Any ViT checkpoint in, any out: format detection, reading, writing, ``vitkit.load``.

Formats (``FORMATS``):

- ``vitkit``: our directory (see :mod:`vitkit.checkpoints.native.safetensors_io`), or a run
  directory;
- ``npz``: Google's ``.npz`` (vision_transformer, AugReg, big_vision; see
  :mod:`vitkit.checkpoints.google.npz`);
- ``timm``: a timm state dict (``.pth`` / ``.bin`` / ``.safetensors``, possibly inside a training
  checkpoint) or a timm model folder (``config.json`` with ``architecture`` + weights);
- ``hf``: a Hugging Face model folder (``config.json`` with ``model_type: vit`` +
  ``model.safetensors`` or ``pytorch_model.bin``, optionally ``preprocessor_config.json``);
  SigLIP's image tower (``model_type: siglip_vision_model`` / ``siglip``) through
  :mod:`vitkit.checkpoints.hf.siglip`, DINOv3 (``dinov3_vit``) through
  :mod:`vitkit.checkpoints.hf.dinov3`, SigLIP 2 NaFlex through
  :mod:`vitkit.checkpoints.hf.siglip2`, BEiT through :mod:`vitkit.checkpoints.hf.beit`.

Reading never executes code: safetensors, ``torch.load(weights_only=True)``, ``np.load(...,
allow_pickle=False)``. Every converter is strict: keys it does not understand are an error that
names them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import re
import struct
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from vitkit.checkpoints import posemb_kernels
from vitkit.checkpoints.adapt import adapt
from vitkit.checkpoints.arch import check_name_against_weights, named_checkpoint, named_hub
from vitkit.checkpoints.description import describe  # noqa: F401  (vitkit.checkpoints.describe)
from vitkit.checkpoints.google import npz as npz_conv
from vitkit.checkpoints.hf import backbone as hf_backbone
from vitkit.checkpoints.hf import beit as hf_beit
from vitkit.checkpoints.hf import dinov3 as hf_dinov3
from vitkit.checkpoints.hf import siglip as hf_siglip
from vitkit.checkpoints.hf import siglip2 as hf_siglip2
from vitkit.checkpoints.hf import vit_family as hf_family
from vitkit.checkpoints.hf import vit_model as hf_conv
from vitkit.checkpoints.hf.hub_cache import looks_like_id, resolve_model_id
from vitkit.checkpoints.hf.processor import no_resize_assumption
from vitkit.checkpoints.native.safetensors_io import (
    CONFIG,
    LATEST,
    WEIGHTS,
    Checkpoint,
    check_weights_fit,
    load_checkpoint,
    load_state_dict_strict,
)
from vitkit.checkpoints.overrides_applied import apply_overrides
from vitkit.checkpoints.provenance import PAPER_PREPROCESS, Provenance, carried
from vitkit.checkpoints.timm import beit_relpos as timm_relpos
from vitkit.checkpoints.timm import eva as timm_eva
from vitkit.checkpoints.timm import eva_bare as timm_eva_bare
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.checkpoints.timm.folder_reading import PRE as _PRE
from vitkit.checkpoints.timm.folder_reading import (
    read_timm_eva,
    read_timm_relpos,
    read_timm_vit,
    timm_pretrained_cfg,
)
from vitkit.checkpoints.timm.folder_reading import wrap as _wrap
from vitkit.checkpoints.timm.names import EVA_NAMES, relpos_module
from vitkit.checkpoints.writing import FORMATS, Format, write_checkpoint  # noqa: F401
from vitkit.errors import VitkitError, why_unreadable
from vitkit.models.posemb_resample import Resample
from vitkit.registry.model_config import PreprocessConfig, ViTConfig
from vitkit.registry.timm_keywords import from_timm

_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".tar")


# ---------------------------------------------------------------------------------------------
# Detection


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitkitError(f"{path}: unreadable JSON ({e})") from None
    except RecursionError:  # a hostile file nested deeper than Python's parser goes
        raise VitkitError(f"{path}: unreadable JSON (nested too deeply)") from None


def detect_format(path: str | Path) -> Format:
    """Which format ``path`` holds (from its layout and, for bare weight files, its keys)."""
    p = Path(path)
    if not p.exists():
        raise VitkitError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / LATEST).is_file() or (p / "checkpoints" / LATEST).is_file():
            return "vitkit"
        if not (p / CONFIG).is_file():
            raise VitkitError(f"{p}: a directory without {CONFIG}; not a checkpoint vitkit knows")
        cfg = _read_json(p / CONFIG)
        if isinstance(cfg, dict) and cfg.get("format") == "vitkit":
            return "vitkit"
        if isinstance(cfg, dict) and "architecture" in cfg:
            return "timm"
        if isinstance(cfg, dict) and ("model_type" in cfg or "architectures" in cfg):
            return "hf"
        raise VitkitError(f"{p / CONFIG}: neither a vitkit, timm nor Hugging Face config")
    if p.suffix == ".npz":
        return "npz"
    if p.suffix == ".safetensors":
        if (p.parent / CONFIG).is_file():
            return detect_format(p.parent)
        return _format_of_keys(_read_safetensors(p), p)
    if p.suffix in _TORCH_SUFFIXES:
        return _format_of_keys(_torch_load(p), p)
    raise VitkitError(
        f"{p}: unknown checkpoint file type {p.suffix!r} (expected a directory, .npz, "
        ".safetensors, .pth, .pt or .bin)"
    )


def _format_of_keys(sd: dict[str, Tensor], p: Path) -> Format:
    if any(k.startswith(("embeddings.", "vit.embeddings.", "beit.embeddings.")) for k in sd):
        return "hf"
    if "patch_embed.proj.weight" in sd or "pos_embed" in sd or timm_conv.is_timm_bit(sd):
        return "timm"
    if any(k.startswith("embeds.") for k in sd):  # timm's NaFlexVit (refused bare: its folder)
        return "timm"
    raise VitkitError(f"{p}: weights of an unknown model (first keys: {', '.join(list(sd)[:5])})")


def _read_safetensors(p: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(p))
    except (OSError, SafetensorError) as e:
        raise VitkitError(f"{p}: unreadable safetensors file ({why_unreadable(p, e)})") from None


def _torch_load(p: Path) -> dict[str, Tensor]:
    try:
        with warnings.catch_warnings():  # (a plain pickle's protocol: not the user's concern)
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            # (the MAE and DeiT authors' files hold their argparse options: plain data)
            with torch.serialization.safe_globals([argparse.Namespace]):
                obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # PyTorch's message advises weights_only=False, i.e. running the file's code: not quoted.
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f" (it refers to {found[1]})" if found else ""
        raise VitkitError(
            f"{p}: refused to unpickle: the file holds Python objects other than tensors{what}, "
            "which could run code when loaded. vitkit reads tensors only: a state dict saved "
            "with torch.save, .safetensors, .npz, or a timm / Hugging Face folder. If you trust "
            "the file's source, load it yourself and save its state dict alone "
            "(safetensors.torch.save_file(state_dict, 'model.safetensors'))"
        ) from None
    except (OSError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as e:
        raise VitkitError(f"{p}: unreadable PyTorch file, truncated or corrupt ({e})") from None
    except (KeyError, IndexError, struct.error) as e:  # (the legacy format's reader on junk)
        raise VitkitError(f"{p}: unreadable PyTorch file, corrupt ({type(e).__name__})") from None
    return timm_conv.unwrap_state_dict(obj, str(p))


def _weights_in(p: Path) -> dict[str, Tensor]:
    for name in ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        if (p / name).is_file():
            f = p / name
            return _read_safetensors(f) if f.suffix == ".safetensors" else _torch_load(f)
    if (p / "model.safetensors.index.json").is_file():
        raise VitkitError(f"{p}: sharded weights are not supported yet; merge the shards")
    raise VitkitError(f"{p}: no model.safetensors or pytorch_model.bin")


# ---------------------------------------------------------------------------------------------
# Reading


def read_checkpoint(
    path: str | Path,
    *,
    format: Format | None = None,
    num_heads: int | None = None,
    grid: tuple[int, int] | None = None,
    arch: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    pre_logits: bool | None = None,
    resample: Resample | None = None,
    overrides: Mapping[str, Any] | None = None,
    head_init: str = "zero",
) -> Checkpoint:
    """Read a checkpoint of any supported format as a vitkit :class:`Checkpoint`.

    ``arch``: a registered timm name (``"vit_base_patch16_224"``) stating the architecture and
    preprocessing of a bare timm state dict, read as a folder naming it would be (nothing
    assumed; a name its weights contradict is refused, :mod:`.arch`).
    ``num_heads`` / ``grid`` fill in what a bare state dict cannot say (heads of a non-standard
    timm width; a non-square position-embedding grid). ``image_size``, ``num_classes``,
    ``pre_logits`` and ``resample`` move it to another resolution or head (:func:`adapt`;
    ``resample`` None: the kernel of the checkpoint's source, :mod:`.posemb_kernels`).
    ``checkpoint.format`` says which format it was read from; a converted checkpoint's
    ``meta["converted_from"]`` records the source (and is kept when it is saved as vitkit).

    ``overrides`` are config fields the caller states (``gelu="quick"``, ``block="post"``,
    ``dropout=0.1``): they replace what was read or assumed. ``checkpoint.provenance`` says
    where each field came from; each setting that was assumed and changes the numbers is said
    in one :class:`vitkit.errors.AssumptionWarning` line (:mod:`.provenance`).

    ``path`` may also be a Hugging Face model id, ``ORG/NAME`` or ``ORG/NAME@REVISION``, read
    from the local Hugging Face cache (:mod:`vitkit.checkpoints.hf.hub_cache`; never downloaded); an
    existing local path of the same name wins.
    """
    p = Path(path)
    if not p.exists() and looks_like_id(str(path)):
        snapshot = resolve_model_id(str(path))
        try:
            ckpt = read_checkpoint(
                snapshot,
                format=format,
                num_heads=num_heads,
                grid=grid,
                arch=arch,
                image_size=image_size,
                num_classes=num_classes,
                pre_logits=pre_logits,
                resample=resample,
                overrides=overrides,
                head_init=head_init,
            )
        except VitkitError as e:  # (the snapshot's path alone would not say which model)
            raise VitkitError(f"{path}: {e}") from None
        if "converted_from" in ckpt.meta:
            ckpt.meta["converted_from"] = {**ckpt.meta["converted_from"], "model_id": str(path)}
        return ckpt
    fmt = format or detect_format(p)
    if fmt not in FORMATS:
        raise VitkitError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    named = None if arch is None else named_hub(arch, p, fmt, _read_json)
    if fmt == "vitkit":
        ckpt = load_checkpoint(p)
        ckpt.provenance = Provenance().set("file", [*ckpt.model_config.to_dict(), *_PRE])
        for source, fields in carried(ckpt.meta).items():  # a converted file's given/assumed
            ckpt.provenance.set(source, fields, "when it was converted")
    elif fmt == "npz":
        arrays = npz_conv.canonical_arrays(npz_conv.read_npz(p))
        cfg = _wrap(lambda: npz_conv.npz_config(arrays, grid), p)
        sd = _wrap(lambda: npz_conv.npz_to_state_dict(arrays, cfg), p)
        ckpt = Checkpoint(p, cfg, _paper_preprocess(cfg), sd)
        ckpt.provenance = npz_conv.npz_provenance(cfg, _PRE)
    elif fmt == "timm":
        ckpt = _read_timm(p, num_heads, grid, named, image_size)
    else:
        ckpt = _read_hf(p)
    ckpt.format = fmt
    ckpt = posemb_kernels.source_kernel(ckpt)  # how its E_pos is resampled: the source's
    stated = dict(overrides or {})
    if num_heads is not None:  # (every format: a file that says its heads must agree)
        stated = {"num_heads": num_heads, **stated}
    ckpt = apply_overrides(ckpt, stated, p)
    if fmt != "vitkit":  # (load_checkpoint has checked its own, apply_overrides the rest)
        check_weights_fit(ckpt.model_config, ckpt.state_dict, config_source=str(p), source=str(p))
    if fmt != "vitkit":
        ckpt.meta = {**ckpt.meta, "converted_from": {"format": fmt, "path": str(p)}}
    if ckpt.provenance is not None:
        ckpt.provenance.warn(str(p), stacklevel=3)
    if image_size is None and num_classes is None and pre_logits is None:
        if fmt != "vitkit":  # released checkpoints with zeroed heads exist; warn about them
            adapt(ckpt.model_config, ckpt.state_dict, source=str(p))
        return ckpt
    return adapt_checkpoint(
        ckpt,
        image_size=image_size,
        num_classes=num_classes,
        pre_logits=pre_logits,
        resample=posemb_kernels.load_time_kernel(ckpt) if resample is None else resample,
        head_init=head_init,
    )


def adapt_checkpoint(
    ckpt: Checkpoint,
    *,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    pre_logits: bool | None = None,
    resample: Resample | None = None,
    head_init: str = "zero",
) -> Checkpoint:
    """``ckpt`` at another resolution and/or head (see :func:`adapt`), its preprocessing at the
    new size; class names are kept only with the same head."""
    cfg, sd = adapt(
        ckpt.model_config,
        ckpt.state_dict,
        image_size=image_size,
        num_classes=num_classes,
        pre_logits=pre_logits,
        resample=resample,
        source=str(ckpt.path),
        head_init=head_init,
    )
    pre = ckpt.preprocess.replace(image_size=cfg.image_size)
    names = ckpt.class_names if cfg.num_classes == ckpt.model_config.num_classes else ()
    prov = ckpt.provenance
    if prov is not None:
        old = ckpt.model_config.to_dict()
        prov.set("given", [k for k, v in cfg.to_dict().items() if old.get(k) != v])
    return Checkpoint(
        ckpt.path, cfg, pre, sd, names, ckpt.meta, format=ckpt.format, provenance=prov
    )


def _paper_preprocess(cfg: ViTConfig) -> PreprocessConfig:
    """The official code's input pipeline: pixels scaled to [-1, 1], bilinear resize."""
    return PreprocessConfig.for_model(cfg)


def _read_timm(
    p: Path,
    num_heads: int | None,
    grid: tuple[int, int] | None,
    named: dict[str, Any] | None,
    image_size: Any = None,
) -> Checkpoint:
    """A timm state dict or folder; ``named``: the config a bare file's ``arch=`` states."""
    if p.is_dir():
        sd = _weights_in(p)
    else:
        sd = _read_safetensors(p) if p.suffix == ".safetensors" else _torch_load(p)
    if timm_conv.is_timm_bit(sd):  # a BiT ResNet (resnetv2_*_bit)
        size: Any = 224
        if p.is_dir():
            size = (_read_json(p / CONFIG).get("pretrained_cfg") or {}).get("input_size", [3, 224])
            size = tuple(size[1:]) if len(size) == 3 else 224
        bit = timm_conv.timm_bit_config(sd, image_size=size, source=str(p))
        pre = (
            _wrap(lambda: timm_conv.timm_hub_preprocess(_read_json(p / CONFIG), bit), p)
            if p.is_dir()
            else PreprocessConfig.for_model(bit)
        )
        prov = Provenance().set("weights", bit.to_dict())
        prov.set("file" if p.is_dir() else "assumed", ["image_size", *_PRE], "the input")
        if not p.is_dir():
            prov.assume(PAPER_PREPROCESS)
        ckpt = Checkpoint(p, bit, pre, timm_conv.timm_bit_to_state_dict(sd, bit))
        ckpt.provenance = prov
        return ckpt
    hub = _read_json(p / CONFIG) if p.is_dir() else named
    if p.is_dir() and not isinstance(hub, dict):
        raise VitkitError(f"{p / CONFIG}: not a JSON object")
    if named is not None and not p.is_dir():
        reader = read_timm_eva, read_timm_vit
        return named_checkpoint(p, sd, named, num_heads, *reader, grid, image_size)
    arch = str((hub or {}).get("architecture", ""))
    if timm_relpos.relpos_family(sd) or relpos_module(arch):  # BEiT, timm's relpos ViTs
        return read_timm_relpos(p, sd, hub, num_heads, grid)
    if p.is_dir():
        assert hub is not None
        if arch.split(".")[0] in EVA_NAMES:  # RoPE: timm eva.py
            margs = hub.get("model_args")
            margs = margs if isinstance(margs, dict) else {}
            shapes = {k: tuple(v.shape) for k, v in sd.items()}
            name, src = arch.split(".")[0], str(p / CONFIG)
            check_name_against_weights(name, shapes, margs, src, None, num_heads is not None)
            return read_timm_eva(p, hub, sd, num_heads)
        return read_timm_vit(p, hub, sd, num_heads)
    if timm_eva_bare.bare_layout(sd):  # EVA-02 / EVA: keys that fix an eva.py family
        cfg, prov = _wrap(
            lambda: timm_eva_bare.bare_eva_config_provenance(sd, str(p), num_heads), p
        )
        timm_eva_bare.check_bare_eva_grid(p, sd, cfg, grid)
        ckpt = Checkpoint(
            p, cfg, PreprocessConfig.for_model(cfg), timm_eva.eva_to_state_dict(sd, cfg)
        )
        prov.set("assumed", ["image_size"], "the patch grid x the patch (a remainder unknown)")
        ckpt.provenance = prov.set("assumed", _PRE, "the paper's").assume(PAPER_PREPROCESS)
        return ckpt
    else:
        cfg, prov = timm_conv.timm_config_provenance(
            sd, num_heads=num_heads, grid=grid, source=str(p)
        )
        pre, names = PreprocessConfig.for_model(cfg), ()
        prov.set("assumed", ["image_size"], "the patch grid x the patch (a remainder unknown)")
        prov.set("assumed", _PRE, "the paper's").assume(PAPER_PREPROCESS)
    ckpt = Checkpoint(p, cfg, pre, timm_conv.timm_to_state_dict(sd, cfg), names)
    ckpt.provenance = prov
    return ckpt


def _read_hf(p: Path) -> Checkpoint:
    if p.is_file():
        raise VitkitError(f"{p}: Hugging Face weights need their folder (with {CONFIG})")
    hf = _read_json(p / CONFIG)
    if not isinstance(hf, dict):
        raise VitkitError(f"{p / CONFIG}: not a JSON object")
    if not hf_backbone.is_backbone(hf):
        return _read_hf_model(p, hf)
    # Dinov2Backbone, DINOv3ViTBackbone: their model class's weights; the features they return
    meta = hf_backbone.backbone_meta(hf, str(p / CONFIG))
    ckpt = _read_hf_model(p, hf_backbone.as_model_config(hf))
    return dataclasses.replace(ckpt, meta={**ckpt.meta, "backbone": meta})


def _read_hf_model(p: Path, hf: dict[str, Any]) -> Checkpoint:
    odd = [a for a in hf.get("architectures") or [] if a not in _HF_CLASSES]
    if odd:  # a class vitkit does not read is never read as the nearest one it does
        raise VitkitError(
            f"{p / CONFIG}: architectures {odd[0]!r} is not a Hugging Face class vitkit reads "
            "(its ViT, DeiT, Dinov2, ViTMAE, CLIP, SigLIP, SigLIP 2, DINOv3 ViT and BEiT classes)"
        )
    if hf_siglip.is_siglip(hf):  # SigLIP's image tower
        return _read_hf_with(p, hf, hf_siglip.siglip_to_vit_config, hf_siglip.siglip_to_state_dict)
    if hf_dinov3.is_dinov3(hf):  # DINOv3 (RoPE)
        dino = hf_dinov3.dinov3_to_vit_config, hf_dinov3.dinov3_to_state_dict, hf_dinov3.FIELDS
        return _read_hf_with(p, hf, *dino)
    if hf_beit.is_beit(hf):  # BEiT (relative position bias)
        return _read_hf_with(
            p, hf, hf_beit.beit_to_vit_config, hf_beit.beit_to_state_dict, hf_beit.FIELDS
        )
    if hf_siglip2.is_siglip2(hf):  # SigLIP 2 NaFlex
        conv = hf_siglip2.siglip2_to_vit_config, hf_siglip2.siglip2_to_state_dict
        pre = hf_siglip2.siglip2_preprocess, hf_siglip2.processor_assumption
        return _read_hf_with(p, hf, *conv, hf_siglip2.FIELDS, *pre)
    if hf_family.is_family(hf):  # DeiT, Dinov2, ViTMAE, CLIP
        weights = _weights_in(p)
        cfg = _wrap(lambda: hf_family.family_config(hf, weights), p / CONFIG)
        sd = _wrap(lambda: hf_family.family_to_state_dict(hf, weights, cfg), p)
    else:
        cfg = hf_conv.hf_to_vit_config(hf, str(p / CONFIG))
        cfg, sd = _wrap(lambda: hf_conv.hf_to_state_dict(_weights_in(p), cfg, hf), p)
    pp_file = p / "preprocessor_config.json"
    pp = _read_json(pp_file) if pp_file.is_file() else None
    pre = _wrap(lambda: hf_conv.hf_preprocess(pp, cfg), pp_file)
    prov = _hf_provenance(hf, cfg, pp is not None)
    if (a := no_resize_assumption(pp, cfg)) is not None:
        prov.assume(a)
    return Checkpoint(p, cfg, pre, sd, _hf_names(hf, cfg), provenance=prov)


def _hf_names(hf: dict[str, Any], cfg: ViTConfig) -> tuple[str, ...]:
    """The class names of ``id2label`` (none where they are transformers' LABEL_i)."""
    id2label = hf.get("id2label") or {}
    names: tuple[str, ...] = ()
    if cfg.num_classes and len(id2label) == cfg.num_classes:
        names = tuple(str(id2label.get(str(i), id2label.get(i, i))) for i in range(cfg.num_classes))
        if all(n == f"LABEL_{i}" for i, n in enumerate(names)):
            names = ()
    return names


_HF_CLASSES = frozenset(
    "ViTModel ViTForImageClassification DeiTModel DeiTForImageClassification "
    "DeiTForImageClassificationWithTeacher Dinov2Model Dinov2ForImageClassification "
    "Dinov2WithRegistersModel Dinov2WithRegistersForImageClassification ViTMAEModel "
    "ViTMAEForPreTraining CLIPModel CLIPVisionModel CLIPVisionModelWithProjection SiglipModel "
    "SiglipVisionModel".split()
) | frozenset((*hf_dinov3.CLASSES, *hf_siglip2.CLASSES, *hf_beit.CLASSES))


def _hf_provenance(
    hf: dict[str, Any], cfg: ViTConfig, has_pp: bool, fields: Mapping[str, str] | None = None
) -> Provenance:
    """A Hugging Face config's fields: in the file, or its class's default (the format's);
    the rest from the weights. ``fields``: config field -> the class's key (None: fixed by
    the class), where not ViT's."""
    prov = Provenance().set("weights", cfg.to_dict())
    inner = hf.get("vision_config")
    vision: dict[str, Any] = inner if isinstance(inner, dict) else hf
    for field, key in (fields or {**hf_conv.HF_FIELDS, **_HF_MORE}).items():
        prov.set("file" if key in vision else "format", [field])
    if has_pp:
        prov.set("file", _PRE, "preprocessor_config.json")
    else:
        prov.set("assumed", _PRE, "no preprocessor_config.json").assume(PAPER_PREPROCESS)
    return prov


_HF_MORE = {  # config fields beyond hf.HF_FIELDS that a Hugging Face config.json sets
    "image_size": "image_size",
    "patch_size": "patch_size",
    "layer_norm_eps": "layer_norm_eps",
    "gelu": "hidden_act",
    "qkv_bias": "qkv_bias",
}


def _read_hf_with(
    p: Path,
    hf: dict[str, Any],
    to_config: Any,
    to_state: Any,
    fields: Any = None,
    to_pre: Any = hf_conv.hf_preprocess,
    assume: Any = None,
) -> Checkpoint:
    """A Hugging Face folder whose class has its own converter module (SigLIP, DINOv3,
    SigLIP 2): ``to_config(hf, source)``, ``to_state(weights, cfg, source)``, ``fields`` for
    provenance, ``to_pre(preprocessor_config, cfg)``, ``assume(preprocessor_config, cfg)``:
    an :class:`Assumption` said when read, or None."""
    cfg = to_config(hf, str(p / CONFIG))
    sd = to_state(_weights_in(p), cfg, str(p))
    if isinstance(sd, tuple):  # (a converter whose weights complete the config: BEiT's head)
        cfg, sd = sd
    pp_file = p / "preprocessor_config.json"
    pp = _read_json(pp_file) if pp_file.is_file() else None
    pre = _wrap(lambda: to_pre(pp, cfg), pp_file)
    prov = _hf_provenance(hf, cfg, pp is not None, fields)
    for said in (assume, no_resize_assumption):
        if said is not None and (a := said(pp, cfg)) is not None:
            prov.assume(a)
    return Checkpoint(p, cfg, pre, sd, _hf_names(hf, cfg), provenance=prov)


def load_model(path: str | Path, **overrides: Any) -> tuple[nn.Module, Checkpoint]:
    """Rebuild the model of a checkpoint in any supported format; ``(model, checkpoint)``.

    Overrides: ``image_size``, ``num_classes``, ``pre_logits``, ``resample`` (see
    :func:`read_checkpoint`; they change the weights; ``head_init="timm"``: a new head drawn
    as timm's, not zero), ``format``, ``num_heads``, ``grid`` (reading hints), any config field
    that does not change the weights (``dropout=0.1``), and timm's keywords for them
    (``img_size``, ``drop_path_rate``, ...: :mod:`vitkit.registry.timm_keywords`).
    ``features_only=True`` (``out_indices``, ``output_fmt``, ``feature_norm``): timm's
    features-only model of it (:class:`vitkit.models.features.FeaturesModel`); ``backbone=True``
    (``out_indices`` / ``out_features`` in transformers' stages, ``apply_layernorm``,
    ``reshape_hidden_states``): transformers' backbone output
    (:class:`vitkit.models.hf_backbone.HFBackbone`). A transformers folder's model answers
    transformers' call (``pixel_values=``, ...) as the folder's class, ``model(x)`` as vitkit
    (:mod:`vitkit.models.hf_model`). The model is in eval mode.
    """
    from vitkit.models.features import features_model, pop_features_options
    from vitkit.models.hf_model import as_transformers
    from vitkit.models.vit import build_model

    backbone = hf_backbone.pop_backbone_options(overrides)  # transformers' backbone output
    options = pop_features_options(overrides)

    read_keys = (
        "format",
        "num_heads",
        "grid",
        "arch",
        "image_size",
        "num_classes",
        "pre_logits",
        "resample",
        "head_init",
    )
    overrides = from_timm(overrides)  # timm's keywords: vitkit's settings of the same meaning
    if "checkpoint_path" in overrides:
        raise VitkitError(
            "checkpoint_path / pretrained_cfg_overlay's file: load's path is the "
            "weights (create_model takes them)"
        )
    read_kw = {k: overrides.pop(k) for k in read_keys if k in overrides}
    ckpt = read_checkpoint(path, **read_kw, overrides=overrides)
    model = build_model(ckpt.model_config)
    source = str(ckpt.path / WEIGHTS if ckpt.format == "vitkit" else ckpt.path)
    load_state_dict_strict(model, ckpt.state_dict, source=source)
    if hasattr(model, "preprocess_config"):  # timm's pretrained_cfg reads it
        cast(Any, model).preprocess_config = ckpt.preprocess
    timm_pretrained_cfg(model, ckpt)  # (its architecture and types, as timm's)
    if backbone is not None:
        model = hf_backbone.backbone_model(model, ckpt.meta, backbone)
    elif options is not None:
        hf_backbone.features_options(ckpt.meta, options, str(ckpt.path))
        model = features_model(model, options)
    elif ckpt.format == "hf":  # transformers' call answered as the folder's class
        hf = _read_json(Path(ckpt.path) / CONFIG)
        _, settings = hf_backbone.backbone_settings(ckpt.meta, ckpt.model_config)
        model = as_transformers(model, hf if isinstance(hf, dict) else {}, settings)
    return model.eval(), ckpt


def load(path: str | Path, **overrides: Any) -> nn.Module:
    """``vitkit.load("ViT-B_16.npz", image_size=384, num_classes=10)``: the model, eval mode
    (``features_only=True``: timm's features-only model; ``backbone=True``: transformers'
    backbone; see :func:`load_model`)."""
    return load_model(path, **overrides)[0]
