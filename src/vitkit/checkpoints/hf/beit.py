"""Hugging Face's BEiT (``BeitModel``, ``BeitForImageClassification``; ``model_type: beit``) ↔
vitkit: pure functions.

transformers' BEiT is timm's (:mod:`vitkit.checkpoints.timm.beit_relpos`,
:mod:`vitkit.models.relpos`) under other names: a class token; q and v biases, none on the key
(``k_bias=False``); layer scale ``lambda_1`` / ``lambda_2`` when ``layer_scale_init_value > 0``; a
learned relative position bias table per layer (``use_relative_position_bias``: ``rel_pos="bias"``)
or one shared by all layers (``use_shared_relative_position_bias``: ``rel_pos_shared``), both with
BEiT's 3 class-token rows last; E_pos over [class; patches] with
``use_absolute_position_embeddings``. Pooling: ``use_mean_pooling`` is the mean of the patch tokens
then ``pooler.layernorm`` (``pool="gap"``, ``fc_norm``; the encoder's final norm is then an
identity), else the final ``layernorm`` and the class token. transformers resamples the bias table
for every input; at the model's own grid that is the identity, and another grid is refused by
vitkit's table (:mod:`vitkit.models.relpos`).

Keys: transformers 5 saves the 4.x naming, ``[beit.]embeddings.{cls_token, position_embeddings,
patch_embeddings.projection}``, ``[beit.]encoder.layer.{i}.attention.attention.{query, key,
value}``, ``attention.output.dense``, ``intermediate.dense``, ``output.dense``,
``layernorm_before`` / ``layernorm_after``, ``lambda_1`` / ``lambda_2``,
``attention.attention.relative_position_bias.relative_position_bias_table``,
``[beit.]encoder.relative_position_bias.*`` (shared), ``[beit.]layernorm``,
``[beit.]pooler.layernorm``, ``classifier``; its own module names (``layers.{i}.attention.
{q,k,v,o}_proj``, ``mlp.fc1`` / ``fc2``, ``shared_position_bias``) are read too. Dropped:
``mask_token`` (masked image modelling) and stored ``relative_position_index`` buffers (the
index is computed, as transformers does).
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from vitkit.checkpoints.hf.vit_model import (
    ACTIVATIONS,
    ENCODER_FIELDS,
    HF_ACT,
    encoder_shape,
    refuse_leftover,
)
from vitkit.errors import VitkitError
from vitkit.registry.config_checks import eva_only_switches
from vitkit.registry.model_config import ViTConfig

MODEL_TYPES = ("beit",)
CLASSES = ("BeitModel", "BeitForImageClassification")
FIELDS = {
    "image_size": "image_size",
    **ENCODER_FIELDS,
    "dropout": "hidden_dropout_prob",
    "attn_dropout": "attention_probs_dropout_prob",
    "drop_path": "drop_path_rate",
    "pool": "use_mean_pooling",
    "fc_norm": "use_mean_pooling",
    "abs_pos_embed": "use_absolute_position_embeddings",
    "rel_pos": "use_relative_position_bias",
    "rel_pos_shared": "use_shared_relative_position_bias",
    "layer_scale_init": "layer_scale_init_value",
    **dict.fromkeys(["qkv_bias", "k_bias", "class_token"]),  # fixed by the class (no key)
}
_TABLE = "relative_position_bias.relative_position_bias_table"
# transformers 5's module names -> the 4.x names it saves
_FIVE = (
    (r"(^|\.)layers\.(\d+)\.attention\.q_proj\.", r"\1encoder.layer.\2.attention.attention.query."),
    (r"(^|\.)layers\.(\d+)\.attention\.k_proj\.", r"\1encoder.layer.\2.attention.attention.key."),
    (r"(^|\.)layers\.(\d+)\.attention\.v_proj\.", r"\1encoder.layer.\2.attention.attention.value."),
    (r"(^|\.)layers\.(\d+)\.attention\.o_proj\.", r"\1encoder.layer.\2.attention.output.dense."),
    (r"(^|\.)layers\.(\d+)\.mlp\.fc1\.", r"\1encoder.layer.\2.intermediate.dense."),
    (r"(^|\.)layers\.(\d+)\.mlp\.fc2\.", r"\1encoder.layer.\2.output.dense."),
    (rf"(^|\.)layers\.(\d+)\.{_TABLE}$", rf"\1encoder.layer.\2.attention.attention.{_TABLE}"),
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
    (r"(^|\.)shared_position_bias\.", r"\1encoder.relative_position_bias."),
)


def is_beit(hf: dict[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is a BEiT's."""
    return hf.get("model_type") in MODEL_TYPES


