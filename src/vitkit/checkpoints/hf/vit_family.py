"""Hugging Face's classes of the ViT family ↔ vitkit: explicit, pure functions.

The class is known from ``config.json`` (``model_type``, then the weights' head):

- ``deit``: ``DeiTModel``, ``DeiTForImageClassification`` and
  ``DeiTForImageClassificationWithTeacher``. The embeddings are [class; distillation; patches]
  + E_pos over all of them. The teacher class's two heads (``cls_classifier``,
  ``distillation_classifier``, logits averaged) are vitkit's ``dist_token`` with ``head`` /
  ``head_dist``. The other two classes never read the distillation token's output, so vitkit
  reads it as one register token (``num_reg_tokens=1`` with E_pos over it: the same
  computation); ``DeiTModel``'s pooler (dense + tanh on the class token) is the pre-logits
  layer, as for ``ViTModel``.
- ``dinov2`` / ``dinov2_with_registers``: ``Dinov2Model`` / ``Dinov2ForImageClassification``
  and the same with registers: layer scale (``layer_scale{1,2}.lambda1``), ``mlp_ratio``,
  SwiGLU (``use_swiglu_ffn``: packed ``mlp.weights_in`` / ``weights_out`` in 4.x, split
  ``gate_proj`` / ``up_proj`` / ``down_proj`` in 5.x), patch 14. The classifier reads the class
  token and the mean patch token concatenated (``pool="token_gap"``). With registers, E_pos is
  added to [class; patches] and the registers are inserted afterwards: vitkit holds that as
  ``pos_embed_prefix=False`` with the class token's E_pos row added into the class token
  (written back as that token and a zero row). ``mask_token`` serves masked training only and
  is dropped.
- ``vit_mae``: ``ViTMAEModel`` / ``ViTMAEForPreTraining``, the encoder: a plain ViT whose E_pos
  is MAE's fixed 2-D sin-cos table, read as ordinary weights; the pixel decoder (``decoder.*``)
  is dropped. vitkit writes that encoder back as ``ViTModel``
  (:mod:`vitkit.checkpoints.hf.vit_model`), not as ViTMAE, whose forward masks and shuffles the
  patches at random.
- ``clip_vision_model``: ``CLIPVisionModel`` / ``CLIPVisionModelWithProjection``: a class
  embedding, no patch bias, ``pre_layrnorm`` (``norm_pre``), quick GELU, and ``post_layernorm``
  on the pooled class token only (``fc_norm`` with ``pool="token"``). The bias-free
  ``visual_projection`` is held as the head with a zero bias, so the model's output is the
  image embedding; a head with a bias cannot be written back as it. timm's CLIP towers (final
  norm on every token) are written with that norm as ``post_layernorm``: the pooled output is
  the same, the last hidden state is then not normalised. A whole ``CLIPModel``
  (``model_type: clip``, as the Hub's OpenAI checkpoints) is read as its vision tower with the
  projection: the text tower (``text_model.*``, ``text_projection``) and ``logit_scale`` are
  dropped.

Reading takes both key namings (transformers 4.x, which the Hub's files use, and 5.x); writing
uses the 4.x naming, which transformers 4.x and 5.x both load. Every tensor is used or dropped
by name above; anything else is an error.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from torch import Tensor

from vitkit.checkpoints.hf.vit_model import (
    ACTIVATIONS,
    BLOCK,
    QKV,
    HfNaming,
    hf_field_names,
    hf_naming,
)
from vitkit.errors import VitkitError
from vitkit.registry.model_config import GeluApprox, ViTConfig

Family = Literal["deit", "dinov2", "dinov2_with_registers", "vit_mae", "clip_vision_model"]
MODEL_TYPES: tuple[str, ...] = (
    "deit",
    "dinov2",
    "dinov2_with_registers",
    "vit_mae",
    "clip_vision_model",
)
_GELU: dict[str, GeluApprox] = {**ACTIVATIONS, "quick_gelu": "quick"}
_HF_GELU = {"none": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}
# The model's own weights sit under this prefix in the classes with a head.
_PREFIX = {
    "deit": "deit.",
    "dinov2": "dinov2.",
    "dinov2_with_registers": "dinov2_with_registers.",
    "vit_mae": "vit.",
    "clip_vision_model": "vision_model.",
}


def is_family(hf: dict[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` is one of the family's classes read here."""
    return hf.get("model_type") in (*MODEL_TYPES, "clip")


