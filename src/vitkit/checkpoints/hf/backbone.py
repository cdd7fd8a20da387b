"""Hugging Face's backbone classes (``AutoBackbone``) ↔ vitkit: ``Dinov2Backbone``,
``Dinov2WithRegistersBackbone`` and ``DINOv3ViTBackbone`` (transformers has no ``ViTBackbone``).

A backbone's weights are its model class's (``Dinov2Model``, ``DINOv3ViTModel``: the same keys),
read and written by those converters; what it adds is which features ``forward`` returns, in
``config.json``: ``out_indices`` (stages: 0 the embeddings, i the output of block i - 1),
``apply_layernorm`` (the final norm on each) and ``reshape_hidden_states`` (maps [B, D, h, w]
without the prefix tokens, else token lists). A checkpoint read from a backbone folder keeps them
in ``meta["backbone"]``, as the vitkit settings they are: the block indices, ``norm``,
``output_fmt`` and ``norm_last``. ``vitkit.load(folder, features_only=True)`` then returns
transformers' ``feature_maps`` (:class:`vitkit.models.features.FeaturesModel`), and writing such a
checkpoint as ``hf`` writes the backbone class again (:func:`as_backbone` marks any Dinov2 or
DINOv3 checkpoint so).

``vitkit.load(folder, backbone=True)`` gives transformers' own output instead
(:class:`vitkit.models.hf_backbone.HFBackbone`: ``.feature_maps``, ``.channels``, stage
numbering), for a backbone folder with its settings or for any ViT checkpoint with the class of
its layout. ``out_indices`` given with ``features_only`` are block numbers: on a backbone folder,
where its stage numbering would mean other blocks, that is said in one line, and the folder's
``apply_layernorm`` stays.

Two of transformers' behaviours, kept for ``features_only``: ``DINOv3ViTBackbone`` always
norms the last stage (so ``norm_last``), and ``Dinov2Backbone``'s token lists
(``reshape_hidden_states=False``) keep the class token, which vitkit's feature API returns
apart: such a folder is refused for ``features_only`` unless out_indices are given (its weights
still load; ``backbone=True`` gives them), as is the ``stem`` stage (the embeddings are not a
block's output).
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from typing import Any

from torch import Tensor

from vitkit.checkpoints.hf import dinov3 as hf_dinov3
from vitkit.checkpoints.hf import vit_family as hf_family
from vitkit.checkpoints.hf import vit_model as hf_conv
from vitkit.errors import AssumptionWarning, VitkitError

DINOV2 = ("Dinov2Backbone", "Dinov2WithRegistersBackbone")
DINOV3 = ("DINOv3ViTBackbone",)
CLASSES = (*DINOV2, *DINOV3)


def model_class(arch: str) -> str:
    """The model class whose weights a backbone class holds."""
    return arch.replace("Backbone", "Model")


def is_backbone(hf: dict[str, Any]) -> bool:
    return any(a in CLASSES for a in hf.get("architectures") or [])


def as_model_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The backbone's config.json as its model class's (what the weight converters read)."""
    return {**hf, "architectures": [model_class(a) for a in hf.get("architectures") or []]}


