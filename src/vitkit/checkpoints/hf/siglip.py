"""Hugging Face SigLIP image towers ↔ vitkit: explicit, pure functions.

``SiglipVisionModel`` (``model_type: siglip_vision_model``) is a ViT without a class token whose
pooled output is big_vision's MAP head (vitkit's ``pool="map"``,
:class:`vitkit.models.map_head.MAPHead`); with ``vision_use_head: false`` it has no head,
and its tokens are what the paper's GAP averages (``pool="gap"``). Keys, with or without a
``vision_model.`` prefix (transformers 4.x saved one):

- ``embeddings.patch_embedding`` (E), ``embeddings.position_embedding.weight`` ([N, D]: E_pos
  of the patches only, there being no prefix token);
- ``encoder.layers.{i}.layer_norm1`` / ``layer_norm2``, ``self_attn.{q,k,v,out}_proj``,
  ``mlp.fc1`` / ``fc2``; ``post_layernorm`` (the final norm);
- ``head.probe`` (the probe), ``head.attention`` (PyTorch's ``nn.MultiheadAttention``:
  ``in_proj_weight`` stacks the query, key and value kernels; ``out_proj``), ``head.layernorm``
  and ``head.mlp.fc1`` / ``fc2``.

A whole SigLIP checkpoint (``SiglipModel``: ``model_type: siglip``, an image and a text tower)
is read for its image tower: the ``text_model.*`` weights and the contrastive ``logit_scale`` /
``logit_bias`` are left out, since vitkit builds image models. Numerics travel in the config:
``hidden_act`` (``gelu_pytorch_tanh``, SigLIP's default, is the tanh GELU) and
``layer_norm_eps`` (1e-6).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vitkit.checkpoints.hf.processor import vit_to_hf_preprocess
from vitkit.checkpoints.hf.vit_model import ACTIVATIONS, HF_ACT, encoder_shape, refuse_leftover
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

MODEL_TYPES = ("siglip_vision_model", "siglip")
_TOWER = "vision_model."
_NOT_THE_IMAGE_TOWER = ("text_model.", "logit_scale", "logit_bias")
# vitkit name inside block i → SigLIP's, without the weight/bias suffix.
_BLOCK = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "attn.proj": "self_attn.out_proj",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_HEAD = {
    "proj": "attention.out_proj",
    "norm": "layernorm",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}


def is_siglip(hf: dict[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is a SigLIP model's."""
    return hf.get("model_type") in MODEL_TYPES


def siglip_to_vit_config(hf: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """A SigLIP (vision) config dict → :class:`vitkit.registry.model_config.ViTConfig` (no class
    token; the MAP head when ``vision_use_head``, else the paper's GAP)."""
    if hf.get("model_type") == "siglip":
        hf = hf.get("vision_config") or {}
        source = f"{source} (vision_config)"
    act = hf.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        known = sorted(ACTIVATIONS)
        raise VitkitError(f"{source}: hidden_act {act!r} is not a GELU vitkit has ({known})")
    try:
        return ViTConfig(
            image_size=hf.get("image_size", 224),
            patch_size=hf.get("patch_size", 16),
            num_classes=0,
            **encoder_shape(hf),
            pool="map" if hf.get("vision_use_head", True) else "gap",
            attn_dropout=float(hf.get("attention_dropout", 0.0)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-6)),
            gelu=ACTIVATIONS[act],
        )
    except (TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"{source}: malformed SigLIP vision config ({e})") from None


def siglip_to_state_dict(
    sd: dict[str, Tensor],
    cfg: ViTConfig,
    source: str,
    reads: str = "SiglipVisionModel and the image tower of SiglipModel",
) -> dict[str, Tensor]:
    """SigLIP weights → vitkit state dict. Keys left over (but a whole SigLIP's text tower)
    and missing keys are errors naming them (``reads``: the classes the error names)."""
    prefix = _TOWER if any(k.startswith(_TOWER) for k in sd) else ""
    src = {k: v for k, v in sd.items() if not k.startswith(_NOT_THE_IMAGE_TOWER)}
    used: set[str] = set()

    def take(k: str) -> Tensor:
        if prefix + k not in src:
            raise VitkitError(f"{source}: SigLIP checkpoint is missing {prefix + k!r}")
        used.add(prefix + k)
        return src[prefix + k]

    d = cfg.width
    out = {
        "patch_embed.proj.weight": take("embeddings.patch_embedding.weight"),
        "patch_embed.proj.bias": take("embeddings.patch_embedding.bias"),
        "pos_embed": take("embeddings.position_embedding.weight").unsqueeze(0),
        "norm.weight": take("post_layernorm.weight"),
        "norm.bias": take("post_layernorm.bias"),
    }
    for i in range(cfg.depth):
        b = f"encoder.layers.{i}"
        for ours, theirs in _BLOCK.items():
            for leaf in ("weight", "bias"):
                out[f"blocks.{i}.{ours}.{leaf}"] = take(f"{b}.{theirs}.{leaf}")
        for leaf in ("weight", "bias"):
            qkv = [take(f"{b}.self_attn.{n}_proj.{leaf}") for n in "qkv"]
            out[f"blocks.{i}.attn.qkv.{leaf}"] = torch.cat(qkv)
    if cfg.pool == "map":
        out["attn_pool.latent"] = take("head.probe")
        in_proj_w, in_proj_b = (
            take("head.attention.in_proj_weight"),
            take("head.attention.in_proj_bias"),
        )
        out["attn_pool.q.weight"], out["attn_pool.kv.weight"] = in_proj_w[:d], in_proj_w[d:]
        out["attn_pool.q.bias"], out["attn_pool.kv.bias"] = in_proj_b[:d], in_proj_b[d:]
        for ours, theirs in _HEAD.items():
            for leaf in ("weight", "bias"):
                out[f"attn_pool.{ours}.{leaf}"] = take(f"head.{theirs}.{leaf}")
    refuse_leftover(source, "SigLIP", sorted(set(src) - used), reads)
    return {k: v.contiguous() for k, v in out.items()}


