"""Hugging Face's DINOv3 ViT (``DINOv3ViTModel``, ``model_type: dinov3_vit``) ↔ vitkit: pure
functions.

transformers' DINOv3 is timm's (:mod:`vitkit.checkpoints.timm.eva`) under other names: a class
token, then ``num_register_tokens`` storage tokens, no E_pos, DINOv3's RoPE (centred patch
coordinates in [-1, 1], ``rope_theta`` periods, ``rotate_half``, row then column: vitkit
``rope="dinov3"``, ``rope_half``), layer scale on both branches, and ``DINOv3ViTModel``'s pooled
output is the normed class token (``pool="token"``, no head). Its angles are computed in float32
(``2 pi coord`` times ``1 / period``), timm's in the model's dtype: vitkit reads it with
``rope_hf`` so that a float64 model agrees to rounding; in float32 the two are one. The
training-time coordinate augmentation (``pos_embed_shift`` / ``jitter`` / ``rescale``) and
``drop_path_rate`` act only in training mode and are not read (vitkit's stochastic depth is
linear in depth, transformers' uniform): inference is exact, fine-tuning runs without them.

Keys (transformers 5 saves the Hub's naming ``layer.{i}``; its own modules are
``model.layer.{i}``, both read): ``embeddings.cls_token``, ``embeddings.register_tokens``,
``embeddings.patch_embeddings`` (a Conv2d with bias), ``layer.{i}.norm1`` / ``norm2``,
``attention.{q,k,v,o}_proj`` (biases per ``query_bias`` / ``key_bias`` / ``value_bias`` /
``proj_bias``), ``layer_scale{1,2}.lambda1``, ``mlp.up_proj`` / ``down_proj`` (and
``gate_proj`` with ``use_gated_mlp``: SiLU(gate) x up, vitkit's packed ``mlp="swiglu"``, gate
first), ``norm``. ``embeddings.mask_token`` serves masked training only: dropped when read,
written as zeros (transformers' initial value).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vitkit.checkpoints.hf.vit_model import ACTIVATIONS, ENCODER_FIELDS, HF_ACT, refuse_leftover
from vitkit.errors import VitkitError
from vitkit.registry.config_checks import eva_only_switches
from vitkit.registry.model_config import ViTConfig

MODEL_TYPES = ("dinov3_vit",)
CLASSES = ("DINOv3ViTModel",)
# vitkit field -> the config.json key that sets it (for provenance); absent keys take
# DINOv3ViTConfig's defaults (the format's)
FIELDS = {
    "image_size": "image_size",
    **ENCODER_FIELDS,
    "mlp": "use_gated_mlp",
    "rope_theta": "rope_theta",
    "qkv_bias": "query_bias",
    "k_bias": "key_bias",
    "proj_bias": "proj_bias",
    "num_reg_tokens": "num_register_tokens",
    "layer_scale_init": "layerscale_value",
    "attn_dropout": "attention_dropout",
    # fixed by the class (None: no key): its RoPE, no E_pos, the class token's pooled output
    **dict.fromkeys(
        "rope rope_half rope_xy rope_offset rope_hf abs_pos_embed pool class_token".split()
    ),
}
_SILU = ("silu", "swish")
_MASK = "embeddings.mask_token"


def is_dinov3(hf: dict[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is a DINOv3 ViT's."""
    return hf.get("model_type") in MODEL_TYPES


