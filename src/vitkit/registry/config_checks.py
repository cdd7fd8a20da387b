"""The type and range of every model and preprocessing config field, checked before anything
is built: a config file that says ``depth: 1e9`` or ``layer_norm_eps: "abc"`` is one line
naming the field, not a model that allocates without end or a traceback deep in PyTorch.

The ranges are generous (ViT-22B has width 6144 and depth 48); they exist so that a typo or a
hostile file cannot ask for more memory than any machine has.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from vitkit.errors import VitkitError

MAX_SIDE = 16_384  # pixels along one side of the input image
MAX_CHANNELS = 1024  # input channels
MAX_CLASSES = 1_000_000  # head size
MAX_WIDTH = 65_536  # transformer width, pre-logits size
MAX_DEPTH = 1024  # encoder blocks
MAX_MLP = 262_144  # MLP hidden size
MAX_REG_TOKENS = 1024  # register tokens
MAX_STAGES = 8  # ResNet stages
MAX_UNITS = 1024  # ResNet units per stage
MAX_WIDTH_FACTOR = 64.0  # ResNet width multiplier
# position-embedding resampling kernels (vitkit.models.posemb_resample)
RESAMPLE_MODES: tuple[str, ...] = ("bicubic", "bicubic-antialias", "bilinear", "zoom")


def check_fields(cls: type, names: Any, what: str) -> None:
    """Raise a VitkitError naming each of ``names`` that is not a field of dataclass ``cls``."""
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise VitkitError(f"unknown {what}: {', '.join(unknown)}")


def integer(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]`` (numpy integers too; never a bool or a float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise VitkitError(f"{name} must be an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise VitkitError(f"{name} must lie in [{lo}, {hi:,}], got {int(value):,}")
    return int(value)


def real(name: str, value: Any, lo: float, hi: float, *, open_lo: bool = False) -> float:
    """``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``open_lo``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise VitkitError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v > hi or v < lo or (open_lo and v == lo):
        interval = f"{'(' if open_lo else '['}{lo:g}, {hi:g}]"
        raise VitkitError(f"{name} must lie in {interval}, got {value!r}")
    return v