def vision_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The config of the image model: a ``CLIPModel``'s ``vision_config``, else ``hf``."""
    if hf.get("model_type") != "clip":
        return hf
    vision = hf.get("vision_config")
    if not isinstance(vision, dict):
        raise VitkitError("a CLIPModel config.json without a vision_config")
    return {**vision, "model_type": "clip_vision_model"}


# ---------------------------------------------------------------------------------------------
# Key layouts


def _block_names(family: str, naming: HfNaming, cfg: ViTConfig) -> tuple[str, dict[str, tuple]]:
    """(layer prefix, vitkit name inside a block -> the Hugging Face name(s) it is made of,
    concatenated along the first axis when several), names without ``.weight`` / ``.bias``."""
    four = naming == "4"
    if family in ("deit", "vit_mae"):
        names: dict[str, tuple[str, ...]] = {o: (t[0 if four else 1],) for o, t in BLOCK.items()}
        names["attn.qkv"] = QKV[naming]
        return ("encoder.layer" if four else "layers"), names
    if family == "clip_vision_model":
        names = {
            "norm1": ("layer_norm1",),
            "norm2": ("layer_norm2",),
            "attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "attn.proj": ("self_attn.out_proj",),
            "mlp.fc1": ("mlp.fc1",),
            "mlp.fc2": ("mlp.fc2",),
        }
        return "encoder.layers", names
    names = {  # dinov2, with or without registers
        "norm1": ("norm1",),
        "norm2": ("norm2",),
        "attn.qkv": QKV[naming],
        "attn.proj": ("attention.output.dense" if four else "attention.o_proj",),
        "mlp.fc1": ("mlp.fc1",),
        "mlp.fc2": ("mlp.fc2",),
    }
    if cfg.mlp == "swiglu":
        names["mlp.fc1"] = ("mlp.weights_in",) if four else ("mlp.gate_proj", "mlp.up_proj")
        names["mlp.fc2"] = ("mlp.weights_out",) if four else ("mlp.down_proj",)
    return "encoder.layer", names


def _spec(family: str, cfg: ViTConfig, naming: HfNaming, prefix: str) -> dict[str, tuple]:
    """Every vitkit key of ``cfg`` -> the Hugging Face key(s) it is made of (several:
    concatenated along the first axis). ``head.bias`` of a CLIP projection is not listed."""
    spec: dict[str, tuple[str, ...]] = {}

    def wb(ours: str, *theirs: str, bias: bool = True) -> None:
        for leaf in ("weight", "bias") if bias else ("weight",):
            spec[f"{ours}.{leaf}"] = tuple(f"{prefix}{t}.{leaf}" for t in theirs)

    e = "embeddings."
    if family == "clip_vision_model":
        spec["cls_token"] = (f"{prefix}{e}class_embedding",)
        spec["pos_embed"] = (f"{prefix}{e}position_embedding.weight",)
        wb("patch_embed.proj", f"{e}patch_embedding", bias=False)
        wb("norm_pre", "pre_layrnorm")
        wb("fc_norm", "post_layernorm")
    else:
        spec["cls_token"] = (f"{prefix}{e}cls_token",)
        spec["pos_embed"] = (f"{prefix}{e}position_embeddings",)
        wb("patch_embed.proj", f"{e}patch_embeddings.projection")
        wb("norm", "layernorm")
    if family == "deit":
        spec["dist_token" if cfg.dist_token else "reg_token"] = (f"{prefix}{e}distillation_token",)
    if family == "dinov2_with_registers":
        spec["reg_token"] = (f"{prefix}{e}register_tokens",)
    layer, names = _block_names(family, naming, cfg)
    for i in range(cfg.depth):
        for ours, theirs in names.items():
            bias = cfg.qkv_bias or ours != "attn.qkv"
            wb(f"blocks.{i}.{ours}", *(f"{layer}.{i}.{t}" for t in theirs), bias=bias)
        if family.startswith("dinov2"):
            for j in (1, 2):
                spec[f"blocks.{i}.ls{j}.gamma"] = (f"{prefix}{layer}.{i}.layer_scale{j}.lambda1",)
    if cfg.representation_size:  # DeiTModel's pooler
        wb("pre_logits.0", "pooler.dense")
    if cfg.num_classes:
        if family == "clip_vision_model":
            spec["head.weight"] = ("visual_projection.weight",)
        elif family == "deit" and cfg.dist_token:
            spec["head.weight"], spec["head.bias"] = (
                ("cls_classifier.weight",),
                ("cls_classifier.bias",),
            )
            spec["head_dist.weight"] = ("distillation_classifier.weight",)
            spec["head_dist.bias"] = ("distillation_classifier.bias",)
        else:
            spec["head.weight"], spec["head.bias"] = ("classifier.weight",), ("classifier.bias",)
    return spec


