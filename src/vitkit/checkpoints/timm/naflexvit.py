"""timm's ``NaFlexVit`` (``naflexvit.py``) <-> vitkit: explicit, pure functions, both ways.

A timm NaFlexVit is vitkit's ViT with ``naflex=True`` (:mod:`vitkit.models.naflex_packing`); the
blocks, norms, MAP head and head have timm's ViT names. The embedding differs:

- ``embeds.proj`` is a ``Linear(P*P*C, D)`` over patches flattened (row, column, channel):
  vitkit's ``patch_embed.proj`` convolution kernel [D, C, P, P] is the same matrix, permuted;
- ``embeds.pos_embed`` [1, h, w, D] is vitkit's ``pos_embed`` [1, h w, D] (row-major);
  a factorised ``embeds.pos_embed_y`` [1, h, D] and ``pos_embed_x`` [1, w, D] are its
  [1, h + w, D], rows first;
- ``embeds.cls_token`` / ``reg_token`` / ``norm`` are ``cls_token`` / ``reg_token`` /
  ``patch_embed.norm``.

What the weights do not show (how E_pos is resampled, the GELU, the heads, the pooling) is
fixed by the architecture's name (:data:`ENTRIES`, timm 1.0.31's 14 entries) and the folder's
``model_args``; a ``model_args`` setting vitkit does not compute (RoPE, grid-sample resampling,
a conv embedding, EVA blocks, ...) is refused by name. A bare naflexvit state dict is refused
(:func:`refuse_bare`): its resampling and GELU are the name's, not the weights'.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from vitkit.checkpoints.provenance import Provenance
from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig

# timm's NaFlexVitCfg defaults that vitkit reads (the rest must keep the value in _FIXED)
_DEFAULTS: dict[str, Any] = {
    "patch_size": 16,
    "num_heads": 12,
    "qkv_bias": True,
    "qk_norm": False,
    "proj_bias": True,
    "init_values": None,
    "class_token": False,
    "reg_tokens": 0,
    "pos_embed": "learned",
    "pos_embed_grid_size": (16, 16),
    "pos_embed_interp_mode": "bicubic",
    "pos_embed_ar_preserving": False,
    "pos_embed_antialias": True,
    "pos_embed_align_corners": False,
    "pre_norm": False,
    "final_norm": True,
    "fc_norm": None,
    "global_pool": "map",
    "act_layer": None,
}
_RADIO = {
    "class_token": True,
    "global_pool": "token",
    "final_norm": False,
    "pos_embed_grid_size": (128, 128),
    "pos_embed_interp_mode": "bilinear",
    "pos_embed_ar_preserving": True,
    "pos_embed_antialias": False,
}
_B = {"num_heads": 12}
_LS = {"init_values": 1e-5}
_GAP = {"global_pool": "avg", "fc_norm": True}
_SO150 = {"num_heads": 13, "qkv_bias": False, "reg_tokens": 1, **_LS}
_SIGLIP = {"act_layer": "gelu_tanh", "global_pool": "map", "pos_embed_interp_mode": "bilinear"}
# timm 1.0.31's registered naflexvit entries: what each sets beyond the defaults
ENTRIES: dict[str, dict[str, Any]] = {
    "naflexvit_base_patch16_gap": {**_B, **_LS, **_GAP, "reg_tokens": 4},
    "naflexvit_base_patch16_par_gap": {
        **_B,
        **_LS,
        **_GAP,
        "reg_tokens": 4,
        "pos_embed_ar_preserving": True,
    },
    "naflexvit_base_patch16_parfac_gap": {
        **_B,
        **_LS,
        **_GAP,
        "reg_tokens": 4,
        "pos_embed_ar_preserving": True,
        "pos_embed": "factorized",
    },
    "naflexvit_base_patch16_map": {**_B, **_LS, "global_pool": "map", "reg_tokens": 1},
    "naflexvit_so150m2_patch16_reg1_gap": {**_SO150, **_GAP},
    "naflexvit_so150m2_patch16_reg1_map": {**_SO150, "global_pool": "map"},
    "naflexvit_base_patch16_siglip": {**_B, **_SIGLIP},
    "naflexvit_so400m_patch16_siglip": {"num_heads": 16, **_SIGLIP},
    "naflexvit_base_patch16_radio_v3": {
        **_RADIO,
        **_B,
        **_LS,
        "reg_tokens": 7,
        "pos_embed_align_corners": True,
    },
    "naflexvit_large_patch16_radio_v3": {**_RADIO, "num_heads": 16, **_LS, "reg_tokens": 7},
    "naflexvit_huge_patch16_radio_v3": {
        **_RADIO,
        "num_heads": 16,
        "reg_tokens": 7,
        "pos_embed_align_corners": True,
    },
    "naflexvit_giant_patch16_radio_v3": {**_RADIO, "num_heads": 24, "reg_tokens": 7},
    "naflexvit_so400m_patch16_radio_v4": {**_RADIO, "num_heads": 16, "reg_tokens": 9},
    "naflexvit_huge_patch16_radio_v4": {**_RADIO, "num_heads": 16, "reg_tokens": 9},
}
# model_args vitkit computes only at this value (NaFlexVitCfg's default)
_FIXED: dict[str, Any] = {
    "pos_embed_use_grid_sample": False,
    "rope_type": "",
    "attn_type": "standard",
    "embed_proj_type": "linear",
    "dynamic_img_pad": False,
    "input_norm_layer": None,
    "embed_norm_layer": None,
    "norm_layer": None,
    "block_fn": None,
    "mlp_layer": None,
    "attn_layer": None,
    "swiglu_mlp": False,
    "num_kv_heads": None,
    "attn_gated": False,
    "attn_only_layer_scale": False,
    "pool_include_prefix": False,
    "patchify_channels_last": True,
    "enable_patch_interpolator": False,
    "scale_mlp_norm": False,
    "scale_attn_inner_norm": False,
    "attn_pool_num_heads": None,
    "attn_pool_mlp_ratio": None,
    "qkv_fused": True,
}
# shapes the weights show; training-only settings; what the input size alone is
_SHOWN = {"embed_dim", "depth", "mlp_ratio", "num_classes", "in_chans"}
_TRAINING = set(
    "drop_rate pos_drop_rate patch_drop_rate proj_drop_rate attn_drop_rate drop_path_rate "
    "weight_init fix_init use_key_only_attn_mask img_size device dtype".split()
)
_GELU = {None: "none", "gelu": "none", "gelu_tanh": "tanh", "quick_gelu": "quick"}
_POOL = {"avg": "gap", "token": "token", "map": "map", "avgmax": "avgmax", "max": "max", "": "none"}


def is_naflex_state_dict(sd: dict[str, Tensor]) -> bool:
    return any(k.startswith("embeds.") for k in sd)


def refuse_bare(source: str) -> None:
    """A naflexvit state dict without its folder: how E_pos is resampled (bicubic or bilinear,
    aspect-preserving, antialias, align corners) and the GELU are the name's, not the weights'."""
    raise VitkitError(
        f"{source}: timm naflexvit weights (embeds.*) alone do not say how their position "
        "embeddings are resampled (bicubic or bilinear, aspect-preserving, antialias, align "
        "corners) nor the GELU; read the timm folder (config.json naming the architecture)"
    )


def _check_args(args: dict[str, Any], source: str) -> None:
    known = set(_DEFAULTS) | set(_FIXED) | _SHOWN | _TRAINING
    unknown = sorted(set(args) - known)
    if unknown:
        raise VitkitError(
            f"{source}: model_args {', '.join(unknown)}: not NaFlexVit arguments vitkit knows; "
            "vitkit will not guess what they change"
        )
    for key, value in _FIXED.items():
        given = args.get(key, value)
        if given != value and not (key == "rope_type" and given == "none"):
            raise VitkitError(f"{source}: NaFlexVit {key}={given!r} is not supported")
    if args.get("norm_layer") not in (None, "layernorm"):
        raise VitkitError(f"{source}: NaFlexVit norm_layer={args['norm_layer']!r} is not supported")
    if args.get("pos_embed") not in ("learned", "factorized"):
        raise VitkitError(f"{source}: NaFlexVit pos_embed={args.get('pos_embed')!r} is not read")
    if args.get("act_layer") not in _GELU:
        raise VitkitError(f"{source}: activation {args['act_layer']!r} is not a GELU vitkit has")
    if args.get("global_pool") not in _POOL:
        raise VitkitError(f"{source}: global_pool {args.get('global_pool')!r} is not read")


def naflex_hub_config_provenance(
    hub: dict[str, Any], sd: dict[str, Tensor], source: str, num_heads: int | None = None
) -> tuple[ViTConfig, Provenance]:
    """The architecture of a timm naflexvit folder: its entry, its ``model_args``, the shapes."""
    arch = str(hub.get("architecture", "")).split(".")[0]
    model_args = hub.get("model_args") or {}
    if not isinstance(model_args, dict):
        raise VitkitError(f"{source}: model_args is not a JSON object")
    args = {**_DEFAULTS, **ENTRIES[arch], **model_args}
    if num_heads is not None and "num_heads" not in model_args:
        args["num_heads"] = num_heads
    _check_args(args, source)
    proj = sd.get("embeds.proj.weight")
    if proj is None or "blocks.0.attn.qkv.weight" not in sd:
        raise VitkitError(f"{source}: embeds.proj.weight or blocks.0.attn.qkv.weight is missing")
    patch = args["patch_size"]
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    width, patch_dim = proj.shape
    in_chans = args.get("in_chans", patch_dim // (ph * pw))
    if ph * pw * in_chans != patch_dim:
        raise VitkitError(
            f"{source}: embeds.proj takes {patch_dim} values, not {ph}x{pw}x{in_chans}"
        )
    factorized = args["pos_embed"] == "factorized"
    tables = ("embeds.pos_embed_y", "embeds.pos_embed_x") if factorized else ("embeds.pos_embed",)
    if any(k not in sd for k in tables):
        raise VitkitError(f"{source}: pos_embed={args['pos_embed']!r} needs {', '.join(tables)}")
    shape = sd[tables[0]].shape
    grid = (shape[1], sd[tables[-1]].shape[1]) if factorized else (shape[1], shape[2])
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    pool = _POOL[args["global_pool"]]
    fc_norm = args["fc_norm"] if args["fc_norm"] is not None else args["global_pool"] == "avg"
    size = args.get("img_size") or (hub.get("pretrained_cfg") or {}).get("input_size", [0])[1:]
    size = size or (grid[0] * ph, grid[1] * pw)
    head = sd.get("head.weight")
    cfg = ViTConfig(
        image_size=(size, size) if isinstance(size, int) else (int(size[0]), int(size[1])),
        patch_size=(ph, pw),
        in_chans=int(in_chans),
        num_classes=0 if head is None else int(head.shape[0]),
        width=int(width),
        depth=depth,
        num_heads=int(args["num_heads"]),
        mlp_dim=int(sd["blocks.0.mlp.fc1.weight"].shape[0]),
        pool=pool,  # type: ignore[arg-type]
        layer_norm_eps=1e-6,  # timm's LayerNorm
        gelu=_GELU[args["act_layer"]],  # type: ignore[arg-type]
        qkv_bias=bool(args["qkv_bias"]),
        class_token=bool(args["class_token"]),
        fc_norm=bool(fc_norm) and bool(args["final_norm"]),
        num_reg_tokens=int(args["reg_tokens"]),
        pos_embed_prefix=False,
        layer_scale_init=None if args["init_values"] is None else float(args["init_values"]),
        norm_pre=bool(args["pre_norm"]),
        patch_bias=not args["pre_norm"],
        qk_norm=bool(args["qk_norm"]),
        final_norm=bool(args["final_norm"]),
        proj_bias=bool(args["proj_bias"]),
        naflex=True,
        naflex_grid=(int(grid[0]), int(grid[1])),
        naflex_pos="factorized" if factorized else "learned",
        naflex_interp=args["pos_embed_interp_mode"],
        naflex_antialias=bool(args["pos_embed_antialias"]),
        naflex_ar_preserving=bool(args["pos_embed_ar_preserving"]),
        naflex_align_corners=bool(args["pos_embed_align_corners"]),
    )
    note = f"timm's {arch}"
    prov = Provenance().set("weights", cfg.to_dict(), "shapes")
    prov.set("name", [f.name for f in _named_fields()], note)
    prov.set("file", ["image_size"], "model_args img_size or pretrained_cfg input_size")
    if "num_heads" in model_args or num_heads is not None:
        prov.set("file" if "num_heads" in model_args else "given", ["num_heads"])
    return cfg, prov


def _named_fields() -> list[Any]:
    import dataclasses

    names = {"num_heads", "gelu", "layer_norm_eps", "pool", "fc_norm", "layer_scale_init"}
    return [f for f in dataclasses.fields(ViTConfig) if f.name in names or "naflex" in f.name]


def naflex_to_state_dict(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """timm NaFlexVit keys -> vitkit keys (the embedding's layouts; everything else equal)."""
    ph, pw = cfg.patch_size
    out: dict[str, Tensor] = {}
    for k, v in sd.items():
        if k == "embeds.proj.weight":
            out["patch_embed.proj.weight"] = v.reshape(v.shape[0], ph, pw, -1).permute(0, 3, 1, 2)
        elif k == "embeds.proj.bias":
            out["patch_embed.proj.bias"] = v
        elif k == "embeds.pos_embed":
            out["pos_embed"] = v.reshape(1, -1, v.shape[-1])
        elif k in ("embeds.pos_embed_y", "embeds.pos_embed_x"):
            continue
        elif k.startswith("embeds.norm."):
            out["patch_embed." + k[len("embeds.") :]] = v
        elif k.startswith("embeds."):
            out[k[len("embeds.") :]] = v
        else:
            out[k] = v
    if "embeds.pos_embed_y" in sd:
        import torch

        out["pos_embed"] = torch.cat([sd["embeds.pos_embed_y"], sd["embeds.pos_embed_x"]], dim=1)
    return {k: v.contiguous() for k, v in out.items()}


def state_dict_to_naflex(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit keys -> timm NaFlexVit keys (the inverse of :func:`naflex_to_state_dict`)."""
    gh, gw = cfg.naflex_grid
    out: dict[str, Tensor] = {}
    for k, v in sd.items():
        if k == "patch_embed.proj.weight":
            out["embeds.proj.weight"] = v.permute(0, 2, 3, 1).reshape(v.shape[0], -1)
        elif k == "pos_embed" and cfg.naflex_pos == "factorized":
            out["embeds.pos_embed_y"], out["embeds.pos_embed_x"] = v[:, :gh], v[:, gh:]
        elif k == "pos_embed":
            out["embeds.pos_embed"] = v.reshape(1, gh, gw, v.shape[-1])
        elif k.startswith(("patch_embed.", "cls_token", "reg_token")):
            out["embeds." + k.removeprefix("patch_embed.")] = v
        else:
            out[k] = v
    return {k: v.contiguous() for k, v in out.items()}


def naflex_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """``timm.create_model("naflexvit_base_patch16_gap", **args)`` builds ``cfg`` (every
    setting the entries differ in is given, so any naflexvit name takes them)."""
    if cfg.norm != "layernorm" or cfg.mlp != "mlp" or cfg.block != "pre" or cfg.patch_norm:
        raise VitkitError("timm's NaFlexVit has the paper's LayerNorm block and GELU MLP here")
    if cfg.patch_bias == cfg.norm_pre or cfg.scale_attn_norm or cfg.scale_mlp_norm:
        raise VitkitError("timm's NaFlexVit has a patch bias exactly when it has no norm_pre")
    gelu = {v: k for k, v in _GELU.items() if k is not None}
    return {
        "patch_size": list(cfg.patch_size),
        "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes,
        "embed_dim": cfg.width,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "mlp_ratio": cfg.mlp_dim / cfg.width,
        "qkv_bias": cfg.qkv_bias,
        "qk_norm": cfg.qk_norm,
        "proj_bias": cfg.proj_bias,
        "init_values": cfg.layer_scale_init,
        "class_token": cfg.has_class_token,
        "reg_tokens": cfg.num_reg_tokens,
        "pos_embed": cfg.naflex_pos,
        "pos_embed_grid_size": list(cfg.naflex_grid),
        "pos_embed_interp_mode": cfg.naflex_interp,
        "pos_embed_ar_preserving": cfg.naflex_ar_preserving,
        "pos_embed_antialias": cfg.naflex_antialias,
        "pos_embed_align_corners": cfg.naflex_align_corners,
        "pre_norm": cfg.norm_pre,
        "final_norm": cfg.final_norm,
        "fc_norm": cfg.fc_norm,
        "global_pool": {v: k for k, v in _POOL.items()}[cfg.pool],
        "act_layer": gelu[cfg.gelu],
        "img_size": list(cfg.image_size),
    }