def backbone_meta(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """``meta["backbone"]`` of a backbone folder's ``config.json``: the class, transformers'
    ``out_indices`` / ``apply_layernorm`` / ``reshape_hidden_states`` (defaults where absent:
    the last stage, True, True) and vitkit's settings for them (``indices``: blocks, ``norm``,
    ``output_fmt``, ``norm_last``), or ``refused``: why features_only cannot give them."""
    arch = next(a for a in hf["architectures"] if a in CLASSES)
    depth = hf.get("num_hidden_layers")
    if not isinstance(depth, int) or depth < 1:
        raise VitkitError(f"{source}: num_hidden_layers must be a positive integer")
    stages = ["stem", *(f"stage{i}" for i in range(1, depth + 1))]
    out = hf.get("out_indices")
    if out is None and hf.get("out_features") is not None:
        names = hf["out_features"]
        bad = [n for n in names if n not in stages]
        if bad:
            raise VitkitError(f"{source}: out_features names {bad[0]!r}, not one of {stages}")
        out = [stages.index(n) for n in names]
    out = [depth] if out is None else out
    if not isinstance(out, list) or not all(isinstance(i, int) for i in out):
        raise VitkitError(f"{source}: out_indices must be a list of stage numbers, got {out!r}")
    stage = [i + depth + 1 if i < 0 else i for i in out]
    if any(not 0 <= i <= depth for i in stage):
        raise VitkitError(f"{source}: out_indices {out} has a stage outside 0 to {depth}")
    norm = bool(hf.get("apply_layernorm", True))
    reshape = bool(hf.get("reshape_hidden_states", True))
    meta: dict[str, Any] = {
        "class": arch,
        "given_out_indices": list(out),  # (as the file says them: transformers keeps them so)
        "out_indices": stage,
        "apply_layernorm": norm,
        "reshape_hidden_states": reshape,
        "indices": [i - 1 for i in stage],
        "norm": norm,
        "output_fmt": "NCHW" if reshape else "NLC",
        "norm_last": arch in DINOV3 and depth in stage,
        "return_class_token": bool(hf.get("return_class_token", False)),
    }
    if 0 in stage:
        meta["refused"] = "its out_indices ask for the stem (stage 0), the embeddings"
    elif arch in DINOV2 and not reshape:
        meta["refused"] = "reshape_hidden_states=False keeps the class token in each output"
    return meta


def features_options(meta: dict[str, Any], options: dict[str, Any], source: str) -> None:
    """Fill ``options`` (features_only's, from load) from a backbone's ``meta`` where not given.
    Chosen ``out_indices`` are block numbers (timm's): where a backbone folder's stage numbers
    (transformers') would pick other blocks, that is said in one line; the folder's
    ``apply_layernorm`` (and its output format) stay unless given."""
    b = meta.get("backbone")
    if not b:
        return
    if "out_indices" not in options:
        if "refused" in b:
            raise VitkitError(
                f"{source}: {b['class']}'s features are not the feature API's: {b['refused']}; "
                "pass out_indices= (block numbers) to choose others, or load with "
                "backbone=True for transformers' outputs"
            )
        options["out_indices"] = b["indices"]
    else:
        _say_numbering(b, options["out_indices"], source)
    options.setdefault("feature_norm", b["norm"])
    options.setdefault("norm_last", b["norm_last"])
    if b["class"] in DINOV3 or b["reshape_hidden_states"]:  # (Dinov2's token lists keep the
        options.setdefault("output_fmt", b["output_fmt"])  # class token: not the API's NLC)


def _say_numbering(b: dict[str, Any], chosen: Any, source: str) -> None:
    """One line where ``chosen`` read as transformers' stages would be other blocks (an int
    counts blocks from the end, and negative numbers name the same blocks in both)."""
    if isinstance(chosen, (int, str)) or not hasattr(chosen, "__iter__"):
        return
    try:  # (NumPy arrays and integers too; what is not indices, take_indices refuses)
        given = [operator.index(i) for i in chosen]
    except TypeError:
        return
    if all(i < 0 for i in given):
        return
    as_stages = ["the embeddings" if i == 0 else str(i - 1 if i > 0 else i) for i in given]
    warnings.warn(
        f"{source}: out_indices={given} are block numbers here (timm's); read as "
        f"{b['class']}'s stages (0: the embeddings) they would be blocks "
        f"[{', '.join(as_stages)}]: pass those, or load with backbone=True for transformers' "
        "numbering and outputs",
        AssumptionWarning,
        stacklevel=4,
    )


BACKBONE_OPTIONS = ("out_features", "apply_layernorm", "reshape_hidden_states")


def pop_backbone_options(options: dict[str, Any]) -> dict[str, Any] | None:
    """``backbone=True`` and transformers' settings (``out_indices`` in its stage numbering,
    ``out_features``, ``apply_layernorm``, ``reshape_hidden_states``) taken out of load's
    keyword arguments; None without ``backbone=True``."""
    if not options.pop("backbone", False):
        given = [k for k in BACKBONE_OPTIONS if k in options]
        if given:
            raise VitkitError(f"{', '.join(given)} need backbone=True (transformers' backbone)")
        return None
    if "features_only" in options:
        raise VitkitError("backbone=True and features_only=True are two outputs: choose one")
    return {k: options.pop(k) for k in ("out_indices", *BACKBONE_OPTIONS) if k in options}


def backbone_model(model: Any, meta: dict[str, Any], options: dict[str, Any]) -> Any:
    """``model`` as transformers' backbone class: the folder's (``meta["backbone"]``) with its
    settings, or for any other checkpoint the Dinov2 / DINOv3 class of its layout; the
    ``options`` of :func:`pop_backbone_options` over them."""
    from vitkit.models.hf_backbone import HFBackbone

    given = "out_indices" in options or "out_features" in options
    cls, settings = backbone_settings(meta, model.cfg, given)
    return HFBackbone(model, cls, **{**settings, **options})


def backbone_settings(
    meta: dict[str, Any], cfg: Any, stages_given: bool = False
) -> tuple[str, dict[str, Any]]:
    """The backbone class and its settings: a backbone folder's (``meta["backbone"]``; its
    stages unless ``stages_given``), else the Dinov2 / DINOv3 class of the layout, defaults."""
    b = meta.get("backbone")
    if not b:
        return DINOV3[0] if cfg.rope == "dinov3" else DINOV2[1 if cfg.num_reg_tokens else 0], {}
    settings: dict[str, Any] = {
        "apply_layernorm": b["apply_layernorm"],
        "reshape_hidden_states": b["reshape_hidden_states"],
        "return_class_token": b.get("return_class_token", False),
    }
    if not stages_given:
        settings["out_indices"] = b.get("given_out_indices", b["out_indices"])
    return b["class"], settings


def as_backbone(
    ckpt: Any,
    out_indices: list[int] | None = None,
    apply_layernorm: bool = True,
    reshape_hidden_states: bool = True,
) -> Any:
    """``ckpt`` (a Dinov2 or DINOv3 layout) marked to be written as its Hugging Face backbone
    class: ``out_indices`` are transformers' stages (i: block i - 1's output; default the
    last)."""
    cfg = ckpt.model_config
    arch = DINOV3[0] if cfg.rope == "dinov3" else DINOV2[1 if cfg.num_reg_tokens else 0]
    hf = {
        "architectures": [arch],
        "num_hidden_layers": cfg.depth,
        "out_indices": list(out_indices) if out_indices is not None else [cfg.depth],
        "apply_layernorm": apply_layernorm,
        "reshape_hidden_states": reshape_hidden_states,
    }
    meta = {**ckpt.meta, "backbone": backbone_meta(hf, "as_backbone")}
    return dataclasses.replace(ckpt, meta=meta)


def to_backbone(
    arch: str, hub: dict[str, Any], sd: dict[str, Tensor], meta: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The written model class (``arch``, its ``config.json`` ``hub`` and weights ``sd``) as
    the backbone ``meta["backbone"]`` names."""
    b = meta["backbone"]
    if model_class(b["class"]) != arch:
        raise VitkitError(
            f"a {b['class']} holds {model_class(b['class'])}'s layout; this model is written as "
            f"{arch} (a headless Dinov2 or DINOv3 layout is: num_classes=0)"
        )
    depth = hub["num_hidden_layers"]
    stages = ["stem", *(f"stage{i}" for i in range(1, depth + 1))]
    hub = {
        **hub,
        "architectures": [b["class"]],
        "stage_names": stages,
        "out_indices": b["out_indices"],
        "out_features": [stages[i] for i in b["out_indices"]],
        "apply_layernorm": b["apply_layernorm"],
        "reshape_hidden_states": b["reshape_hidden_states"],
    }
    return hub, sd


def backbone_files(ckpt: Any) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The JSON files and weights of ``ckpt`` (with ``meta["backbone"]``) as its backbone class."""
    cfg, sd = ckpt.model_config, ckpt.state_dict
    if hf_dinov3.writes_dinov3(cfg):
        arch = "DINOv3ViTModel"
        hub, hsd = hf_dinov3.vit_to_dinov3_config(cfg), hf_dinov3.state_dict_to_dinov3(sd, cfg)
    else:
        try:
            arch, hub, hsd = hf_family.state_dict_to_family(sd, cfg)
        except VitkitError as e:
            cls = ckpt.meta["backbone"]["class"]
            msg = f"a {cls} holds {model_class(cls)}'s layout, not this model's: {e}"
            raise VitkitError(msg) from None
    hub, hsd = to_backbone(arch, hub, hsd, ckpt.meta)
    pre = hf_conv.vit_to_hf_preprocess(ckpt.preprocess)
    return {"config.json": hub, "preprocessor_config.json": pre}, hsd