def _dropped(family: str, key: str, prefix: str) -> bool:
    """Weights the family's classes hold that vitkit's model has no use for (see the module)."""
    if family.startswith("dinov2") and key == f"{prefix}embeddings.mask_token":
        return True
    text = key.startswith(("text_model.", "text_projection.")) or key == "logit_scale"
    if family == "clip_vision_model" and text:
        return True  # a whole CLIPModel's text tower
    return family == "vit_mae" and key.startswith("decoder.")


# ---------------------------------------------------------------------------------------------
# Reading


def _naming(family: str, sd: dict[str, Tensor]) -> HfNaming:
    if family in ("deit", "vit_mae"):
        return hf_naming({k: v for k, v in sd.items() if not k.startswith("decoder.")})
    if family.startswith("dinov2"):
        return "4" if any(".attention.attention.query." in k for k in sd) else "5"
    return "4"  # CLIP's names are the same in both


def _prefix(family: str, sd: dict[str, Tensor]) -> str:
    p = _PREFIX[family]
    return p if any(k.startswith(p) for k in sd) else ""


def _common(hf: dict[str, Any]) -> dict[str, Any]:
    """The ViTConfig fields every family class's config.json holds the same way."""
    act = hf.get(
        "hidden_act", "quick_gelu" if hf.get("model_type") == "clip_vision_model" else "gelu"
    )
    if act not in _GELU:
        raise VitkitError(f"hidden_act {act!r} is not a GELU vitkit knows ({sorted(_GELU)})")
    return dict(
        image_size=hf.get("image_size", 224),
        patch_size=hf.get("patch_size", 16),
        in_chans=hf.get("num_channels", 3),
        width=hf.get("hidden_size", 768),
        depth=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        dropout=float(hf.get("hidden_dropout_prob", 0.0)),
        attn_dropout=float(
            hf.get("attention_probs_dropout_prob", hf.get("attention_dropout", 0.0))
        ),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        gelu=_GELU[act],
        qkv_bias=bool(hf.get("qkv_bias", True)),
        num_classes=0,
    )


