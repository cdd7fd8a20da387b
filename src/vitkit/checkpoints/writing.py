"""Writing a :class:`Checkpoint` in any format (``vitkit convert``'s second half).

Directories and files are written to a temporary name and renamed into place; nothing is
deleted that the write did not create (see :func:`write_checkpoint`).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor

from vitkit.checkpoints.google import npz as npz_conv
from vitkit.checkpoints.hf import backbone as hf_backbone
from vitkit.checkpoints.hf import beit as hf_beit
from vitkit.checkpoints.hf import dinov3 as hf_dinov3
from vitkit.checkpoints.hf import siglip as hf_siglip
from vitkit.checkpoints.hf import siglip2 as hf_siglip2
from vitkit.checkpoints.hf import vit_family as hf_family
from vitkit.checkpoints.hf import vit_model as hf_conv
from vitkit.checkpoints.native.safetensors_io import (
    CONFIG,
    Checkpoint,
    _write_json,
    check_weights_fit,
    json_bytes,
    load_state_dict_strict,
    replace_dir,
    save_checkpoint,
    tensor_bytes,
)
from vitkit.checkpoints.provenance import TRAVELS
from vitkit.checkpoints.timm import beit_relpos as timm_relpos
from vitkit.checkpoints.timm import eva as timm_eva
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.output_files import (
    check_destination,
    disk_bytes,
    fsync_dir,
    publish,
    set_file_mode,
    writing,
)
from vitkit.registry.config_checks import eva_only_switches
from vitkit.registry.model_config import ResNetConfig, ViTConfig

Format = Literal["vitkit", "npz", "timm", "hf"]
FORMATS: tuple[str, ...] = ("vitkit", "npz", "timm", "hf")


def write_checkpoint(
    ckpt: Checkpoint,
    dst: str | Path,
    to: Format,
    *,
    hf_naming: hf_conv.HfNaming = "4",
    source: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``ckpt`` to ``dst`` in format ``to``. Directories and files are written to a
    temporary name and renamed into place, so an interrupted write never leaves half a file.

    Nothing is deleted that this call did not write (``vitkit.output_files.check_destination``): a
    destination that is (or lies inside) the checkpoint read (``ckpt.path``; for a run's
    checkpoint the run's ``checkpoints/``) is refused, ``overwrite`` or not; an existing file
    or a non-empty directory is refused unless ``overwrite``; then only the files written here
    are replaced and whatever else a directory holds stays. ``source``: the path the user
    named (kept for callers; ``ckpt.path`` is what was read)."""
    from vitkit.models.vit import build_model

    dst = Path(dst)
    check_destination(dst, reads=[ckpt.path], overwrite=overwrite)
    if dst.resolve() in Path(ckpt.path).resolve().parents:  # convert RUN RUN: a run would
        raise VitkitError(  # then read as a checkpoint, its own checkpoints/ hidden
            f"{dst}: holds {ckpt.path}, the checkpoint read; a checkpoint is never written "
            "into a directory that holds the one read (--overwrite or not): choose another"
        )
    dst.parent.mkdir(parents=True, exist_ok=True)  # as every writer: missing parents are made
    cfg, sd = ckpt.model_config, ckpt.state_dict
    check_weights_fit(cfg, sd, config_source=str(ckpt.path), source=str(ckpt.path))
    if to == "vitkit":
        model = build_model(cfg)
        load_state_dict_strict(model, sd, source=str(ckpt.path))
        if dst.exists() and not dst.is_dir():
            raise VitkitError(f"{dst}: exists and is not a directory")
        tmp = dst.with_name(f".{dst.name}.convert-{os.getpid()}")
        meta = dict(ckpt.meta)
        if ckpt.provenance is not None:  # what was given or assumed stays so (not "the file")
            kept = {f: s for f, s in ckpt.provenance.sources.items() if s in TRAVELS}
            meta["provenance"] = {**meta.get("provenance", {}), **kept}
        with writing(dst, tmp):  # (no room: said for dst, not for the temporary name)
            save_checkpoint(
                tmp, model, preprocess=ckpt.preprocess, class_names=ckpt.class_names, meta=meta
            )
            return _install_dir(tmp, dst)
    if isinstance(cfg, ResNetConfig):
        raise VitkitError(
            f"{ckpt.path}: {cfg.short_name} is a BiT ResNet; vitkit writes ResNets only in its "
            "own format (the npz, timm and Hugging Face converters are for ViTs)"
        )
    if to == "npz":
        arrays = npz_conv.state_dict_to_npz(sd, cfg)  # refuses what the naming cannot hold
        if cfg.layer_norm_eps != 1e-6 or cfg.gelu != "tanh" or cfg.resnet_eps != "vit_jax":
            eps = ", timm's ResNet epsilons" if cfg.is_hybrid and cfg.resnet_eps == "timm" else ""
            warnings.warn(
                f".npz files carry no settings: readers assume the official LayerNorm epsilon "
                f"1e-6 and tanh GELU, but this model uses {cfg.layer_norm_eps:g} and "
                f"{'tanh' if cfg.gelu == 'tanh' else 'exact'} GELU{eps}; outputs will differ "
                "slightly",
                stacklevel=2,
            )
        if dst.suffix != ".npz":
            raise VitkitError(f"{dst}: an npz checkpoint needs a .npz file name")
        tmp = dst.with_name(f".{dst.name}.tmp.npz")
        need = disk_bytes(sum(a.nbytes + len(k) + 200 for k, a in arrays.items()))
        with writing(dst, tmp, need=need):
            np.savez(tmp, **arrays)  # type: ignore[arg-type]  # (stub: **arrays vs allow_pickle)
            return publish(tmp, dst)
    eva = cfg.rope != "none" or not cfg.abs_pos_embed or not cfg.k_bias or _eva_only(cfg)
    if to == "timm" and eva and not timm_relpos.writes_relpos(cfg):
        # rotary embeddings: timm eva.py's Eva (refused without rope)
        tsd = timm_eva.state_dict_to_eva(sd, cfg)
        if dst.suffix in (".safetensors", ".pth", ".bin"):
            raise VitkitError(
                "a bare timm state dict does not say its rotary embedding; write a timm folder"
            )
        hub = timm_eva.eva_hub_config(cfg, ckpt.preprocess, ckpt.class_names)
        return _write_dir(dst, {CONFIG: hub}, tsd)
    if to == "timm":
        relpos = timm_relpos.writes_relpos(cfg)  # BEiT / timm's relpos ViTs
        tsd = (timm_relpos.state_dict_to_relpos if relpos else timm_conv.state_dict_to_timm)(
            sd, cfg
        )
        if dst.suffix in (".safetensors", ".pth", ".bin"):
            timm_conv.warn_hybrid_eps(cfg)
            tmp = dst.with_name(f".{dst.name}.tmp{dst.suffix}")
            with writing(dst, tmp, need=tensor_bytes(tsd)):
                if dst.suffix == ".safetensors":
                    save_file(tsd, str(tmp))
                else:
                    _torch_save(tsd, tmp)
                return publish(tmp, dst)
        hub = (timm_relpos.relpos_hub_config if relpos else timm_conv.timm_hub_config)(
            cfg, ckpt.preprocess, ckpt.class_names
        )
        return _write_dir(dst, {CONFIG: hub}, tsd)
    if to == "hf" and "backbone" in ckpt.meta:  # Dinov2Backbone, DINOv3ViTBackbone
        return _write_dir(dst, *hf_backbone.backbone_files(ckpt))
    if to == "hf" and hf_dinov3.writes_dinov3(cfg):  # DINOv3's RoPE: DINOv3ViTModel
        dino = {
            CONFIG: hf_dinov3.vit_to_dinov3_config(cfg),
            "preprocessor_config.json": hf_conv.vit_to_hf_preprocess(ckpt.preprocess),
        }
        return _write_dir(dst, dino, hf_dinov3.state_dict_to_dinov3(sd, cfg))
    if to == "hf" and cfg.naflex:  # SigLIP 2 NaFlex: Siglip2VisionModel
        nsd = hf_siglip2.state_dict_to_siglip2(sd, cfg)  # (first: it refuses what it cannot hold)
        nax = {
            CONFIG: hf_siglip2.vit_to_siglip2_config(cfg),
            "preprocessor_config.json": hf_siglip2.vit_to_siglip2_preprocess(ckpt.preprocess, cfg),
        }
        return _write_dir(dst, nax, nsd)
    if to == "hf" and hf_beit.writes_beit(cfg):  # BEiT: BeitModel / ...ForImageClassification
        arch, bsd = hf_beit.state_dict_to_beit(sd, cfg)
        hub = hf_beit.vit_to_beit_config(cfg, arch)
        hub.update(hf_conv.hf_labels(cfg.num_classes, ckpt.class_names))
        beit = {
            CONFIG: hub,
            "preprocessor_config.json": hf_conv.vit_to_hf_preprocess(ckpt.preprocess),
        }
        return _write_dir(dst, beit, bsd)
    if to == "hf" and hf_siglip.writes_siglip(cfg):  # the MAP head: SiglipVisionModel
        siglip = hf_siglip.state_dict_to_siglip(sd, cfg)
        tower = {
            CONFIG: hf_siglip.vit_to_siglip_config(cfg),
            "preprocessor_config.json": hf_siglip.vit_to_siglip_preprocess(ckpt.preprocess),
        }
        return _write_dir(dst, tower, siglip)
    if to == "hf":
        # DeiT, Dinov2, CLIP (always the 4.x naming); every class writes its GELU (hidden_act)
        if set(cfg.family_switches) - {"gelu"}:
            arch, hub, hsd = hf_family.state_dict_to_family(sd, cfg)
            if not arch.startswith("CLIP"):  # (CLIP's "head" is its projection)
                hub.update(hf_conv.hf_labels(cfg.num_classes, ckpt.class_names))
        else:
            arch, hsd = hf_conv.state_dict_to_hf(sd, cfg, hf_naming)
            hub = hf_conv.vit_to_hf_config(cfg, arch, ckpt.class_names)
        files: dict[str, Any] = {
            CONFIG: hub,
            "preprocessor_config.json": hf_conv.vit_to_hf_preprocess(ckpt.preprocess),
        }
        return _write_dir(dst, files, hsd)
    raise VitkitError(f"unknown format {to!r} (choose from {', '.join(FORMATS)})")