def _pair(name: str, value: Any) -> Any:
    if isinstance(value, list | tuple) and len(value) == 2:
        return tuple(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise VitkitError(f"{name}={value!r}: expected an int or [height, width]")


def dinov3_to_vit_config(hf: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """A ``DINOv3ViTConfig`` dict → :class:`ViTConfig` (absent keys: the class's defaults)."""
    act = hf.get("hidden_act", "gelu")
    gated = hf.get("use_gated_mlp", False)
    if gated not in (True, False):
        raise VitkitError(f"{source}: use_gated_mlp={gated!r} is not a boolean")
    if gated and act not in _SILU:
        raise VitkitError(f"{source}: a gated MLP with {act!r}: vitkit's is SwiGLU (silu) only")
    if not gated and act not in ACTIVATIONS:
        raise VitkitError(f"{source}: hidden_act {act!r} is not a GELU vitkit has")
    q, k, v = (hf.get("query_bias", True), hf.get("key_bias", False), hf.get("value_bias", True))
    if q != v or (k and not q):
        raise VitkitError(
            f"{source}: query_bias={q}, key_bias={k}, value_bias={v}: vitkit has q/k/v biases "
            "all or none, or on q and v only"
        )
    if hf.get("proj_bias", True) != hf.get("mlp_bias", True):
        raise VitkitError(f"{source}: proj_bias and mlp_bias differ; vitkit has one proj_bias")
    inter = hf.get("intermediate_size", 1536)
    try:
        return ViTConfig(
            image_size=_pair("image_size", hf.get("image_size", 224)),
            patch_size=_pair("patch_size", hf.get("patch_size", 16)),
            in_chans=hf.get("num_channels", 3),
            num_classes=0,
            width=hf.get("hidden_size", 384),
            depth=hf.get("num_hidden_layers", 12),
            num_heads=hf.get("num_attention_heads", 6),
            mlp=("swiglu" if gated else "mlp"),
            mlp_dim=2 * inter if gated and isinstance(inter, int) else inter,
            pool="token",
            attn_dropout=float(hf.get("attention_dropout", 0.0)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
            gelu="none" if gated else ACTIVATIONS[act],
            qkv_bias=bool(q),
            k_bias=bool(k) or not q,
            proj_bias=bool(hf.get("proj_bias", True)),
            num_reg_tokens=hf.get("num_register_tokens", 0),
            layer_scale_init=float(hf.get("layerscale_value", 1.0)),
            abs_pos_embed=False,
            rope="dinov3",
            rope_theta=float(hf.get("rope_theta", 100.0)),
            rope_half=True,
            rope_hf=True,
        )
    except (TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"{source}: malformed DINOv3 config ({e})") from None


def _block(cfg: ViTConfig) -> dict[str, tuple[str, ...]]:
    """vitkit name inside block i → the Hugging Face names it is made of (concatenated along
    the first axis), without the weight / bias leaf."""
    fc1 = ("mlp.gate_proj", "mlp.up_proj") if cfg.mlp == "swiglu" else ("mlp.up_proj",)
    return {
        "norm1": ("norm1",),
        "norm2": ("norm2",),
        "attn.qkv": ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
        "attn.proj": ("attention.o_proj",),
        "mlp.fc1": fc1,
        "mlp.fc2": ("mlp.down_proj",),
    }


def _spec(cfg: ViTConfig, layer: str) -> dict[str, tuple[str, ...]]:
    """Every vitkit key → the Hugging Face keys it is made of."""
    spec: dict[str, tuple[str, ...]] = {
        "cls_token": ("embeddings.cls_token",),
        "patch_embed.proj.weight": ("embeddings.patch_embeddings.weight",),
        "patch_embed.proj.bias": ("embeddings.patch_embeddings.bias",),
        "norm.weight": ("norm.weight",),
        "norm.bias": ("norm.bias",),
    }
    if cfg.num_reg_tokens:
        spec["reg_token"] = ("embeddings.register_tokens",)
    for i in range(cfg.depth):
        b = f"{layer}.{i}"
        for ours, theirs in _block(cfg).items():
            spec[f"blocks.{i}.{ours}.weight"] = tuple(f"{b}.{t}.weight" for t in theirs)
            if ours == "attn.qkv":
                if cfg.qkv_bias and cfg.k_bias:
                    spec[f"blocks.{i}.attn.qkv.bias"] = tuple(f"{b}.{t}.bias" for t in theirs)
                elif cfg.qkv_bias:
                    spec[f"blocks.{i}.attn.q_bias"] = (f"{b}.attention.q_proj.bias",)
                    spec[f"blocks.{i}.attn.v_bias"] = (f"{b}.attention.v_proj.bias",)
            elif cfg.proj_bias or ours.startswith("norm"):
                spec[f"blocks.{i}.{ours}.bias"] = tuple(f"{b}.{t}.bias" for t in theirs)
        spec[f"blocks.{i}.ls1.gamma"] = (f"{b}.layer_scale1.lambda1",)
        spec[f"blocks.{i}.ls2.gamma"] = (f"{b}.layer_scale2.lambda1",)
    return spec


def dinov3_to_state_dict(sd: dict[str, Tensor], cfg: ViTConfig, source: str) -> dict[str, Tensor]:
    """DINOv3 weights → vitkit state dict. Missing keys and keys left over (but the mask
    token, and an empty ``register_tokens`` without registers) are errors naming them."""
    layer = "model.layer" if any(k.startswith("model.layer.") for k in sd) else "layer"
    used = {_MASK}
    if not cfg.num_reg_tokens and "embeddings.register_tokens" in sd:
        if sd["embeddings.register_tokens"].numel():
            raise VitkitError(f"{source}: register_tokens holds tokens num_register_tokens omits")
        used.add("embeddings.register_tokens")
    out: dict[str, Tensor] = {}
    for ours, theirs in _spec(cfg, layer).items():
        missing = [t for t in theirs if t not in sd]
        if missing:
            raise VitkitError(f"{source}: DINOv3 checkpoint is missing {missing[0]!r}")
        used.update(theirs)
        out[ours] = torch.cat([sd[t] for t in theirs]) if len(theirs) > 1 else sd[theirs[0]]
    refuse_leftover(source, "DINOv3", sorted(set(sd) - used), "DINOv3ViTModel")
    return {k: v.contiguous() for k, v in out.items()}


def writes_dinov3(cfg: ViTConfig) -> bool:
    """Whether a model is written as Hugging Face's DINOv3 (it has DINOv3's RoPE)."""
    return cfg.rope == "dinov3"


def dinov3_write_refusal(cfg: ViTConfig) -> str | None:
    """Why ``DINOv3ViTModel`` cannot hold ``cfg`` (None when it can)."""
    odd = {
        "a classifier head (DINOv3ViTModel has none; convert with num_classes=0)": cfg.num_classes,
        "pool other than the class token (load it with -o pool=token)": cfg.pool != "token",
        "fc_norm": cfg.fc_norm,
        "representation_size": cfg.representation_size,
        "no layer scale": cfg.layer_scale_init is None,
        "E_pos": cfg.abs_pos_embed,
        "interleaved, (x, y) or offset RoPE": not cfg.rope_half or cfg.rope_xy or cfg.rope_offset,
        "a GELU other than exact or tanh": cfg.mlp == "mlp" and cfg.gelu == "quick",
        "dist_token": cfg.dist_token,
        "norm_pre": cfg.norm_pre,
        "no patch bias": not cfg.patch_bias,
        "qk_norm": cfg.qk_norm,
        "no final norm": not cfg.final_norm,
        "pos_embed_prefix": not cfg.pos_embed_prefix and cfg.abs_pos_embed,
        "class_token": not cfg.has_class_token,
        ", ".join(set(cfg.later_switches) - {"proj_bias"}) or "later switches": (
            set(cfg.later_switches) - {"proj_bias"}
        ),
        "dropout": cfg.dropout,
        ", ".join(eva_only_switches(cfg)) or "timm Eva's switches": eva_only_switches(cfg),
    }
    bad = [k for k, v in odd.items() if v]
    if bad:
        return f"Hugging Face's DINOv3ViTModel cannot hold {'; '.join(bad)}; write timm instead"
    return None


def state_dict_to_dinov3(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit → ``DINOv3ViTModel`` weights (the Hub's naming ``layer.{i}``, which transformers
    5 saves and loads)."""
    why = dinov3_write_refusal(cfg)
    if why:
        raise VitkitError(why)
    out: dict[str, Tensor] = {}
    for ours, theirs in _spec(cfg, "layer").items():
        for k, part in zip(theirs, sd[ours].chunk(len(theirs))):
            out[k] = part.contiguous()
    d = cfg.width
    ref = sd["cls_token"]
    if not cfg.num_reg_tokens:  # (transformers holds an empty parameter)
        out["embeddings.register_tokens"] = ref.new_zeros(1, 0, d)
    out[_MASK] = ref.new_zeros(1, 1, d)
    return out


def vit_to_dinov3_config(cfg: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` of the written ``DINOv3ViTModel``."""
    square = cfg.image_size[0] == cfg.image_size[1] and cfg.patch_size[0] == cfg.patch_size[1]
    gated = cfg.mlp == "swiglu"
    return {
        "architectures": list(CLASSES),
        "model_type": MODEL_TYPES[0],
        "image_size": cfg.image_size[0] if square else list(cfg.image_size),
        "patch_size": cfg.patch_size[0] if square else list(cfg.patch_size),
        "num_channels": cfg.in_chans,
        "hidden_size": cfg.width,
        "intermediate_size": cfg.mlp_dim // 2 if gated else cfg.mlp_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "hidden_act": "silu" if gated else HF_ACT[cfg.gelu],
        "use_gated_mlp": gated,
        "layer_norm_eps": cfg.layer_norm_eps,
        "rope_theta": cfg.rope_theta,
        "query_bias": cfg.qkv_bias,
        "key_bias": cfg.qkv_bias and cfg.k_bias,
        "value_bias": cfg.qkv_bias,
        "proj_bias": cfg.proj_bias,
        "mlp_bias": cfg.proj_bias,
        "layerscale_value": cfg.layer_scale_init,
        "num_register_tokens": cfg.num_reg_tokens,
        "attention_dropout": cfg.attn_dropout,
        # coordinate augmentation in training mode: off (vitkit's RoPE has none)
        "pos_embed_shift": None,
        "pos_embed_jitter": None,
        "pos_embed_rescale": None,
    }