def writes_siglip(cfg: ViTConfig) -> bool:
    """Whether a model is written as Hugging Face's SigLIP (it has the MAP head)."""
    return cfg.pool == "map"


def state_dict_to_siglip(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit → ``SiglipVisionModel`` weights (transformers 5.x names, no prefix; 4.x reads
    them too)."""
    other = {k: v for k, v in cfg.family_switches.items() if k not in ("pool", "gelu")}
    if other or cfg.is_hybrid or cfg.representation_size:
        what = ", ".join(other) or ("a ResNet stem" if cfg.is_hybrid else "pre-logits")
        raise VitkitError(f"Hugging Face's SigLIP cannot hold {what}; write timm instead")
    if cfg.num_classes:
        raise VitkitError(
            "Hugging Face's SiglipVisionModel has no classifier: write it without the head "
            "(--num-classes 0 keeps the MAP head's features), or write timm"
        )
    if not cfg.qkv_bias:
        raise VitkitError("Hugging Face's SigLIP has q/k/v biases")
    d = cfg.width
    out = {
        "embeddings.patch_embedding.weight": sd["patch_embed.proj.weight"],
        "embeddings.patch_embedding.bias": sd["patch_embed.proj.bias"],
        "embeddings.position_embedding.weight": sd["pos_embed"][0],
        "post_layernorm.weight": sd["norm.weight"],
        "post_layernorm.bias": sd["norm.bias"],
        "head.probe": sd["attn_pool.latent"],
        "head.attention.in_proj_weight": torch.cat(
            [sd["attn_pool.q.weight"], sd["attn_pool.kv.weight"]]
        ),
        "head.attention.in_proj_bias": torch.cat([sd["attn_pool.q.bias"], sd["attn_pool.kv.bias"]]),
    }
    for ours, theirs in _HEAD.items():
        for leaf in ("weight", "bias"):
            out[f"head.{theirs}.{leaf}"] = sd[f"attn_pool.{ours}.{leaf}"]
    for i in range(cfg.depth):
        b = f"encoder.layers.{i}"
        for ours, theirs in _BLOCK.items():
            for leaf in ("weight", "bias"):
                out[f"{b}.{theirs}.{leaf}"] = sd[f"blocks.{i}.{ours}.{leaf}"]
        for leaf in ("weight", "bias"):
            for j, n in enumerate("qkv"):
                out[f"{b}.self_attn.{n}_proj.{leaf}"] = sd[f"blocks.{i}.attn.qkv.{leaf}"][
                    j * d : (j + 1) * d
                ]
    return {k: v.contiguous() for k, v in out.items()}


def vit_to_siglip_config(cfg: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` of the written ``SiglipVisionModel``."""
    if cfg.image_size[0] != cfg.image_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
        raise VitkitError(
            "Hugging Face's SigLIP takes square images and patches; this model has "
            f"{cfg.image_size[0]}x{cfg.image_size[1]} images, {cfg.patch_size} patches"
        )
    return {
        "architectures": ["SiglipVisionModel"],
        "model_type": "siglip_vision_model",
        "hidden_size": cfg.width,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "num_channels": cfg.in_chans,
        "image_size": cfg.image_size[0],
        "patch_size": cfg.patch_size[0],
        "hidden_act": HF_ACT[cfg.gelu],
        "layer_norm_eps": cfg.layer_norm_eps,
        "attention_dropout": cfg.attn_dropout,
        "vision_use_head": True,
    }


def vit_to_siglip_preprocess(p: PreprocessConfig) -> dict[str, Any]:
    """``preprocessor_config.json``: SiglipImageProcessor's when it resizes to the size with no
    crop (SigLIP's own), else the processor that does what ``p`` says
    (:mod:`vitkit.checkpoints.hf.processor`)."""
    out = vit_to_hf_preprocess(p)
    if out["image_processor_type"] == "ViTImageProcessor":
        out["image_processor_type"] = "SiglipImageProcessor"
    return out