def _dinov2_mlp_dim(width: int, mlp_ratio: float, swiglu: bool) -> int:
    """vitkit's ``mlp_dim`` (fc1's output) of a Dinov2 config: SwiGLU keeps two thirds of the
    hidden size rounded up to a multiple of 8, for each of its two packed halves."""
    hidden = int(width * mlp_ratio)
    return 2 * ((int(hidden * 2 / 3) + 7) // 8 * 8) if swiglu else hidden


def family_config(hf: dict[str, Any], sd: dict[str, Tensor]) -> ViTConfig:
    """The :class:`ViTConfig` of a family class's ``config.json`` and weights (the head's
    kind and size come from the weights)."""
    hf = vision_config(hf)
    family = str(hf.get("model_type"))
    if family not in MODEL_TYPES:
        raise VitkitError(f"model_type {family!r} is not a ViT-family class vitkit reads")
    kw = _common(hf)
    p = _prefix(family, sd)
    if family == "deit":
        kw["mlp_dim"] = hf.get("intermediate_size", 3072)
        if "cls_classifier.weight" in sd:
            kw.update(dist_token=True, num_classes=sd["cls_classifier.weight"].shape[0])
        else:  # the distillation token's output is read by nothing: a register
            kw["num_reg_tokens"] = 1
            if "classifier.weight" in sd:
                kw["num_classes"] = sd["classifier.weight"].shape[0]
        if f"{p}pooler.dense.weight" in sd:
            if hf.get("pooler_act", "tanh") != "tanh":
                raise VitkitError(f"pooler_act {hf['pooler_act']!r}: vitkit's pre-logits use tanh")
            kw["representation_size"] = sd[f"{p}pooler.dense.weight"].shape[0]
    elif family.startswith("dinov2"):
        swiglu = bool(hf.get("use_swiglu_ffn", False))
        kw.update(
            mlp_dim=_dinov2_mlp_dim(kw["width"], float(hf.get("mlp_ratio", 4)), swiglu),
            mlp="swiglu" if swiglu else "mlp",
            layer_scale_init=float(hf.get("layerscale_value", 1.0)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-6)),
            patch_size=hf.get("patch_size", 14 if family == "dinov2" else 16),
        )
        if family == "dinov2_with_registers":
            kw.update(num_reg_tokens=hf.get("num_register_tokens", 4), pos_embed_prefix=False)
        if "classifier.weight" in sd:
            kw.update(pool="token_gap", num_classes=sd["classifier.weight"].shape[0])
    elif family == "vit_mae":
        kw["mlp_dim"] = hf.get("intermediate_size", 3072)
    else:  # clip_vision_model
        kw.update(
            mlp_dim=hf.get("intermediate_size", 3072),
            patch_size=hf.get("patch_size", 32),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
            norm_pre=True,
            patch_bias=False,
            fc_norm=True,
        )
        if "visual_projection.weight" in sd:
            kw["num_classes"] = sd["visual_projection.weight"].shape[0]
    try:
        cfg = ViTConfig(**kw)
    except (TypeError, ValueError, VitkitError) as e:
        raise VitkitError(f"malformed {family} config ({hf_field_names(str(e))})") from None
    _check_architecture(hf, family, sd, cfg)
    return cfg


# The classes whose weights tell them apart: (with a head or decoder, without)
_CLASSES = {
    "deit": ("DeiTForImageClassification", "DeiTModel"),
    "dinov2": ("Dinov2ForImageClassification", "Dinov2Model"),
    "dinov2_with_registers": (
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersModel",
    ),
    "vit_mae": ("ViTMAEForPreTraining", "ViTMAEModel"),
    "clip_vision_model": ("CLIPVisionModelWithProjection", "CLIPVisionModel"),
}


def _check_architecture(
    hf: dict[str, Any], family: str, sd: dict[str, Tensor], cfg: ViTConfig
) -> None:
    """A class named in ``architectures`` that the weights are not (a head missing) is an
    error rather than a model read without its head."""
    named = (hf.get("architectures") or [None])[0]
    headed, bare = _CLASSES[family]
    if family == "deit" and cfg.dist_token:
        found = "DeiTForImageClassificationWithTeacher"
    elif family == "vit_mae":
        found = headed if any(k.startswith("decoder.") for k in sd) else bare
    else:
        found = headed if cfg.num_classes else bare
    known = {headed, bare, "DeiTForImageClassificationWithTeacher"}
    if named in known and named != found:
        raise VitkitError(f"config.json names {named} but the weights are a {found}'s")


def family_to_state_dict(
    hf: dict[str, Any], sd: dict[str, Tensor], cfg: ViTConfig
) -> dict[str, Tensor]:
    """A family class's weights → vitkit's, ``cfg`` from :func:`family_config`. Every key is
    used or dropped by name; a leftover or missing one is an error naming it."""
    hf = vision_config(hf)
    family, prefix = str(hf["model_type"]), _prefix(str(hf["model_type"]), sd)
    spec = _spec(family, cfg, _naming(family, sd), prefix)
    out: dict[str, Tensor] = {}
    for ours, theirs in spec.items():
        missing = [k for k in theirs if k not in sd]
        if missing:
            raise VitkitError(f"Hugging Face {family} checkpoint is missing {missing[0]!r}")
        parts = [sd[k] for k in theirs]
        try:
            out[ours] = parts[0] if len(parts) == 1 else torch.cat(parts)
        except RuntimeError:
            shapes = ", ".join(str(tuple(t.shape)) for t in parts)
            raise VitkitError(f"{', '.join(theirs)}: shapes {shapes} do not fit together") from None
    used = {k for theirs in spec.values() for k in theirs}
    leftover = sorted(k for k in sd if k not in used and not _dropped(family, k, prefix))
    if leftover:
        raise VitkitError(
            f"Hugging Face {family} checkpoint keys not understood: {', '.join(leftover[:10])}"
            f"{' ...' if len(leftover) > 10 else ''}"
        )
    d = cfg.width
    if family == "clip_vision_model":
        out["cls_token"] = out["cls_token"].reshape(1, 1, d)
        out["pos_embed"] = out["pos_embed"].reshape(1, -1, d)
        if cfg.num_classes:
            out["head.bias"] = out["head.weight"].new_zeros(cfg.num_classes)
    if family == "dinov2_with_registers":  # the class token's E_pos row goes into the token
        pos = out["pos_embed"]
        out["cls_token"], out["pos_embed"] = out["cls_token"] + pos[:, :1], pos[:, 1:]
    return out


