"""Reading a timm folder (or a bare file with ``arch=``) once its layout family is known: the
config and its provenance, timm's preprocessing from ``pretrained_cfg``, the label names, and the
state dict in vitkit's names (:mod:`vitkit.checkpoints.formats` decides which reader applies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from vitkit.checkpoints.native.safetensors_io import CONFIG, Checkpoint
from vitkit.checkpoints.provenance import PAPER_PREPROCESS
from vitkit.checkpoints.timm import beit_relpos as timm_relpos
from vitkit.checkpoints.timm import eva as timm_eva
from vitkit.checkpoints.timm import hub_folder as timm_hub
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig

# preprocessing fields a caller may state when loading (-o mean=...); not the model's size
PRE = ("mean", "std", "interpolation", "crop_pct")  # the ones provenance lists


def wrap(fn: Any, p: Path) -> Any:
    """``fn()``, a malformed field of a file's config said in one line naming ``p``."""
    try:
        return fn()
    except (VitkitError, TypeError, ValueError) as e:  # a malformed field of a file's config
        said = str(e)  # (a converter's message that names the file already is kept as it is)
        raise VitkitError(said if said.startswith(f"{p}: ") else f"{p}: {said}") from None


def read_timm_vit(
    p: Path, hub: dict[str, Any], sd: dict[str, Tensor], num_heads: int | None
) -> Checkpoint:
    """A timm folder naming a VisionTransformer entry (or a bare file with ``arch=``)."""
    cfg, prov = wrap(lambda: timm_hub.timm_hub_config_provenance(hub, sd, str(p), num_heads), p)
    src = str(p / CONFIG if p.is_dir() else p)
    pre = wrap(lambda: timm_conv.timm_hub_preprocess(hub, cfg, src), p)
    prov.set("file", PRE, "pretrained_cfg (timm's defaults where it is silent)")
    names = timm_hub.hub_label_names(hub, cfg, Path(src))
    ckpt = Checkpoint(p, cfg, pre, timm_conv.timm_to_state_dict(sd, cfg), names)
    ckpt.provenance = prov
    return ckpt


def read_timm_eva(
    p: Path, hub: dict[str, Any], sd: dict[str, Tensor], num_heads: int | None
) -> Checkpoint:
    """A timm folder naming an eva.py entry vitkit reads (:mod:`vitkit.checkpoints.timm.eva`)."""
    cfg, prov = wrap(lambda: timm_eva.eva_hub_config_provenance(hub, sd, str(p), num_heads), p)
    pre = wrap(lambda: timm_conv.timm_hub_preprocess(hub, cfg, str(p / CONFIG)), p)
    prov.set("file", PRE, "pretrained_cfg (timm's defaults where it is silent)")
    names = timm_hub.hub_label_names(hub, cfg, p / CONFIG)
    ckpt = Checkpoint(p, cfg, pre, timm_eva.eva_to_state_dict(sd, cfg), names)
    ckpt.provenance = prov
    return ckpt


def read_timm_relpos(
    p: Path,
    sd: dict[str, Tensor],
    hub: dict[str, Any] | None,
    num_heads: int | None,
    grid: tuple[int, int] | None,
) -> Checkpoint:
    """A BEiT / timm relpos state dict or folder (checkpoints/timm/beit_relpos.py)."""
    cfg, prov = wrap(
        lambda: timm_relpos.relpos_config_provenance(sd, hub, str(p), num_heads, grid), p
    )
    if hub is not None:
        pre = wrap(lambda: timm_conv.timm_hub_preprocess(hub, cfg, str(p / CONFIG)), p)
        prov.set("file", PRE, "pretrained_cfg (timm's defaults where it is silent)")
        names = timm_hub.hub_label_names(hub, cfg, p / CONFIG)
    else:
        pre, names = PreprocessConfig.for_model(cfg), ()
        prov.set("assumed", PRE, "the paper's").assume(PAPER_PREPROCESS)
    state = wrap(lambda: timm_relpos.relpos_to_state_dict(sd, cfg, str(p)), p)
    ckpt = Checkpoint(p, cfg, pre, state, names)
    ckpt.provenance = prov
    return ckpt


def timm_pretrained_cfg(model: Any, ckpt: Any) -> None:
    """What ``model.pretrained_cfg`` says as timm's does for a checkpoint read as a timm entry:
    the entry's name, and a folder's JSON lists (a registered name's defaults are tuples)."""
    if ckpt.format != "timm" or not hasattr(model, "timm_architecture"):
        return
    folder = Path(ckpt.path).is_dir()
    name = ckpt.meta.get("timm_arch")
    if folder:
        try:
            name = json.loads((Path(ckpt.path) / "config.json").read_text()).get("architecture")
        except (OSError, ValueError, AttributeError):  # (read already by the format's reader)
            name = None
    model.timm_architecture = None if name is None else str(name).split(".")[0]
    model.timm_folder = folder