def choice(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """``value`` if it is one of the strings or bools ``allowed`` (``1`` is not ``True``)."""
    if not isinstance(value, str | bool) or value not in allowed:
        raise VitkitError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def pair(name: str, value: Any, lo: int, hi: int) -> tuple[int, int]:
    """An int or a (height, width) pair of ints in ``[lo, hi]``."""
    if isinstance(value, numbers.Integral):
        value = (value, value)
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise VitkitError(f"{name} must be an int or a pair (height, width), got {value!r}")
    return (integer(name, value[0], lo, hi), integer(name, value[1], lo, hi))


def int_tuple(name: str, value: Any, lo: int, hi: int, max_len: int) -> tuple[int, ...]:
    """An int or a sequence of at most ``max_len`` ints in ``[lo, hi]``."""
    if isinstance(value, numbers.Integral):
        value = (value,)
    if not isinstance(value, list | tuple) or len(value) > max_len:
        raise VitkitError(f"{name} must be a list of at most {max_len} integers, got {value!r}")
    return tuple(integer(name, v, lo, hi) for v in value)


def floats(name: str, value: Any, lo: float, hi: float, *, open_lo: bool = False) -> tuple:
    if not isinstance(value, list | tuple):
        raise VitkitError(f"{name} must be a list of numbers, got {value!r}")
    return tuple(real(name, v, lo, hi, open_lo=open_lo) for v in value)


def check_vit(cfg: Any) -> dict[str, Any]:
    """The normalised values of a ViTConfig's fields (see
    :class:`vitkit.registry.model_config.ViTConfig`)."""
    out: dict[str, Any] = {
        "image_size": pair("image_size", cfg.image_size, 1, MAX_SIDE),
        "patch_size": pair("patch_size", cfg.patch_size, 1, MAX_SIDE),
        "in_chans": integer("in_chans", cfg.in_chans, 1, MAX_CHANNELS),
        "num_classes": integer("num_classes", cfg.num_classes, 0, MAX_CLASSES),
        "width": integer("width", cfg.width, 1, MAX_WIDTH),
        "depth": integer("depth", cfg.depth, 1, MAX_DEPTH),
        "mlp_dim": integer("mlp_dim", cfg.mlp_dim, 1, MAX_MLP),
        "pool": choice(
            "pool", cfg.pool, ("token", "gap", "avgmax", "max", "map", "token_gap", "none")
        ),
        "gelu": choice("gelu", cfg.gelu, ("tanh", "none", "quick")),
        "fc_norm": choice("fc_norm", cfg.fc_norm, (True, False)),
        "num_reg_tokens": integer("num_reg_tokens", cfg.num_reg_tokens, 0, MAX_REG_TOKENS),
        "pos_embed_prefix": choice("pos_embed_prefix", cfg.pos_embed_prefix, (True, False)),
        "norm_pre": choice("norm_pre", cfg.norm_pre, (True, False)),
        "patch_bias": choice("patch_bias", cfg.patch_bias, (True, False)),
        "mlp": choice("mlp", cfg.mlp, ("mlp", "swiglu")),
        "qk_norm": choice("qk_norm", cfg.qk_norm, (True, False)),
        "dist_token": choice("dist_token", cfg.dist_token, (True, False)),
        "final_norm": choice("final_norm", cfg.final_norm, (True, False)),
        "qkv_bias": choice("qkv_bias", cfg.qkv_bias, (True, False)),
        "norm": choice("norm", cfg.norm, ("layernorm", "rmsnorm")),
        "patch_norm": choice("patch_norm", cfg.patch_norm, (True, False)),
        "proj_bias": choice("proj_bias", cfg.proj_bias, (True, False)),
        "scale_attn_norm": choice("scale_attn_norm", cfg.scale_attn_norm, (True, False)),
        "scale_mlp_norm": choice("scale_mlp_norm", cfg.scale_mlp_norm, (True, False)),
        "block": choice("block", cfg.block, ("pre", "post")),
        "resnet_eps": choice("resnet_eps", cfg.resnet_eps, ("vit_jax", "timm")),
        "pos_resample": choice("pos_resample", cfg.pos_resample, RESAMPLE_MODES),
        "layer_norm_eps": real("layer_norm_eps", cfg.layer_norm_eps, 0.0, 1.0, open_lo=True),
        "resnet_width_factor": real(
            "resnet_width_factor", cfg.resnet_width_factor, 0.0, MAX_WIDTH_FACTOR, open_lo=True
        ),
    }
    out["map_prefix"] = choice("map_prefix", cfg.map_prefix, (True, False))
    for name in ("map_heads", "map_mlp_dim"):
        if getattr(cfg, name) is not None:
            out[name] = integer(name, getattr(cfg, name), 1, MAX_MLP)
    if cfg.class_token is not None:
        out["class_token"] = choice("class_token", cfg.class_token, (True, False))
    if cfg.layer_scale_init is not None:
        out["layer_scale_init"] = real("layer_scale_init", cfg.layer_scale_init, 0.0, 1e3)
    out["num_heads"] = integer("num_heads", cfg.num_heads, 1, out["width"])
    if cfg.representation_size is not None:
        out["representation_size"] = integer(
            "representation_size", cfg.representation_size, 1, MAX_WIDTH
        )
    for name in ("dropout", "attn_dropout", "drop_path", "head_dropout"):
        out[name] = real(name, getattr(cfg, name), 0.0, 1.0)
        if out[name] == 1.0:
            raise VitkitError(f"{name} must lie in [0, 1), got {out[name]}")
    if cfg.resnet_layers is not None:
        out["resnet_layers"] = int_tuple(
            "resnet_layers", cfg.resnet_layers, 1, MAX_UNITS, MAX_STAGES
        )
    return out


def family_switches(cfg: Any) -> dict[str, Any]:
    """The switches of the ViT family that differ from the paper (name: value); the formats
    that cannot hold them (npz, Hugging Face) refuse to write them, naming them."""
    names = ("fc_norm", "num_reg_tokens", "layer_scale_init", "norm_pre", "patch_bias")
    default = {f.name: f.default for f in dataclasses.fields(cfg)}
    out = {k: getattr(cfg, k) for k in (*names, "qk_norm", "dist_token", "mlp", "final_norm")}
    out.update(cfg.later_switches)  # AIMv2 / BEiT-3 / post-norm
    out = {k: v for k, v in out.items() if v != default[k]}
    if cfg.pool in ("avgmax", "max", "map", "token_gap", "none"):
        out["pool"] = cfg.pool
    out.update({k: getattr(cfg, k) for k in ("map_heads", "map_mlp_dim") if getattr(cfg, k)})
    out.update({"map_prefix": True} if cfg.map_prefix else {})
    if cfg.gelu == "quick":
        out["gelu"] = "quick"
    if cfg.has_class_token != (cfg.pool in ("token", "token_gap")):
        out["class_token"] = cfg.has_class_token
    if not cfg.pos_embed_prefix and cfg.num_prefix_tokens:
        out["pos_embed_prefix"] = False
    out.update(parallel_switches(cfg))
    out.update(rope_switches(cfg))
    out.update(rel_pos_switches(cfg))
    if cfg.naflex:  # with the settings of its E_pos resampling
        out.update(
            {
                f.name: getattr(cfg, f.name)
                for f in dataclasses.fields(cfg)
                if f.name.startswith("naflex")
            }
        )
    return out


_ROPE_DEFAULTS = {
    "rope_theta": 100.0,
    "rope_half": False,
    "rope_xy": False,
    "rope_offset": 0.0,
    "rope_hf": False,
}


def rope_switches(cfg: Any) -> dict[str, Any]:
    """The rotary-embedding switches that differ from the paper (vitkit.models.rope), and the two
    that RoPE and relative-bias models share (no E_pos, no key bias)."""
    out = {k: getattr(cfg, k) for k in ("abs_pos_embed", "k_bias") if not getattr(cfg, k)}
    out.update({"layer_scale_mlp": False} if not cfg.layer_scale_mlp else {})
    out.update({"kv_heads": cfg.kv_heads} if cfg.kv_heads is not None else {})
    if cfg.rope != "none":
        out["rope"] = cfg.rope
        out.update({k: getattr(cfg, k) for k, v in _ROPE_DEFAULTS.items() if getattr(cfg, k) != v})
        if cfg.rope_ref_grid is not None:
            out["rope_ref_grid"] = cfg.rope_ref_grid
    return out


def check_rope(cfg: Any) -> None:
    """Normalise the rotary-embedding fields of a ViTConfig in place; refuse what none has."""
    values = {
        "rope": choice("rope", cfg.rope, ("none", "dinov3", "axial", "mixed")),
        "rope_theta": real("rope_theta", cfg.rope_theta, 1.0, 1e9, open_lo=True),
        "rope_half": choice("rope_half", cfg.rope_half, (True, False)),
        "rope_xy": choice("rope_xy", cfg.rope_xy, (True, False)),
        "rope_offset": real("rope_offset", cfg.rope_offset, -MAX_SIDE, MAX_SIDE),
        "rope_hf": choice("rope_hf", cfg.rope_hf, (True, False)),
        "abs_pos_embed": choice("abs_pos_embed", cfg.abs_pos_embed, (True, False)),
        "k_bias": choice("k_bias", cfg.k_bias, (True, False)),
    }
    if cfg.rope_ref_grid is not None:
        values["rope_ref_grid"] = pair("rope_ref_grid", cfg.rope_ref_grid, 1, MAX_SIDE)
    for name, value in values.items():
        object.__setattr__(cfg, name, value)
    if not cfg.k_bias and not cfg.qkv_bias:
        raise VitkitError("k_bias=False (q and v biases only) needs qkv_bias=True")
    check_kv_heads(cfg)
    if cfg.rope == "none":
        return
    if cfg.rel_pos != "none":
        raise VitkitError("rope with a relative position bias: no checkpoint has both")
    head_dim = cfg.width // cfg.num_heads
    if head_dim % 4:
        raise VitkitError(f"rope needs a head width divisible by 4, got {head_dim}")
    if cfg.parallel > 1 or cfg.parallel_scaling or cfg.diff_attn or cfg.is_hybrid:
        raise VitkitError("rope is applied by the paper's block only (no parallel, diff, hybrid)")
    if cfg.rope == "mixed" and cfg.rope_half:
        raise VitkitError("rope='mixed' pairs channels interleaved (rope_half=False)")
    if cfg.rope_hf and cfg.rope != "dinov3":
        raise VitkitError("rope_hf computes DINOv3's angles as transformers does (rope='dinov3')")
    if cfg.rope != "axial" and cfg.rope_ref_grid is not None:
        raise VitkitError("rope_ref_grid rescales the axial RoPE's indices only")


# relative position bias (vitkit.models.relpos): the paper's values
_REL_POS_DEFAULTS = {"rel_pos": "none", "rel_pos_shared": False, "rel_pos_dim": 128}


def check_kv_heads(cfg: Any) -> None:
    """Grouped-query attention's key / value heads per block, and attention-only layer scale."""
    object.__setattr__(
        cfg, "layer_scale_mlp", choice("layer_scale_mlp", cfg.layer_scale_mlp, (True, False))
    )
    if cfg.kv_heads is None:
        return
    kv = int_tuple("kv_heads", cfg.kv_heads, 1, cfg.num_heads, cfg.depth)
    object.__setattr__(cfg, "kv_heads", kv)
    if len(kv) != cfg.depth or any(cfg.num_heads % h for h in kv):
        raise VitkitError(
            f"kv_heads {kv}: one per block ({cfg.depth}), each dividing num_heads {cfg.num_heads}"
        )
    if not cfg.k_bias or cfg.parallel > 1 or cfg.parallel_scaling or cfg.diff_attn:
        raise VitkitError("kv_heads (grouped-query attention) is the paper's block's, with k_bias")


def eva_only_switches(cfg: Any) -> list[str]:
    """The switches set that only timm's Eva holds (Sapiens2's grouped-query attention and
    attention-only layer scale, Perception Encoder's MAP head): the other writers refuse them."""
    names = {
        "kv_heads": cfg.kv_heads is not None,
        "layer_scale_mlp=False": not cfg.layer_scale_mlp and cfg.layer_scale_init is not None,
        "map_heads": cfg.map_heads is not None,
        "map_mlp_dim": cfg.map_mlp_dim is not None,
        "map_prefix": cfg.map_prefix,
    }
    return [k for k, v in names.items() if v]


def rel_pos_switches(cfg: Any) -> dict[str, Any]:
    """The relative-position-bias switches that differ from the paper (BEiT, timm relpos);
    ``rel_pos_dim`` only where an MLP bias reads it (abs_pos_embed, k_bias: rope_switches)."""
    out = {k: getattr(cfg, k) for k, v in _REL_POS_DEFAULTS.items() if getattr(cfg, k) != v}
    if not cfg.rel_pos.startswith("mlp"):
        out.pop("rel_pos_dim", None)
    return out


def check_rel_pos(cfg: Any) -> None:
    """Normalise the relative-position switches of a ViTConfig in place; refuse what no
    implementation has (timm's biases know one prefix token at most)."""
    values = {
        "rel_pos": choice("rel_pos", cfg.rel_pos, ("none", "bias", "mlp", "mlp_swin")),
        "rel_pos_shared": choice("rel_pos_shared", cfg.rel_pos_shared, (True, False)),
        "rel_pos_dim": integer("rel_pos_dim", cfg.rel_pos_dim, 1, MAX_MLP),
    }
    for name, value in values.items():
        object.__setattr__(cfg, name, value)
    if cfg.rel_pos_shared and cfg.rel_pos == "none":
        raise VitkitError("rel_pos_shared needs a relative position bias (rel_pos)")
    if cfg.rel_pos == "none":
        return  # the paper's
    if cfg.num_prefix_tokens > 1:
        raise VitkitError(
            f"rel_pos with {cfg.num_prefix_tokens} prefix tokens: the relative position bias "
            "has entries for one class token at most (BEiT, timm)"
        )
    odd = [k for k, v in parallel_switches(cfg).items() if v]
    odd += ["pool='map'"] if cfg.pool == "map" else []
    odd += eva_only_switches(cfg)
    odd += ["a ResNet stem"] if cfg.resnet_layers is not None else []
    if odd:
        raise VitkitError(
            f"relative position bias with {', '.join(odd)}: no checkpoint has both, and vitkit "
            "computes it in the paper's block only"
        )


def check_naflex(cfg: Any) -> None:
    """Normalise the NaFlex fields of a ViTConfig in place; refuse what NaFlexVit does not have."""
    values = {
        "naflex": choice("naflex", cfg.naflex, (True, False)),
        "naflex_grid": pair("naflex_grid", cfg.naflex_grid, 1, MAX_SIDE),
        "naflex_pos": choice("naflex_pos", cfg.naflex_pos, ("learned", "factorized")),
        "naflex_interp": choice("naflex_interp", cfg.naflex_interp, ("bicubic", "bilinear")),
    }
    bools = ("naflex_antialias", "naflex_ar_preserving", "naflex_align_corners")
    for name in (*bools, "naflex_resample_own"):
        values[name] = choice(name, getattr(cfg, name), (True, False))
    for name, value in values.items():
        object.__setattr__(cfg, name, value)
    if not cfg.naflex:
        return
    odd = [k for k in ("resnet_layers", "dist_token") if getattr(cfg, k) not in (None, False)]
    odd += [k for k in _PARALLEL_DEFAULTS if getattr(cfg, k) != _PARALLEL_DEFAULTS[k]]
    if cfg.pos_embed_prefix and cfg.num_prefix_tokens:
        odd.append("pos_embed_prefix")
    odd += [] if cfg.abs_pos_embed else ["abs_pos_embed=False"]
    odd += [f"{k}={getattr(cfg, k)!r}" for k in ("rope", "rel_pos") if getattr(cfg, k) != "none"]
    odd += eva_only_switches(cfg)  # (no NaFlex checkpoint has them)
    if cfg.pool == "token_gap" or cfg.representation_size:
        odd.append("pool='token_gap'" if cfg.pool == "token_gap" else "representation_size")
    if odd:
        raise VitkitError(f"naflex (timm's NaFlexVit) does not combine with {', '.join(odd)}")


# parallel blocks (vitkit.models.parallel_blocks)
_PARALLEL_DEFAULTS = {"parallel": 1, "parallel_scaling": False, "diff_attn": False}


def parallel_switches(cfg: Any) -> dict[str, Any]:
    """The parallel-block switches that differ from the paper's sequential block."""
    return {k: getattr(cfg, k) for k, v in _PARALLEL_DEFAULTS.items() if getattr(cfg, k) != v}


def check_parallel_blocks(cfg: Any) -> None:
    """Normalise the parallel-block switches of a ViTConfig in place; refuse what no block has."""
    values = {
        "parallel": integer("parallel", cfg.parallel, 1, MAX_DEPTH),
        "parallel_scaling": choice("parallel_scaling", cfg.parallel_scaling, (True, False)),
        "diff_attn": choice("diff_attn", cfg.diff_attn, (True, False)),
    }
    for name, value in values.items():
        object.__setattr__(cfg, name, value)
    if cfg.parallel_scaling and cfg.parallel > 1:
        raise VitkitError("parallel_scaling has one attention and one MLP; it needs parallel=1")
    if cfg.parallel_scaling and (cfg.mlp != "mlp" or cfg.gelu == "quick"):
        raise VitkitError("parallel_scaling has a GELU MLP (mlp='mlp', gelu 'none' or 'tanh')")
    later = ("norm", "patch_norm", "proj_bias", "scale_attn_norm", "scale_mlp_norm", "block")
    paper = {"norm": "layernorm", "patch_norm": False, "proj_bias": True, "block": "pre"}
    odd = [k for k in later if getattr(cfg, k) != paper.get(k, False)]
    if cfg.parallel_scaling and not cfg.diff_attn and cfg.norm == "rmsnorm":
        odd.remove("norm")  # timm's vit_*_xp_*: ParallelScalingBlock with RMSNorm everywhere
    if odd and (cfg.parallel > 1 or cfg.parallel_scaling or cfg.diff_attn):
        raise VitkitError(f"parallel blocks and diff_attn do not read {', '.join(odd)}")
    if cfg.diff_attn and (cfg.width // cfg.num_heads) % 2:
        raise VitkitError(
            f"diff_attn splits each head in two; head width {cfg.width // cfg.num_heads} is odd"
        )


def check_resnet(cfg: Any) -> dict[str, Any]:
    """The normalised values of a ResNetConfig's fields."""
    layers = int_tuple("layers", cfg.layers, 1, MAX_UNITS, MAX_STAGES)
    if not layers:
        raise VitkitError("layers must be one or more positive unit counts, got ()")
    return {
        "image_size": pair("image_size", cfg.image_size, 1, MAX_SIDE),
        "in_chans": integer("in_chans", cfg.in_chans, 1, MAX_CHANNELS),
        "num_classes": integer("num_classes", cfg.num_classes, 0, MAX_CLASSES),
        "layers": layers,
        "width_factor": real("width_factor", cfg.width_factor, 0.0, MAX_WIDTH_FACTOR, open_lo=True),
        "root": choice("root", cfg.root, ("bit", "small")),
    }


def check_preprocess(cfg: Any) -> dict[str, Any]:
    """The normalised values of a PreprocessConfig's fields."""
    return {
        "image_size": pair("image_size", cfg.image_size, 1, MAX_SIDE),
        "channels": _channels(cfg),
        "mean": floats("mean", cfg.mean, -1e3, 1e3),
        "std": floats("std", cfg.std, 0.0, 1e3, open_lo=True),
        "interpolation": choice(
            "interpolation",
            cfg.interpolation,
            ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"),
        ),
        "crop_pct": real("crop_pct", cfg.crop_pct, 0.0, 1.0, open_lo=True),
        "resize": choice("resize", cfg.resize, ("shortest_edge", "squash", "none")),
        "rescale_factor": real("rescale_factor", cfg.rescale_factor, 0.0, 1e3, open_lo=True),
        "crop_offset": choice("crop_offset", cfg.crop_offset, ("floor", "round")),
    }


def _channels(cfg: Any) -> int:
    channels = integer("channels", cfg.channels, 1, 3)
    if channels == 2:
        raise VitkitError("channels must be 1 or 3, got 2")
    return channels