# ---------------------------------------------------------------------------------------------
# Writing


def family_class(cfg: ViTConfig) -> tuple[Family, str]:
    """(model_type, architecture) of the Hugging Face class that computes what ``cfg`` does;
    a one-line error naming what none of them can hold."""
    switches = dict(cfg.family_switches)
    switches.pop("gelu", None)  # every class below writes its GELU as hidden_act
    regs, heads = cfg.num_reg_tokens, bool(cfg.num_classes)
    if cfg.is_hybrid:
        raise VitkitError("Hugging Face's ViT family classes have no ResNet stem")
    if switches.keys() == {"dist_token"}:
        if not heads:
            raise VitkitError(
                "Hugging Face's DeiTModel does not average the class and distillation tokens: "
                "write the distilled model with its heads (DeiTForImageClassificationWithTeacher)"
            )
        return "deit", "DeiTForImageClassificationWithTeacher"
    if switches.keys() == {"num_reg_tokens"} and regs == 1 and cfg.pool == "token":
        if cfg.representation_size and heads:
            raise VitkitError(
                "Hugging Face's DeiTForImageClassification has no pre-logits layer before its "
                "classifier"
            )
        return "deit", "DeiTForImageClassification" if heads else "DeiTModel"
    if "layer_scale_init" in switches:
        dinov2 = {"layer_scale_init", "mlp", "pool"}
        with_regs = dinov2 | {"num_reg_tokens", "pos_embed_prefix"}
        if switches.keys() <= dinov2 and cfg.pos_embed_prefix:
            family: Family = "dinov2"
        elif switches.keys() <= with_regs and regs and not cfg.pos_embed_prefix:
            family = "dinov2_with_registers"
        else:
            raise VitkitError(
                f"Hugging Face's Dinov2 classes cannot hold {', '.join(switches)} together "
                "(Dinov2: layer scale, SwiGLU; with registers: E_pos on the patches only)"
            )
        if cfg.representation_size:
            raise VitkitError("Hugging Face's Dinov2 classes have no pre-logits layer")
        if heads != (cfg.pool == "token_gap"):
            raise VitkitError(
                "Hugging Face's Dinov2ForImageClassification reads the class token and the mean "
                "patch token (pool='token_gap'); Dinov2Model has no head and pools the class token"
            )
        suffix = "ForImageClassification" if heads else "Model"
        name = "Dinov2WithRegisters" if regs else "Dinov2"
        return family, name + suffix
    clip = {"norm_pre", "patch_bias", "fc_norm", "class_token", "gelu"}
    if "norm_pre" in switches and switches.keys() <= clip and cfg.pool == "token":
        if cfg.patch_bias or cfg.representation_size:
            raise VitkitError("Hugging Face's CLIP vision tower has no patch bias or pre-logits")
        return "clip_vision_model", "CLIPVisionModelWithProjection" if heads else "CLIPVisionModel"
    raise VitkitError(
        f"no Hugging Face class holds {', '.join(switches)} (ViT, DeiT, Dinov2 and CLIP's "
        "vision tower are written); write timm instead"
    )