def beit_to_vit_config(hf: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """A ``BeitConfig`` dict → :class:`ViTConfig` (absent keys: the class's defaults; the head
    and the pooler's norm come from the weights, :func:`beit_to_state_dict`)."""
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise VitkitError(f"{source}: hidden_act {act!r} is not a GELU vitkit has")
    patch = hf.get("patch_size", 16)
    if not isinstance(patch, int) or isinstance(patch, bool):
        raise VitkitError(f"{source}: patch_size={patch!r}: transformers' BEiT needs an int")
    own, shared = (
        hf.get("use_relative_position_bias", False),
        hf.get("use_shared_relative_position_bias", False),
    )
    if own and shared:
        raise VitkitError(
            f"{source}: a relative position bias per layer and a shared one, added: vitkit's "
            "model has one or the other"
        )
    mean = bool(hf.get("use_mean_pooling", True))
    size = hf.get("image_size", 224)
    scale = float(hf.get("layer_scale_init_value", 0.1))
    try:
        return ViTConfig(
            image_size=tuple(size) if isinstance(size, list) else size,
            patch_size=(patch, patch),
            num_classes=0,
            **encoder_shape(hf),
            pool="gap" if mean else "token",
            class_token=True,
            fc_norm=mean,
            dropout=float(hf.get("hidden_dropout_prob", 0.0)),
            attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.0)),
            drop_path=float(hf.get("drop_path_rate", 0.1)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            gelu=ACTIVATIONS[act],
            k_bias=False,
            layer_scale_init=scale if scale > 0 else None,
            abs_pos_embed=bool(hf.get("use_absolute_position_embeddings", False)),
            rel_pos="bias" if own or shared else "none",
            rel_pos_shared=bool(shared),
        )
    except (TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"{source}: malformed BEiT config ({e})") from None


def _spec(cfg: ViTConfig, p: str) -> dict[str, str]:
    """Every vitkit key → its Hugging Face key (4.x naming, model prefix ``p``); q / k / v
    are listed as ``attn.qkv.weight.{q,k,v}`` and joined by the caller."""
    e = f"{p}embeddings."
    spec = {
        "cls_token": f"{e}cls_token",
        "patch_embed.proj.weight": f"{e}patch_embeddings.projection.weight",
        "patch_embed.proj.bias": f"{e}patch_embeddings.projection.bias",
    }
    if cfg.abs_pos_embed:
        spec["pos_embed"] = f"{e}position_embeddings"
    if cfg.rel_pos_shared:
        spec["shared_rel_pos.relative_position_bias_table"] = f"{p}encoder.{_TABLE}"
    names = {
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
        "attn.proj": "attention.output.dense",
        "mlp.fc1": "intermediate.dense",
        "mlp.fc2": "output.dense",
    }
    for i in range(cfg.depth):
        b, ours = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        for o, t in names.items():
            spec[f"{ours}{o}.weight"], spec[f"{ours}{o}.bias"] = f"{b}{t}.weight", f"{b}{t}.bias"
        for n, t in zip("qkv", ("query", "key", "value")):
            spec[f"{ours}attn.qkv.weight.{n}"] = f"{b}attention.attention.{t}.weight"
        spec[f"{ours}attn.q_bias"] = f"{b}attention.attention.query.bias"
        spec[f"{ours}attn.v_bias"] = f"{b}attention.attention.value.bias"
        if cfg.layer_scale_init is not None:
            spec[f"{ours}ls1.gamma"], spec[f"{ours}ls2.gamma"] = f"{b}lambda_1", f"{b}lambda_2"
        if cfg.rel_pos == "bias" and not cfg.rel_pos_shared:
            spec[f"{ours}attn.rel_pos.relative_position_bias_table"] = (
                f"{b}attention.attention.{_TABLE}"
            )
    if cfg.fc_norm:
        spec["fc_norm.weight"], spec["fc_norm.bias"] = (
            f"{p}pooler.layernorm.weight",
            (f"{p}pooler.layernorm.bias"),
        )
    elif cfg.final_norm:
        spec["norm.weight"], spec["norm.bias"] = f"{p}layernorm.weight", f"{p}layernorm.bias"
    if cfg.num_classes:
        spec["head.weight"], spec["head.bias"] = "classifier.weight", "classifier.bias"
    return spec


