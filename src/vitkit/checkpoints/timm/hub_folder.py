"""A timm model folder (``config.json`` naming the ``architecture``, + weights) -> ViTConfig.

The architecture must be one vitkit computes exactly (:mod:`vitkit.checkpoints.timm.names`); what
its name fixes (timm's entry: CLIP's eps and GELU, SigLIP 2's tanh GELU, layer scale, heads outside
the paper's table, the post-norm block) and the folder's ``model_args`` complete what the
weights show. Every ``model_args`` key is one timm's ``VisionTransformer`` takes: those that
change the numbers are read (or refused where vitkit cannot compute them), those that only
matter for training are ignored, and an unknown key is refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from vitkit.checkpoints.arch import check_name_against_weights, entry_fc_norm
from vitkit.checkpoints.provenance import Provenance
from vitkit.checkpoints.timm import switches as later
from vitkit.checkpoints.timm.naflexvit import naflex_hub_config_provenance
from vitkit.checkpoints.timm.names import NAFLEX_NAMES, check_architecture, relpos_module
from vitkit.checkpoints.timm.vision_transformer import (
    _BACKBONE,
    _NAME_REFUSED,
    _TIMM_ACT,
    _name_settings,
    timm_config_provenance,
)
from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig

# model_args keys and the config fields they set (read below, or shown by the weights)
_ARG_FIELDS: dict[str, tuple[str, ...]] = {
    "img_size": ("image_size",),
    "num_heads": ("num_heads",),
    "act_layer": ("gelu",),
    "layer_norm_eps": ("layer_norm_eps",),
    "norm_layer": ("layer_norm_eps", "norm"),
    "global_pool": ("pool", "class_token"),
    "init_values": ("layer_scale_init",),
    "block_fn": ("block",),
    "pool_include_prefix": ("pool",),
    # shown by the weights too (a disagreement fails the strict load)
    "patch_size": ("patch_size",),
    "in_chans": ("in_chans",),
    "num_classes": ("num_classes",),
    "embed_dim": ("width",),
    "depth": ("depth",),
    "mlp_ratio": ("mlp_dim",),
    "qkv_bias": ("qkv_bias",),
    "qk_norm": ("qk_norm",),
    "proj_bias": ("proj_bias",),
    "scale_attn_norm": ("scale_attn_norm",),
    "scale_mlp_norm": ("scale_mlp_norm",),
    "class_token": ("class_token",),
    "no_embed_class": ("pos_embed_prefix",),
    "reg_tokens": ("num_reg_tokens",),
    "pre_norm": ("norm_pre",),
    "final_norm": ("final_norm",),
    "fc_norm": ("fc_norm",),
    "embed_norm_layer": ("patch_norm",),
    "attn_layer": ("diff_attn",),
    "mlp_layer": ("mlp",),
}
# training-only arguments: no effect on a loaded model's outputs
_TRAINING_ARGS = frozenset(
    "drop_rate pos_drop_rate patch_drop_rate proj_drop_rate attn_drop_rate drop_path_rate "
    "weight_init fix_init dynamic_img_size device dtype".split()
)


def check_model_args(args: dict[str, Any], cfg: ViTConfig, source: str) -> None:
    """Refuse ``model_args`` keys vitkit does not know or values it cannot compute."""
    unknown = sorted(k for k in args if k not in _ARG_FIELDS and k not in _TRAINING_ARGS)
    unknown = [k for k in unknown if k not in ("pos_embed", "dynamic_img_pad", "embed_layer")]
    if unknown:
        raise VitkitError(
            f"{source}: model_args {', '.join(unknown)}: not arguments of timm's "
            "VisionTransformer vitkit knows; vitkit will not guess what they change"
        )
    if args.get("pos_embed", "learn") != "learn":
        raise VitkitError(f"{source}: pos_embed={args['pos_embed']!r}; vitkit reads 'learn'")
    if args.get("dynamic_img_pad"):
        raise VitkitError(f"{source}: dynamic_img_pad=True (padding to the patch) is not supported")
    if args.get("embed_layer") is not None:
        raise VitkitError(f"{source}: embed_layer={args['embed_layer']!r} is not supported")
    attn = args.get("attn_layer")
    if attn is not None and not (attn == "diff" and cfg.diff_attn):
        raise VitkitError(f"{source}: attn_layer={attn!r} is not one vitkit has here")
    mlp = args.get("mlp_layer")
    if mlp is not None and not (cfg.mlp == "swiglu" and "swiglu" in str(mlp).lower()):
        raise VitkitError(f"{source}: mlp_layer={mlp!r} is not one vitkit has here")


def timm_hub_to_config(
    hub: dict[str, Any], sd: dict[str, Tensor], source: str, num_heads: int | None = None
) -> ViTConfig:
    """The architecture of a timm model folder (see :func:`timm_hub_config_provenance`)."""
    return timm_hub_config_provenance(hub, sd, source, num_heads)[0]


def timm_hub_config_provenance(
    hub: dict[str, Any], sd: dict[str, Tensor], source: str, num_heads: int | None = None
) -> tuple[ViTConfig, Provenance]:
    """Architecture of a timm model folder: its ``model_args`` where given, then what its
    ``architecture`` name fixes, else the weights (``num_heads`` where no table size); and
    where each field came from."""
    arch = check_architecture(str(hub.get("architecture", "")), source)
    if relpos_module(arch):  # (formats reads these through timm_relpos)
        raise VitkitError(f"{source}: {arch} is read by vitkit.checkpoints.timm.beit_relpos")
    if arch in NAFLEX_NAMES:  # timm's NaFlexVit (vitkit.models.naflex_packing)
        return naflex_hub_config_provenance(hub, sd, source, num_heads)
    for pattern, what in _NAME_REFUSED.items():
        if pattern in arch:
            raise VitkitError(f"{source}: {arch} has {what}; vitkit's blocks are the paper's")
    model_args = hub.get("model_args") or {}
    if not isinstance(model_args, dict):
        raise VitkitError(f"{source}: model_args is not a JSON object")
    named = _name_settings(arch)
    args = {**named, **model_args}
    grid = None  # the input size, where given, says which E_pos rows are the patch grid
    size, proj = args.get("img_size"), sd.get("patch_embed.proj.weight")
    if size is not None and proj is not None and not any(k.startswith(_BACKBONE) for k in sd):
        h, w = (size, size) if isinstance(size, int) else size
        grid = (int(h) // proj.shape[2], int(w) // proj.shape[3])
    heads = args.get("num_heads", num_heads)
    cfg, prov = timm_config_provenance(sd, num_heads=heads, grid=grid, source=source, bare=False)
    check_model_args(model_args, cfg, source)
    act = args.get("act_layer", "gelu")
    if act == "silu" and cfg.mlp == "swiglu":  # AIMv2: SwiGLU's own SiLU, no GELU
        act = "gelu"
    gelus = {v: k for k, v in _TIMM_ACT.items()}
    if act not in gelus:
        raise VitkitError(f"{source}: activation {act!r} is not a GELU vitkit has")
    changes: dict[str, Any] = {"gelu": gelus[act]}
    if "layer_norm_eps" in args:
        changes["layer_norm_eps"] = args["layer_norm_eps"]
    global_pool = args.get("global_pool", hub.get("global_pool"))
    pools: dict[Any, str] = {p: p for p in ("token", "avgmax", "max", "map")}
    pool = {**pools, "avg": "gap", "": "none", None: cfg.pool}.get(global_pool)
    if pool is None:
        raise VitkitError(f"{source}: global_pool {global_pool!r} is not one vitkit has")
    if (pool == "map") != (cfg.pool == "map"):
        what = "have" if cfg.pool == "map" else "have no"
        raise VitkitError(
            f"{source}: global_pool {global_pool!r}, but the weights {what} a MAP head"
        )
    if args.get("pool_include_prefix"):
        raise VitkitError(f"{source}: pool_include_prefix=True (pooling the prefix tokens too)")
    if pool == "token" and not cfg.has_class_token:
        raise VitkitError(f"{source}: global_pool 'token' without a class token")
    shapes = {k: tuple(v.shape) for k, v in sd.items()}  # (after the refusals above)
    pooled = {**args, "global_pool": global_pool}
    if "fc_norm" not in pooled:  # an entry that sets fc_norm itself keeps it under any pool
        pooled.update(entry_fc_norm(arch, named.get("global_pool")))
    check_name_against_weights(arch, shapes, model_args, source, pooled, num_heads is not None)
    if pool != cfg.pool:  # a class token that is not what the head reads, or fc_norm on it
        has = cfg.has_class_token
        changes.update(pool=pool, class_token=None if has == (pool == "token") else has)
    if cfg.layer_scale_init is not None and args.get("init_values"):
        changes["layer_scale_init"] = float(args["init_values"])
    if "img_size" in args:
        changes["image_size"] = args["img_size"]
    changes.update(later.later_hub_changes(args))  # the post-norm block, eps of a named norm
    # Provenance: the entry's own values (timm's defaults for what the name does not set),
    # then the name's table, then the folder's model_args.
    note = f"timm's {arch}"
    prov.set("name", ["gelu", "layer_norm_eps", "block", "pool"], note)
    if heads is None or "num_heads" in named:
        prov.set("name", ["num_heads"], note)
    for sources, keys in (("name", named), ("file", model_args)):
        for k in keys:
            prov.set(sources, _ARG_FIELDS.get(k, ()), note if sources == "name" else "model_args")
    if num_heads is not None and "num_heads" not in args:
        prov.set("given", ["num_heads"])
    prov.assumptions = []  # a registered entry fixes every setting
    return cfg.replace(**changes), prov


def hub_label_names(hub: dict[str, Any], cfg: ViTConfig, config: Path) -> tuple[str, ...]:
    """A timm folder's ``label_names``: one per output of the head, or refused (a shorter list
    would leave outputs without a label; a longer one names classes the head does not have)."""
    raw = hub.get("label_names") or ()
    if not isinstance(raw, list | tuple):
        raise VitkitError(f"{config}: label_names is not a list")
    names = tuple(str(n) for n in raw)
    if names and len(names) != cfg.num_classes:
        raise VitkitError(
            f"{config}: {len(names)} label_names for a head of {cfg.num_classes} outputs; "
            "give one name per output (or remove label_names: outputs are then labelled by index)"
        )
    return names
