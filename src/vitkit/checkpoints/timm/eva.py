"""timm ``eva.py`` (``Eva``: EVA, EVA-02, Perception Encoder, DINOv3, RoPE-ViT, Sapiens2)
state dicts and folders ↔ vitkit: pure functions.

timm's ``Eva`` is the ViT with rotary position embeddings (:mod:`vitkit.models.rope`). Its keys are
vitkit's except four: layer scale is ``blocks.{i}.gamma_1`` / ``gamma_2`` (vitkit ``ls1.gamma``
/ ``ls2.gamma``), a SwiGLU MLP with ``swiglu_align_to`` or a sub-norm keeps its two input
projections apart, ``mlp.fc1_g`` / ``mlp.fc1_x`` (vitkit packs them into ``mlp.fc1``, gate
first, as timm's own ``GluMlp``), EVA's attention has ``attn.q_bias`` / ``attn.v_bias`` with
the key's bias fixed at 0 (vitkit ``k_bias=False``, the same names), and EVA-02 B / L and
Sapiens2 keep q, k and v unfused (``attn.q_proj`` / ``k_proj`` / ``v_proj``; vitkit's fused
``qkv``, written back fused, or unfused with grouped-query attention, as timm requires).
RoPE-ViT mixed's learned frequencies are ``rope.freqs`` in both, the attention-pool head
(``attn_pool.*``, timm's ``AttentionPoolLatent`` over every token: ``map_prefix``) too.

What the weights do not show is the rotary embedding itself (kind, base, channel pairing,
axis order, reference grid), the norms' epsilon, the block kind (EVA-02 enormous: post-norm)
and the pooling. A timm folder names its entry, and the entry fixes them (:data:`FAMILIES`,
timm 1.0.31); its ``model_args`` may override them. Exact here (float64 logits to rounding, at
the entry's size; any input size for the dynamic ones): DINOv3 (``vit_*_dinov3*``), LingBot
(``vit_*_lingbot``), RoPE-ViT axial / mixed with and without E_pos (``vit_*_rope_*_224``),
timm's SBB RoPE ViTs (``vit_*_rope_reg*_gap_256``), EVA-02 (``eva02_*``: RoPE on a 16 x 16
reference grid, SwiGLU with sub-norm, q / v biases, the CLIP towers' attention sub-norm, the
enormous tower's post-norm), the EVA-1 giants (``eva_giant_*``) and Perception Encoder
(``vit_pe_core|lang|spatial_*``: RoPE in (x, y) order from 1 on the entry's own grid, norm_pre,
an 8-head attention-pool head) and Sapiens2 (DINOv3's RoPE, RMSNorm, grouped-query attention:
``kv_heads``, attention-only layer scale): every timm 1.0.31 eva.py entry (:data:`REFUSED` is
empty; a later timm's entry of another kind would be named there).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from vitkit.checkpoints.provenance import Provenance
from vitkit.checkpoints.timm.vision_transformer import pretrained_cfg
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

# timm eva.py entries vitkit reads: (name pattern, what the entry fixes beyond the weights)
_DINO = {"rope": "dinov3", "rope_theta": 100.0, "rope_half": True, "layer_norm_eps": 1e-5}
_ROPEVIT = {"rope_xy": True, "pool": "token", "layer_norm_eps": 1e-6}
_APE = {"pos_embed_prefix": False}  # E_pos on the patches only (timm no_embed_class)
_MIXED = {"rope": "mixed", "rope_theta": 10.0}
_EVA02 = {"rope": "axial", "rope_theta": 1e4, "rope_ref_grid": (16, 16), "layer_norm_eps": 1e-6}
_EVA1 = {"rope": "none", "layer_norm_eps": 1e-6}  # EVA-1: E_pos only, q / v biases
# Perception Encoder: index RoPE in (x, y) order from (1, 1), rescaled to the entry's own grid
_PE = {"rope": "axial", "rope_theta": 1e4, "rope_xy": True, "rope_offset": 1.0}
_PE.update(layer_norm_eps=1e-5)
_PE_MAP = {"pool": "map", "map_heads": 8, "map_prefix": True}  # its attention-pool head
FAMILIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("EVA-02", r"^eva02_(tiny|small|base|large)_patch14_(224|336|448)$", {**_EVA02, "pool": "gap"}),
    ("EVA-02", r"^eva02_(base|large)_patch1[46]_clip_(224|336)$", {**_EVA02, "pool": "token"}),
    ("EVA-02", r"^eva02_enormous_patch14_clip_224$", {**_EVA1, "block": "post", "pool": "token"}),
    ("EVA", r"^eva_giant_patch14_(224|336|560)$", {**_EVA1, "pool": "gap"}),
    ("EVA", r"^eva_giant_patch14_clip_224$", {**_EVA1, "pool": "token"}),
    (  # Sapiens2: DINOv3's RoPE, RMSNorm, grouped-query attention in the middle blocks
        "Sapiens2",
        r"^vit_\w+_patch16_sapiens2$",
        {**_DINO, "layer_norm_eps": 1e-6, "norm": "rmsnorm", "pool": "token"},
    ),
    ("Perception Encoder", r"^vit_pe_core_(tiny|small|base|large)_", {**_PE, **_PE_MAP}),
    ("Perception Encoder", r"^vit_pe_core_gigantic_", {**_PE, **_PE_MAP, "rope_offset": 0.0}),
    (
        "Perception Encoder",
        r"^vit_pe_(lang|spatial)_(tiny|small|base|large)_",
        {**_PE, "pool": "gap"},
    ),
    (
        "Perception Encoder",
        r"^vit_pe_(lang|spatial)_gigantic_",
        {**_PE, "rope_offset": 0.0, "pool": "gap"},
    ),
    ("DINOv3", r"^vit_\w+_patch16_dinov3(_qkvb)?$", {**_DINO, "pool": "gap"}),
    ("LingBot", r"^vit_\w+_patch16_lingbot$", {**_DINO, "pool": "token"}),
    ("RoPE-ViT", r"^vit_\w+_patch16_rope_224$", {**_ROPEVIT, "rope": "axial"}),
    ("RoPE-ViT", r"^vit_\w+_patch16_rope_ape_224$", {**_ROPEVIT, **_APE, "rope": "axial"}),
    ("RoPE-ViT", r"^vit_\w+_patch16_rope_mixed_224$", {**_ROPEVIT, **_MIXED}),
    ("RoPE-ViT", r"^vit_\w+_patch16_rope_mixed_ape_224$", {**_ROPEVIT, **_APE, **_MIXED}),
    (
        "RoPE-ViT",  # timm's SBB ViTs with RoPE
        r"^vit_\w+_patch16_rope_reg\d_gap_256$",
        {"rope": "axial", "rope_theta": 10000.0, "rope_ref_grid": (16, 16), "pool": "gap"},
    ),
)
# eva.py entries refused, by name: what vitkit lacks
REFUSED: tuple[tuple[str, str], ...] = ()
_LS = re.compile(r"^(blocks\.\d+\.)gamma_([12])$")
_FC1 = re.compile(r"^(blocks\.\d+\.mlp\.)fc1_([gx])\.(weight|bias)$")
_QKV_FUSED = re.compile(r"^(blocks\.(\d+)\.attn\.)qkv\.(weight|bias)$")
_QKV = re.compile(r"^(blocks\.\d+\.attn\.)([qkv])_proj\.(weight|bias)$")


def family_of(arch: str) -> tuple[str, dict[str, Any]] | None:
    """(family, settings) of a timm eva.py entry vitkit reads; None for another name."""
    for fam, pattern, settings in FAMILIES:
        if re.match(pattern, arch):
            if fam == "Perception Encoder":  # RoPE indices rescaled to the entry's own grid
                m = re.search(r"_patch(\d+)_(\d+)$", arch)
                side = int(m[2]) // int(m[1]) if m else 0
                settings = {**settings, "rope_ref_grid": (side, side)}
            return fam, settings
    return None


def check_eva_architecture(arch: str, source: str) -> tuple[str, dict[str, Any]]:
    """The family of an eva.py entry, or one line naming what vitkit lacks for it."""
    found = family_of(arch)
    if found is not None:
        return found
    for pattern, why in REFUSED:
        if re.search(pattern, arch):
            raise VitkitError(f"{source}: {arch}: {why}")
    raise VitkitError(f"{source}: {arch} is not an eva.py entry vitkit reads")


def is_eva(sd: dict[str, Tensor]) -> bool:
    """Whether the keys are timm eva.py's (``gamma_1`` layer scale, ``q_bias``, ``rope.*``,
    or a patch embedding with no E_pos)."""
    return any(
        _LS.match(k)
        or k.endswith((".attn.q_bias", ".mlp.fc1_g.weight", ".attn.q_proj.weight"))
        or k.startswith("rope.")
        for k in sd
    ) or ("patch_embed.proj.weight" in sd and "pos_embed" not in sd)


def eva_to_state_dict(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """timm eva.py keys → vitkit keys (``gamma_*`` → ``ls*.gamma``, ``fc1_g`` + ``fc1_x`` →
    ``fc1``, EVA-02's unfused ``q_proj`` / ``k_proj`` / ``v_proj`` → ``qkv`` with ``q_bias`` /
    ``v_bias`` where the key has none); everything else equal."""
    del cfg  # same signature as every converter
    out: dict[str, Tensor] = {}
    halves: dict[tuple[str, str], dict[str, Tensor]] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}
    for k, v in sd.items():
        if m := _LS.match(k):
            out[f"{m[1]}ls{m[2]}.gamma"] = v
        elif m := _FC1.match(k):
            halves.setdefault((m[1], m[3]), {})[m[2]] = v
        elif m := _QKV.match(k):
            qkv.setdefault((m[1], m[3]), {})[m[2]] = v
        else:
            out[k] = v
    for (prefix, part), parts in qkv.items():
        if part == "weight" or "k" in parts:
            if set(parts) != {"q", "k", "v"}:
                raise VitkitError(f"{prefix}q_proj / k_proj / v_proj: not all three {part}s")
            out[f"{prefix}qkv.{part}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
        elif set(parts) == {"q", "v"}:  # EVA-02: the key's bias is 0
            out[f"{prefix}q_bias"], out[f"{prefix}v_bias"] = parts["q"], parts["v"]
        else:
            raise VitkitError(f"{prefix}q_proj / v_proj: only one of the q / v biases is there")
    for (prefix, part), pair in halves.items():
        if set(pair) != {"g", "x"}:
            raise VitkitError(f"{prefix}fc1_g / fc1_x: only one of the SwiGLU halves is there")
        out[f"{prefix}fc1.{part}"] = torch.cat([pair["g"], pair["x"]], dim=0)
    return out


def state_dict_to_eva(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit keys → timm eva.py keys (the inverse of :func:`eva_to_state_dict`; a SwiGLU
    fc1 is written as ``fc1_g`` / ``fc1_x``, timm's ``SwiGLU``)."""
    why = eva_write_refusal(cfg)
    if why:
        raise VitkitError(why)
    out: dict[str, Tensor] = {}
    for k, v in sd.items():
        m = re.match(r"^(blocks\.\d+\.)ls([12])\.gamma$", k)
        f = re.match(r"^(blocks\.\d+\.mlp\.)fc1\.(weight|bias)$", k)
        if m:
            out[f"{m[1]}gamma_{m[2]}"] = v.contiguous()
        elif cfg.kv_heads is not None and (q := _QKV_FUSED.match(k)):  # unfused for timm
            sizes = [cfg.width, *(2 * [cfg.kv_heads[int(q[2])] * (cfg.width // cfg.num_heads)])]
            for name, part in zip("qkv", v.split(sizes, dim=0)):
                out[f"{q[1]}{name}_proj.{q[3]}"] = part.contiguous()
        elif f and cfg.mlp == "swiglu":
            g, x = v.chunk(2, dim=0)
            out[f"{f[1]}fc1_g.{f[2]}"], out[f"{f[1]}fc1_x.{f[2]}"] = g.contiguous(), x.contiguous()
        else:
            out[k] = v.contiguous()
    return out


def eva_write_refusal(cfg: ViTConfig) -> str | None:
    """Why timm's ``Eva`` cannot hold ``cfg`` (None when it can)."""
    pool_prefix = cfg.pool == "map" and cfg.num_prefix_tokens and not cfg.map_prefix
    odd = {
        "representation_size": cfg.representation_size,
        "dist_token": cfg.dist_token,
        "pool": cfg.pool == "token_gap" or pool_prefix,  # Eva's attn_pool sees every token
        "norm": cfg.norm != "layernorm" and (cfg.rope != "dinov3" or cfg.layer_norm_eps != 1e-6),
        "patch_norm": cfg.patch_norm,
        "proj_bias": not cfg.proj_bias,
        "qk_norm with block='post'": cfg.block == "post" and cfg.qk_norm,
        "gelu": cfg.gelu != "none" and cfg.mlp != "swiglu",
        "norm_pre": cfg.norm_pre == cfg.patch_bias,
        # the entry fixes the norms' epsilon (timm's model_args cannot hold a norm_layer):
        # DINOv3's and PE's 1e-5, the others' 1e-6
        "layer_norm_eps": cfg.layer_norm_eps not in (1e-5, 1e-6)
        or (cfg.rope == "dinov3" and cfg.norm == "layernorm" and cfg.layer_norm_eps != 1e-5),
        "mlp_dim": not _ratio_exact(cfg.width, _hidden(cfg)),
        "map_mlp_dim": cfg.pool == "map" and not _ratio_exact(cfg.width, _map_hidden(cfg)),
    }
    bad = [k for k, v in odd.items() if v]
    if bad:
        return f"timm's Eva has no {', '.join(bad)} as this model has them"
    return None


def _hidden(cfg: ViTConfig) -> int:
    return cfg.mlp_dim // 2 if cfg.mlp == "swiglu" else cfg.mlp_dim


def _map_hidden(cfg: ViTConfig) -> int:
    return cfg.map_mlp_dim or cfg.mlp_dim


def _ratio_exact(width: int, hidden: int) -> bool:
    """Whether timm's ``int(width * (hidden / width))`` gives ``hidden`` back."""
    return int(width * (hidden / width)) == hidden


def eva_architecture(cfg: ViTConfig) -> str:
    """A registered eva.py entry of the same family and norm epsilon (``model_args`` set the
    rest)."""
    if cfg.norm == "rmsnorm":  # (Sapiens2's RMSNorm, eps 1e-6)
        return "vit_base_patch16_sapiens2"
    if cfg.rope == "dinov3":
        return "vit_small_patch16_lingbot" if cfg.pool == "token" else "vit_small_patch16_dinov3"
    if cfg.layer_norm_eps == 1e-5:  # Perception Encoder's
        return (
            "vit_pe_core_tiny_patch16_384"
            if cfg.pool == "map"
            else "vit_pe_spatial_tiny_patch16_512"
        )
    if cfg.rope == "mixed":
        return "vit_small_patch16_rope_mixed_224"
    return "vit_small_patch16_rope_224" if cfg.rope == "axial" else "eva_giant_patch14_224"


def eva_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """``timm.create_model(eva_architecture(cfg), **args)`` builds the same network."""
    rope_type = {"dinov3": "dinov3", "axial": "cat", "mixed": "mixed"}.get(cfg.rope, "cat")
    args: dict[str, Any] = {
        "img_size": list(cfg.image_size),
        "patch_size": list(cfg.patch_size),
        "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes,
        "embed_dim": cfg.width,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "mlp_ratio": _hidden(cfg) / cfg.width,
        "qkv_bias": cfg.qkv_bias,
        "qkv_fused": cfg.kv_heads is None,  # (timm's grouped-query attention is unfused)
        "num_kv_heads": None if cfg.kv_heads is None else list(cfg.kv_heads),
        "attn_only_layer_scale": not cfg.layer_scale_mlp,
        "attn_type": "eva" if (not cfg.k_bias or not cfg.qkv_bias) else "rope",
        "class_token": cfg.has_class_token,
        "num_reg_tokens": cfg.num_reg_tokens,
        "no_embed_class": not cfg.pos_embed_prefix,
        "global_pool": {"gap": "avg", "none": ""}.get(cfg.pool, cfg.pool),
        "use_fc_norm": cfg.fc_norm,
        "use_post_transformer_norm": cfg.final_norm and not cfg.fc_norm,
        "use_post_norm": cfg.block == "post",
        "init_values": cfg.layer_scale_init,
        "use_pre_transformer_norm": cfg.norm_pre,
        "qk_norm": cfg.qk_norm,
        "scale_attn_inner": cfg.scale_attn_norm,
        "scale_mlp": cfg.scale_mlp_norm,
        "swiglu_mlp": cfg.mlp == "swiglu",
        "swiglu_align_to": 0 if cfg.scale_mlp_norm or cfg.mlp != "swiglu" else 1,
        "use_abs_pos_emb": cfg.abs_pos_embed,
        "use_rot_pos_emb": cfg.rope != "none",
        "rope_type": rope_type,
        "rope_temperature": cfg.rope_theta,
        "rope_rotate_half": cfg.rope_half,
        "rope_grid_indexing": "xy" if cfg.rope_xy else "ij",
        "rope_grid_offset": cfg.rope_offset,
        "ref_feat_shape": None if cfg.rope_ref_grid is None else list(cfg.rope_ref_grid),
        # RoPE follows the input's grid; timm's fixed-size entries take the axial RoPE's angles
        # in float32 as vitkit does (its dynamic path in float64: ~1e-8 apart)
        "dynamic_img_size": cfg.rope != "axial",
    }
    if cfg.pool == "map":  # timm's AttentionPoolLatent over every token
        args["attn_pool_num_heads"] = cfg.map_heads or cfg.num_heads
        args["attn_pool_mlp_ratio"] = _map_hidden(cfg) / cfg.width
    return args


# model_args keys: the config fields they set ("" = read below or training only)
_ARGS = frozenset(
    "img_size patch_size in_chans num_classes embed_dim depth num_heads mlp_ratio qkv_bias "
    "attn_type class_token num_reg_tokens no_embed_class global_pool use_fc_norm init_values "
    "use_pre_transformer_norm qk_norm scale_attn_inner scale_mlp swiglu_mlp swiglu_align_to "
    "use_abs_pos_emb use_rot_pos_emb rope_type rope_temperature rope_rotate_half "
    "use_post_transformer_norm use_post_norm attn_pool_num_heads attn_pool_mlp_ratio "
    "num_kv_heads attn_only_layer_scale rope_rescale_coords rope_jitter_coords rope_shift_coords "
    "rope_grid_indexing rope_grid_offset ref_feat_shape dynamic_img_size "
    "qkv_fused drop_rate pos_drop_rate patch_drop_rate proj_drop_rate attn_drop_rate "
    "drop_path_rate head_init_scale device dtype".split()
)
_ROPE_TYPES = {"dinov3": "dinov3", "cat": "axial", "mixed": "mixed"}


def _shapes(sd: dict[str, Tensor], source: str) -> dict[str, Any]:
    """What an eva.py state dict's keys and shapes show."""
    if "patch_embed.proj.weight" not in sd:
        raise VitkitError(f"{source}: no patch_embed.proj.weight: not a timm Eva state dict")
    proj = sd["patch_embed.proj.weight"]
    width = proj.shape[0]
    depth = len({int(k.split(".")[1]) for k in sd if k.startswith("blocks.")})
    b = "blocks.0."
    if f"{b}mlp.fc1_g.weight" in sd:
        mlp, mlp_dim = "swiglu", 2 * sd[f"{b}mlp.fc1_g.weight"].shape[0]
    else:
        fc1, fc2 = sd[f"{b}mlp.fc1.weight"].shape[0], sd[f"{b}mlp.fc2.weight"].shape[1]
        mlp, mlp_dim = ("swiglu" if fc2 * 2 == fc1 else "mlp"), fc1
    split = f"{b}attn.q_proj.weight" in sd  # EVA-02 B / L, Sapiens2: unfused q, k, v
    keys = (
        [f"blocks.{i}.attn.{p}_proj.weight" for i in range(depth) for p in "qkv"] if split else []
    )
    if any(k not in sd for k in keys):
        missing = next(k for k in keys if k not in sd)
        raise VitkitError(
            f"{source}: no {missing}: q_proj / k_proj / v_proj: not all three weights"
        )
    kv_dims = [sd[k].shape[0] for k in keys[1::3]]
    qv = f"{b}attn.q_bias" in sd or (split and f"{b}attn.k_proj.bias" not in sd)
    qv = qv and (not split or f"{b}attn.q_proj.bias" in sd)
    ls = f"{b}gamma_1" in sd
    out: dict[str, Any] = {
        "patch_size": tuple(proj.shape[2:]),
        "in_chans": proj.shape[1],
        "width": width,
        "depth": depth,
        "mlp": mlp,
        "mlp_dim": mlp_dim,
        "qkv_bias": qv or f"{b}attn.qkv.bias" in sd or f"{b}attn.k_proj.bias" in sd,
        "k_bias": not qv,
        "class_token": "cls_token" in sd,
        "num_reg_tokens": sd["reg_token"].shape[1] if "reg_token" in sd else 0,
        "abs_pos_embed": "pos_embed" in sd,
        "layer_scale_init": 1e-5 if ls else None,
        "layer_scale_mlp": not ls or f"{b}gamma_2" in sd,  # (Sapiens2: attention only)
        "norm": "layernorm" if f"{b}norm1.bias" in sd else "rmsnorm",
        "kv_heads": kv_dims if any(k != width for k in kv_dims) else None,  # dims: heads below
        "norm_pre": "norm_pre.weight" in sd,
        "patch_bias": "patch_embed.proj.bias" in sd,
        "qk_norm": f"{b}attn.q_norm.weight" in sd,
        "scale_attn_norm": f"{b}attn.norm.weight" in sd,
        "scale_mlp_norm": f"{b}mlp.norm.weight" in sd,
        "fc_norm": "fc_norm.weight" in sd,
        "final_norm": "norm.weight" in sd or "fc_norm.weight" in sd,
        "num_classes": sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        "gelu": "none",
    }
    if "rope.freqs" in sd:
        out["rope"], out["num_heads"] = "mixed", sd["rope.freqs"].shape[2]
    if "attn_pool.latent" in sd:  # timm's AttentionPoolLatent, over every token
        out["pool"], out["map_prefix"] = "map", True
        pool_mlp = sd["attn_pool.mlp.fc1.weight"].shape[0]
        out["map_mlp_dim"] = None if pool_mlp == mlp_dim else pool_mlp
    return out


def eva_hub_config_provenance(
    hub: dict[str, Any], sd: dict[str, Tensor], source: str, num_heads: int | None = None
) -> tuple[ViTConfig, Provenance]:
    """The architecture of a timm folder naming an eva.py entry: the weights, then what the
    entry fixes (:data:`FAMILIES`), then the folder's ``model_args``."""
    arch = str(hub.get("architecture", "")).split(".")[0]
    fam, named = check_eva_architecture(arch, source)
    args = hub.get("model_args") or {}
    if not isinstance(args, dict):
        raise VitkitError(f"{source}: model_args is not a JSON object")
    unknown = sorted(set(args) - _ARGS)
    if unknown:
        raise VitkitError(
            f"{source}: model_args {', '.join(unknown)}: not arguments of timm's Eva vitkit "
            "knows; vitkit will not guess what they change"
        )
    shown = _shapes(sd, source)
    fields = {**shown, **named}
    if args.get("use_rot_pos_emb") is False:
        fields["rope"] = "none"
    elif args.get("use_rot_pos_emb") and named["rope"] == "none":  # Eva's RoPE defaults
        fields.update(rope="axial", rope_theta=1e4, rope_xy=False, rope_offset=0.0)
    if "rope_type" in args and fields["rope"] != "none":
        if args["rope_type"] not in _ROPE_TYPES:
            raise VitkitError(f"{source}: rope_type={args['rope_type']!r} is not one vitkit has")
        fields["rope"] = _ROPE_TYPES[args["rope_type"]]
    for key, field in (
        ("rope_temperature", "rope_theta"),
        ("rope_rotate_half", "rope_half"),
        ("rope_grid_offset", "rope_offset"),
        ("init_values", "layer_scale_init"),
        ("num_heads", "num_heads"),
        ("attn_pool_num_heads", "map_heads"),
    ):
        if args.get(key) is not None:
            fields[field] = args[key]
    if "use_post_norm" in args:
        fields["block"] = "post" if args["use_post_norm"] else "pre"
    if "rope_grid_indexing" in args:
        fields["rope_xy"] = args["rope_grid_indexing"] == "xy"
    if "ref_feat_shape" in args:
        ref = args["ref_feat_shape"]
        fields["rope_ref_grid"] = ref if ref is None or isinstance(ref, int) else tuple(ref)
    if fields["layer_scale_init"] is None or not shown["layer_scale_init"]:
        fields["layer_scale_init"] = None
    pool = {"avg": "gap"}.get(args.get("global_pool", ""), args.get("global_pool"))
    pool = pool or fields["pool"]
    if pool not in ("gap", "token", "avgmax", "max", "map"):
        raise VitkitError(f"{source}: global_pool {pool!r} is not one vitkit reads for Eva")
    if (pool == "map") != ("attn_pool.latent" in sd):
        raise VitkitError(f"{source}: global_pool {pool!r} and the attn_pool weights disagree")
    fields["pool"] = pool
    if pool != "map":
        fields.pop("map_heads", None)
    if "use_fc_norm" not in args and "fc_norm.weight" in sd:
        fields["fc_norm"] = True
    fields["class_token"] = shown["class_token"]
    if "num_heads" not in fields:
        known = num_heads if num_heads is not None else _heads(shown["width"], fam, arch)
        fields["num_heads"] = known
    if fields.get("map_heads") == fields["num_heads"]:
        fields["map_heads"] = None  # (the blocks' heads, timm's default)
    if pool == "map":  # timm's Eva pools every token: the prefix ones where there are any
        fields["map_prefix"] = bool(shown["class_token"] or shown["num_reg_tokens"])
    if shown["kv_heads"]:  # key / value widths -> heads
        head_dim = shown["width"] // fields["num_heads"]
        fields["kv_heads"] = tuple(k // head_dim for k in shown["kv_heads"])
    size = args.get("img_size")
    grid = _pos_grid(sd, shown, fields.get("pos_embed_prefix", True), args)
    if size is None:
        size = (grid[0] * shown["patch_size"][0], grid[1] * shown["patch_size"][1])
    fields["image_size"] = size
    if "no_embed_class" in args:
        fields["pos_embed_prefix"] = not args["no_embed_class"]
    if not shown["abs_pos_embed"]:
        fields["pos_embed_prefix"] = True
    cfg = ViTConfig(**fields)
    prov = Provenance().set("weights", cfg.to_dict())
    prov.set("name", list(named), f"timm's {arch}")
    prov.set("file", [k for k in fields if k in args], "model_args")
    return cfg, prov


# heads by width of every eva.py entry read here (DINOv3 H+ 1280: 20, 7B 4096: 32; SBB 512,
# 640; EVA-1 giant 1408, PE gigantic 1536, EVA-02 enormous 1792: 16)
_HEADS = {192: 3, 384: 6, 512: 8, 640: 10, 768: 12, 1024: 16, 1280: 20, 4096: 32}
_HEADS.update({1408: 16, 1536: 16, 1792: 16})
_SAPIENS2_HEADS = {768: 12, 1024: 16, 1280: 16, 1536: 24, 2432: 32}  # (H 16, g 24 heads)


def _heads(width: int, family: str, arch: str = "") -> int:
    """The entry's own heads where the folder keeps its width (``vitkit.registry.families`` has
    every eva.py entry: LingBot-g has 24 heads at DINOv2-g's width, PE-G 16 at the same 1536), else
    the family's heads by width."""
    from vitkit.registry.families import FAMILIES

    row = FAMILIES.get(arch)
    if row is not None and row.get("width") == width:
        return int(row["num_heads"])
    table = _SAPIENS2_HEADS if family == "Sapiens2" else _HEADS
    if width in table:
        return table[width]
    raise VitkitError(f"width {width}: the number of heads is not known; give num_heads")


def _pos_grid(
    sd: dict[str, Tensor], shown: dict[str, Any], prefix_rows: bool, args: dict[str, Any]
) -> tuple[int, int]:
    """The patch grid: from ``img_size``, else a square E_pos, else 14 x 14 (RoPE only: any
    input size gives the same numbers, so the model's own size is a default, not a guess)."""
    size = args.get("img_size")
    p = shown["patch_size"]
    if size is not None:
        h, w = (size, size) if isinstance(size, int) else size
        return int(h) // p[0], int(w) // p[1]
    if "pos_embed" in sd:
        prefix = shown["class_token"] + shown["num_reg_tokens"] if prefix_rows else 0
        n = sd["pos_embed"].shape[1] - prefix
        side = int(round(n**0.5))
        return side, side
    return 14, 14


def eva_hub_config(
    cfg: ViTConfig, preprocess: PreprocessConfig, class_names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The ``config.json`` of a timm folder holding ``cfg`` as an eva.py entry."""
    args = eva_model_args(cfg)
    out: dict[str, Any] = {
        "architecture": eva_architecture(cfg),
        "num_classes": cfg.num_classes,
        "num_features": cfg.width,
        "global_pool": args["global_pool"],
        "model_args": args,
        "pretrained_cfg": pretrained_cfg(cfg, preprocess, "patch_embed.proj", False),
    }
    if class_names:
        out["label_names"] = list(class_names)
    return out