def _torch_save(obj: dict[str, Tensor], path: Path) -> None:
    """torch.save through a file Python writes: a full disk is then Python's OSError (ENOSPC),
    not the zip writer's "file write failed"."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()


def _install_dir(tmp: Path, dst: Path) -> Path:
    """Move the finished directory ``tmp`` to ``dst``; into an existing directory file by file
    (each an atomic rename), so that whatever else it holds stays."""
    if not dst.exists():
        return replace_dir(tmp, dst)
    if not dst.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        raise VitkitError(f"{dst}: exists and is not a directory")
    for f in sorted(tmp.iterdir()):
        os.replace(f, dst / f.name)
    tmp.rmdir()
    fsync_dir(dst)
    return dst


def _write_dir(dst: Path, jsons: dict[str, Any], weights: dict[str, Tensor]) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and not dst.is_dir():
        raise VitkitError(f"{dst}: exists and is not a directory")
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    need = tensor_bytes(weights) + sum(json_bytes(obj) for obj in jsons.values())
    with writing(dst, tmp, need=need):
        tmp.mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        set_file_mode(tmp / "model.safetensors")  # (safetensors creates 0600)
        for name, obj in jsons.items():
            _write_json(tmp / name, obj)
        return _install_dir(tmp, dst)


def _eva_only(cfg: ViTConfig) -> bool:
    """Switches only timm's Eva holds: grouped-query attention, attention-only layer scale,
    Perception Encoder's MAP head (its heads, MLP width, the prefix tokens attended)."""
    return bool(eva_only_switches(cfg))
