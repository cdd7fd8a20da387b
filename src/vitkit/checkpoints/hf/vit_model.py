"""Hugging Face ``ViTModel`` / ``ViTForImageClassification`` ↔ vitkit: explicit, pure functions.

Two key namings exist:

- **4.x**: ``[vit.]encoder.layer.{i}.attention.attention.{query,key,value}``,
  ``attention.output.dense``, ``intermediate.dense``, ``output.dense``, ``layernorm_before`` /
  ``layernorm_after``;
- **5.x**: ``[vit.]layers.{i}.attention.{q,k,v,o}_proj``, ``mlp.fc1`` / ``mlp.fc2``, same norms.

Both share ``[vit.]embeddings.{cls_token, position_embeddings, patch_embeddings.projection}``,
``[vit.]layernorm`` and ``classifier`` (ViTForImageClassification) or ``pooler.dense``
(ViTModel). The pooler (dense + tanh on the class token) is exactly the paper's pre-logits layer.

Numerics travel in ``config.json``: ``layer_norm_eps`` (1e-12 in Google's converted checkpoints),
``hidden_act`` (``gelu`` = exact; ``gelu_pytorch_tanh`` / ``gelu_new`` = tanh approximation).
Hugging Face's ViT has no global-average pooling and no pre-logits layer in front of its
classifier; such models cannot be written to it (the error says what to drop instead).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import torch
from torch import Tensor

from vitkit.checkpoints.hf.processor import hf_preprocess as hf_preprocess  # the reader
from vitkit.checkpoints.hf.processor import vit_to_hf_preprocess as vit_to_hf_preprocess
from vitkit.errors import VitkitError
from vitkit.registry.model_config import GeluApprox, ViTConfig

HfNaming = Literal["4", "5"]
ACTIVATIONS: dict[str, GeluApprox] = {
    "gelu": "none",
    "gelu_pytorch_tanh": "tanh",
    "gelu_new": "tanh",
    "gelu_fast": "tanh",
    "quick_gelu": "quick",  # x * sigmoid(1.702 x), OpenAI CLIP's; any config may name it
}
# vitkit's GELU -> the ``hidden_act`` that writes it back exactly
HF_ACT: dict[GeluApprox, str] = {"none": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}

# vitkit name inside block i → (4.x name, 5.x name), without the weight/bias suffix.
BLOCK = {
    "norm1": ("layernorm_before", "layernorm_before"),
    "norm2": ("layernorm_after", "layernorm_after"),
    "attn.proj": ("attention.output.dense", "attention.o_proj"),
    "mlp.fc1": ("intermediate.dense", "mlp.fc1"),
    "mlp.fc2": ("output.dense", "mlp.fc2"),
}
QKV = {
    "4": ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
    "5": ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
}


def hf_naming(sd: dict[str, Tensor]) -> HfNaming:
    if any(re.search(r"(^|\.)encoder\.layer\.\d+\.", k) for k in sd):
        return "4"
    if any(re.search(r"(^|\.)layers\.\d+\.", k) for k in sd):
        return "5"
    raise VitkitError("not a Hugging Face ViT state dict (no encoder.layer.N or layers.N keys)")


def hf_to_vit_config(hf: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """A Hugging Face ``ViTConfig`` dict → :class:`vitkit.registry.model_config.ViTConfig` (heads,
    eps and the GELU variant from the source; head size from ``id2label`` / the weights, see
    :func:`hf_to_state_dict`)."""
    if hf.get("model_type", "vit") != "vit":
        raise VitkitError(f"{source}: model_type {hf.get('model_type')!r} is not 'vit'")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise VitkitError(
            f"{source}: hidden_act {act!r} is not a GELU vitkit knows ({sorted(ACTIVATIONS)})"
        )
    try:
        return ViTConfig(
            image_size=hf.get("image_size", 224),
            patch_size=hf.get("patch_size", 16),
            num_classes=0,
            **encoder_shape(hf),
            pool="token",
            dropout=float(hf.get("hidden_dropout_prob", 0.0)),
            attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.0)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            gelu=ACTIVATIONS[act],
            qkv_bias=bool(hf.get("qkv_bias", True)),
        )
    except (TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"{source}: malformed ViT config ({hf_field_names(str(e))})") from None


# the encoder's shape as every Hugging Face ViT-family config.json names it (vitkit field ->
# key), shared by the class readers' provenance tables (hf_beit, hf_dinov3, hf_siglip2)
ENCODER_FIELDS = {
    "patch_size": "patch_size",
    "in_chans": "num_channels",
    "width": "hidden_size",
    "depth": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "mlp_dim": "intermediate_size",
    "gelu": "hidden_act",
    "layer_norm_eps": "layer_norm_eps",
}


def encoder_shape(hf: dict[str, Any]) -> dict[str, Any]:
    """The encoder's shape from a ViT-family ``config.json`` (ViT-Base where a key is absent,
    the default of ViTConfig, SiglipVisionConfig, Siglip2VisionConfig and BeitConfig)."""
    return {
        "in_chans": hf.get("num_channels", 3),
        "width": hf.get("hidden_size", 768),
        "depth": hf.get("num_hidden_layers", 12),
        "num_heads": hf.get("num_attention_heads", 12),
        "mlp_dim": hf.get("intermediate_size", 3072),
    }


def refuse_leftover(source: str, what: str, leftover: list[str], reads: str) -> None:
    """One line naming the first keys of a ``what`` checkpoint that no rule read."""
    if leftover:
        more = " ..." if len(leftover) > 10 else ""
        raise VitkitError(
            f"{source}: {what} checkpoint keys not understood: {', '.join(leftover[:10])}"
            f"{more} (vitkit reads {reads})"
        )


# vitkit's name of a config field -> Hugging Face's (for errors that name the file's field)
HF_FIELDS = {
    "width": "hidden_size",
    "depth": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "mlp_dim": "intermediate_size",
    "in_chans": "num_channels",
    "dropout": "hidden_dropout_prob",
    "attn_dropout": "attention_probs_dropout_prob",
}


def hf_field_names(message: str) -> str:
    first = message.split(" ", 1)[0]
    return f"{HF_FIELDS[first]}: {message}" if first in HF_FIELDS else message


def hf_to_state_dict(
    sd: dict[str, Tensor], cfg: ViTConfig, hf: dict[str, Any] | None = None
) -> tuple[ViTConfig, dict[str, Tensor]]:
    """Hugging Face weights → ``(cfg, vitkit state dict)``; ``cfg`` gains the head size (from
    ``classifier``) or the pre-logits size (from ``pooler``). Leftover keys are an error."""
    naming = hf_naming(sd)
    src = dict(sd)
    prefix = "vit." if any(k.startswith("vit.") for k in src) else ""
    used: set[str] = set()

    def take(k: str) -> Tensor:
        k = prefix + k
        if k not in src:
            raise VitkitError(f"Hugging Face checkpoint is missing {k!r}")
        used.add(k)
        return src[k]

    layer = "encoder.layer" if naming == "4" else "layers"
    out: dict[str, Tensor] = {
        "cls_token": take("embeddings.cls_token"),
        "pos_embed": take("embeddings.position_embeddings"),
        "patch_embed.proj.weight": take("embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": take("embeddings.patch_embeddings.projection.bias"),
        "norm.weight": take("layernorm.weight"),
        "norm.bias": take("layernorm.bias"),
    }
    if prefix + "embeddings.mask_token" in src:
        used.add(prefix + "embeddings.mask_token")  # only used for masked image modelling

    for i in range(cfg.depth):
        b = f"{layer}.{i}"
        for ours, names in BLOCK.items():
            theirs = names[0 if naming == "4" else 1]
            for leaf in ("weight", "bias"):
                out[f"blocks.{i}.{ours}.{leaf}"] = take(f"{b}.{theirs}.{leaf}")
        q, k, v = QKV[naming]
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([take(f"{b}.{n}.weight") for n in (q, k, v)])
        if cfg.qkv_bias:
            out[f"blocks.{i}.attn.qkv.bias"] = torch.cat([take(f"{b}.{n}.bias") for n in (q, k, v)])
    changes: dict[str, Any] = {}
    if "classifier.weight" in src:
        used.update(("classifier.weight", "classifier.bias"))
        out["head.weight"], out["head.bias"] = src["classifier.weight"], src["classifier.bias"]
        changes["num_classes"] = src["classifier.weight"].shape[0]
    if prefix + "pooler.dense.weight" in src:
        if hf is not None and hf.get("pooler_act", "tanh") != "tanh":
            raise VitkitError(
                f"pooler_act {hf.get('pooler_act')!r}: the paper's pre-logits use tanh"
            )
        out["pre_logits.0.weight"] = take("pooler.dense.weight")
        out["pre_logits.0.bias"] = take("pooler.dense.bias")
        changes["representation_size"] = out["pre_logits.0.weight"].shape[0]
    leftover = sorted(set(src) - used)
    if leftover:
        raise VitkitError(
            f"Hugging Face checkpoint keys not understood: {', '.join(leftover[:10])}"
            f"{' ...' if len(leftover) > 10 else ''} (vitkit reads ViTModel and "
            "ViTForImageClassification)"
        )
    return cfg.replace(**changes), out


def state_dict_to_hf(
    sd: dict[str, Tensor], cfg: ViTConfig, naming: HfNaming = "4"
) -> tuple[str, dict[str, Tensor]]:
    """vitkit → ``(architecture, Hugging Face state dict)``.

    With a head: ``ViTForImageClassification`` (keys under ``vit.``). Without: ``ViTModel``, its
    pooler holding the pre-logits layer if there is one (load it with ``add_pooling_layer=False``
    when there is not). The 4.x naming (default) loads in transformers 4.x and 5.x alike.
    """
    if cfg.pool != "token":
        raise VitkitError(
            "Hugging Face's ViT has no global-average pooling; cannot write a GAP model"
        )
    if cfg.is_hybrid:
        raise VitkitError(
            "Hugging Face's ViT has no ResNet stem and transformers 5 removed ViTHybrid; "
            "write the hybrid as timm or npz"
        )
    other = [k for k in cfg.family_switches if k != "gelu"]  # (hidden_act holds every GELU)
    if other:
        raise VitkitError(f"Hugging Face's ViT cannot hold {', '.join(other)}; write timm instead")
    if cfg.representation_size and cfg.num_classes:
        raise VitkitError(
            "Hugging Face's ViTForImageClassification has no pre-logits layer before its "
            "classifier: write it without the head (--num-classes 0 keeps the pre-logits as "
            "ViTModel's pooler) or drop the pre-logits (--drop-pre-logits, new zero head)"
        )
    arch = "ViTForImageClassification" if cfg.num_classes else "ViTModel"
    prefix = "vit." if cfg.num_classes else ""
    layer = "encoder.layer" if naming == "4" else "layers"
    d = cfg.width
    out: dict[str, Tensor] = {
        "embeddings.cls_token": sd["cls_token"],
        "embeddings.position_embeddings": sd["pos_embed"],
        "embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "layernorm.weight": sd["norm.weight"],
        "layernorm.bias": sd["norm.bias"],
    }
    for i in range(cfg.depth):
        b = f"{layer}.{i}"
        for ours, names in BLOCK.items():
            theirs = names[0 if naming == "4" else 1]
            for leaf in ("weight", "bias"):
                out[f"{b}.{theirs}.{leaf}"] = sd[f"blocks.{i}.{ours}.{leaf}"]
        for j, n in enumerate(QKV[naming]):
            out[f"{b}.{n}.weight"] = sd[f"blocks.{i}.attn.qkv.weight"][j * d : (j + 1) * d]
            if cfg.qkv_bias:
                out[f"{b}.{n}.bias"] = sd[f"blocks.{i}.attn.qkv.bias"][j * d : (j + 1) * d]
    if cfg.representation_size:
        out["pooler.dense.weight"] = sd["pre_logits.0.weight"]
        out["pooler.dense.bias"] = sd["pre_logits.0.bias"]
    out = {prefix + k: v.contiguous() for k, v in out.items()}
    if cfg.num_classes:
        out["classifier.weight"] = sd["head.weight"].contiguous()
        out["classifier.bias"] = sd["head.bias"].contiguous()
    return arch, out


def vit_to_hf_config(
    cfg: ViTConfig, arch: str, class_names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The ``config.json`` of the written Hugging Face model."""
    if cfg.image_size[0] != cfg.image_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
        # HF's ViTConfig accepts pairs, but its position-embedding interpolation assumes squares.
        image_size: Any = list(cfg.image_size)
        patch_size: Any = list(cfg.patch_size)
    else:
        image_size, patch_size = cfg.image_size[0], cfg.patch_size[0]
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": "vit",
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": HF_ACT[cfg.gelu],
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attn_dropout,
        "layer_norm_eps": cfg.layer_norm_eps,
        "image_size": image_size,
        "patch_size": patch_size,
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "encoder_stride": cfg.patch_size[0],
        "pooler_act": "tanh",
        "pooler_output_size": cfg.representation_size or cfg.width,
        **hf_labels(cfg.num_classes, class_names),
    }
    return out


def hf_labels(num_classes: int, class_names: tuple[str, ...] = ()) -> dict[str, Any]:
    """``id2label`` / ``label2id`` of a written ``config.json`` (``LABEL_i`` without names)."""
    names = class_names or tuple(f"LABEL_{i}" for i in range(num_classes))
    return {
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
    }