def state_dict_to_family(
    sd: dict[str, Tensor], cfg: ViTConfig
) -> tuple[str, dict[str, Any], dict[str, Tensor]]:
    """vitkit → ``(architecture, config.json, Hugging Face state dict)`` in the 4.x naming."""
    family, arch = family_class(cfg)
    d = cfg.width
    src = dict(sd)
    if family == "clip_vision_model":
        if cfg.image_size[0] != cfg.image_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
            raise VitkitError("Hugging Face's CLIP vision tower takes square images and patches")
        src["cls_token"] = src["cls_token"].reshape(d)
        src["pos_embed"] = src["pos_embed"].reshape(-1, d)
        if not cfg.fc_norm:  # timm's CLIP towers normalise every token; the class token's is
            # the pooled output, which is what post_layernorm computes
            for leaf in ("weight", "bias"):
                src[f"fc_norm.{leaf}"] = src.pop(f"norm.{leaf}")
            cfg = cfg.replace(fc_norm=True)
        if cfg.num_classes:
            if src["head.bias"].any():
                raise VitkitError(
                    "Hugging Face's CLIP visual_projection has no bias; this head's is not zero"
                )
            del src["head.bias"]
    if family == "dinov2_with_registers":
        src["pos_embed"] = torch.cat([src["pos_embed"].new_zeros(1, 1, d), src["pos_embed"]], 1)
    prefix = _PREFIX[family] if (cfg.num_classes or family == "clip_vision_model") else ""
    out: dict[str, Tensor] = {}
    for ours, theirs in _spec(family, cfg, "4", prefix).items():
        for k, part in zip(theirs, src[ours].chunk(len(theirs))):
            out[k] = part.contiguous()
    if family.startswith("dinov2"):  # masked training's token: unused by the model, expected
        out[f"{prefix}embeddings.mask_token"] = src["pos_embed"].new_zeros(1, d)
    return arch, family_hf_config(cfg, family, arch), out


def _dinov2_ratio(cfg: ViTConfig) -> float | int:
    """The ``mlp_ratio`` whose Dinov2 MLP has vitkit's ``mlp_dim``."""
    swiglu = cfg.mlp == "swiglu"
    ratio = (cfg.mlp_dim * 3 / 4 if swiglu else cfg.mlp_dim) / cfg.width
    # transformers 5 types mlp_ratio as an int: an integer that gives the same size first
    for r in (round(ratio), ratio):
        if r > 0 and _dinov2_mlp_dim(cfg.width, r, swiglu) == cfg.mlp_dim:
            if r != round(ratio):
                warnings.warn(
                    f"Dinov2's mlp_ratio for an MLP of {cfg.mlp_dim} at width {cfg.width} is "
                    f"{r:g}; transformers 5 types it as an integer and refuses this config "
                    "(transformers 4 loads it)",
                    stacklevel=4,
                )
            return r
    raise VitkitError(f"no Dinov2 mlp_ratio gives an MLP of {cfg.mlp_dim} at width {cfg.width}")


def family_hf_config(
    cfg: ViTConfig, family: Family, arch: str, class_names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The written class's ``config.json`` (labels are added by the caller)."""
    square = cfg.image_size[0] == cfg.image_size[1] and cfg.patch_size[0] == cfg.patch_size[1]
    image: Any = cfg.image_size[0] if square else list(cfg.image_size)
    patch: Any = cfg.patch_size[0] if square else list(cfg.patch_size)
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": family,
        "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "hidden_act": _HF_GELU[cfg.gelu],
        "layer_norm_eps": cfg.layer_norm_eps,
        "image_size": image,
        "patch_size": patch,
        "num_channels": cfg.in_chans,
    }
    if family == "clip_vision_model":
        out.update(intermediate_size=cfg.mlp_dim, attention_dropout=cfg.attn_dropout)
        out["projection_dim"] = cfg.num_classes or cfg.width
        if cfg.dropout or not cfg.qkv_bias:
            raise VitkitError("Hugging Face's CLIP vision tower has no dropout and q/k/v biases")
        return out
    out.update(
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attn_dropout,
        qkv_bias=cfg.qkv_bias,
    )
    if family == "deit":
        out.update(intermediate_size=cfg.mlp_dim, encoder_stride=cfg.patch_size[0])
        out.update(pooler_act="tanh", pooler_output_size=cfg.representation_size or cfg.width)
    else:
        out.update(
            mlp_ratio=_dinov2_ratio(cfg),
            use_swiglu_ffn=cfg.mlp == "swiglu",
            layerscale_value=cfg.layer_scale_init,
        )
        if family == "dinov2_with_registers":
            out["num_register_tokens"] = cfg.num_reg_tokens
    return out