def _four(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keys in the 4.x naming (transformers 5's module names renamed)."""
    out = {}
    for k, v in sd.items():
        for pattern, repl in _FIVE:
            k, n = re.subn(pattern, repl, k)
            if n:
                break
        out[k] = v
    return out


def beit_to_state_dict(
    sd: dict[str, Tensor], cfg: ViTConfig, source: str
) -> tuple[ViTConfig, dict[str, Tensor]]:
    """BEiT weights → ``(cfg, vitkit state dict)``; ``cfg`` gains the head (``classifier``) and
    loses the pooler's norm where the weights have none (``add_pooling_layer=False``)."""
    import torch

    sd = _four(sd)
    p = "beit." if any(k.startswith("beit.") for k in sd) else ""
    if "classifier.weight" in sd:
        cfg = cfg.replace(num_classes=int(sd["classifier.weight"].shape[0]))
    if cfg.fc_norm and f"{p}pooler.layernorm.weight" not in sd:  # no pooler: tokens unnormed
        cfg = cfg.replace(fc_norm=False, final_norm=False)
    used = {k for k in sd if k.endswith("relative_position_index")}
    used.add(f"{p}embeddings.mask_token")
    out: dict[str, Tensor] = {}
    for ours, theirs in _spec(cfg, p).items():
        if theirs not in sd:
            raise VitkitError(f"{source}: BEiT checkpoint is missing {theirs!r}")
        used.add(theirs)
        out[ours] = sd[theirs]
    for i in range(cfg.depth):
        w = f"blocks.{i}.attn.qkv.weight"
        out[w] = torch.cat([out.pop(f"{w}.{n}") for n in "qkv"])
    refuse_leftover(source, "BEiT", sorted(set(sd) - used), "BeitModel and " + CLASSES[1])
    return cfg, {k: v.contiguous() for k, v in out.items()}


def writes_beit(cfg: ViTConfig) -> bool:
    """Whether a model is written as Hugging Face's BEiT (a relative position bias table, or
    q / v biases without the key's)."""
    plain = cfg.rope == "none" and not cfg.naflex
    return plain and (cfg.rel_pos == "bias" or (cfg.qkv_bias and not cfg.k_bias))


def beit_write_refusal(cfg: ViTConfig) -> str | None:
    """Why transformers' BEiT cannot hold ``cfg`` (None when it can)."""
    mean = cfg.pool == "gap" and cfg.fc_norm
    odd = {
        "a pooling other than the class token or the normed mean": not (
            mean or (cfg.pool == "token" and not cfg.fc_norm)
        ),
        "no class token": not cfg.has_class_token,
        "a key bias, or no q / v biases": cfg.k_bias or not cfg.qkv_bias,
        "an MLP relative position bias": cfg.rel_pos not in ("none", "bias"),
        "E_pos on the patches only": cfg.abs_pos_embed and not cfg.pos_embed_prefix,
        "a quick GELU": cfg.gelu == "quick",
        "no final norm": not cfg.final_norm,
        "representation_size": cfg.representation_size,
        "non-square patches": cfg.patch_size[0] != cfg.patch_size[1],
        "registers, dist_token, norm_pre, qk_norm, no patch bias, SwiGLU": (
            cfg.num_reg_tokens
            or cfg.dist_token
            or cfg.norm_pre
            or cfg.qk_norm
            or not cfg.patch_bias
            or cfg.mlp != "mlp"
        ),
        ", ".join(cfg.later_switches) or "later switches": set(cfg.later_switches),
        "parallel blocks": cfg.parallel > 1 or cfg.parallel_scaling or cfg.diff_attn,
        "a ResNet stem": cfg.is_hybrid,
        ", ".join(eva_only_switches(cfg)) or "timm Eva's switches": eva_only_switches(cfg),
    }
    bad = [k for k, v in odd.items() if v]
    if bad:
        return f"Hugging Face's BEiT cannot hold {'; '.join(bad)}; write timm instead"
    return None


def state_dict_to_beit(sd: dict[str, Tensor], cfg: ViTConfig) -> tuple[str, dict[str, Tensor]]:
    """vitkit → (class, BEiT weights in the 4.x naming, which transformers 5 saves)."""
    why = beit_write_refusal(cfg)
    if why:
        raise VitkitError(why)
    arch = "BeitForImageClassification" if cfg.num_classes else "BeitModel"
    p = "beit." if cfg.num_classes else ""
    src = dict(sd)
    for i in range(cfg.depth):
        q, k, v = src.pop(f"blocks.{i}.attn.qkv.weight").chunk(3)
        for n, t in zip("qkv", (q, k, v)):
            src[f"blocks.{i}.attn.qkv.weight.{n}"] = t
    return arch, {theirs: src[ours].contiguous() for ours, theirs in _spec(cfg, p).items()}


def vit_to_beit_config(cfg: ViTConfig, arch: str) -> dict[str, Any]:
    """The ``config.json`` of the written class (labels are added by the caller)."""
    h, w = cfg.image_size
    return {
        "architectures": [arch],
        "model_type": "beit",
        "image_size": h if h == w else [h, w],
        "patch_size": cfg.patch_size[0],
        "num_channels": cfg.in_chans,
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": HF_ACT[cfg.gelu],
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attn_dropout,
        "drop_path_rate": cfg.drop_path,
        "use_mask_token": False,
        "use_absolute_position_embeddings": cfg.abs_pos_embed,
        "use_relative_position_bias": cfg.rel_pos == "bias" and not cfg.rel_pos_shared,
        "use_shared_relative_position_bias": cfg.rel_pos == "bias" and cfg.rel_pos_shared,
        "layer_scale_init_value": cfg.layer_scale_init or 0.0,
        "use_mean_pooling": cfg.pool == "gap",
    }
