"""The encoder as a backbone for dense tasks: timm's feature API on vitkit's models.

Segmentation, depth and detection heads (DINOv2's and DINOv3's linear probes, DPT, ViTDet)
take patch features from several blocks as spatial maps. This module gives vitkit's
:class:`~vitkit.models.vit.VisionTransformer` the calls such code is written against, with
timm's arguments and outputs exactly (timm's ``vision_transformer.py`` / ``eva.py``):

- :func:`forward_intermediates`: the outputs of chosen blocks (``indices``: an int takes the
  last n blocks, a list takes those blocks, negative from the end, None every block),
  optionally through the final norm (``norm``), as maps [B, D, h, w] (``output_fmt="NCHW"``) or
  token lists [B, h*w, D] (``"NLC"``), the prefix tokens (class, distillation, registers) cut off
  and returned apart on request (``return_prefix_tokens``: (patches, prefix) pairs), with or
  without the final-normed tokens of the whole encoder (``intermediates_only``); ``stop_early``
  skips the blocks after the last one asked for.
- :func:`prune_intermediate_layers`: cut the blocks after the last index (and the final norm,
  the head) away; the features of the kept blocks do not change.
- :class:`FeaturesModel` (``vitkit.create_model(..., features_only=True, out_indices=...)`` and
  ``vitkit.load(..., features_only=True)``): a pruned model whose ``forward`` returns the list
  of maps, with timm's :class:`FeatureInfo` (every block described, ``out_indices`` choosing
  the outputs).

The attention-returning pass the analysis tools use is
:meth:`~vitkit.models.vit.VisionTransformer.forward_with_attentions`, a different call.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from copy import deepcopy
from enum import Enum
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vitkit.errors import VitkitError
from vitkit.models import naflex_packing as naflex
from vitkit.models.scriptable import refuse_script

Indices = int | Sequence[int] | None
FEATURES_KEYS = ("features_only", "out_indices", "output_fmt", "feature_norm", "norm_last")
FORMATS = ("NCHW", "NLC")


def _as_index(i: Any, where: Any) -> int:
    """An int-like block index (Python's, NumPy's or a 0-d integer tensor) as an int."""
    if isinstance(i, bool) or getattr(i, "ndim", 0) != 0:
        raise VitkitError(f"block indices must be ints, got {i!r} in {where!r}")
    try:
        return operator.index(i)
    except TypeError:
        raise VitkitError(f"block indices must be ints, got {i!r} in {where!r}") from None


def take_indices(num_blocks: int, indices: Indices) -> tuple[list[int], int]:
    """timm's ``feature_take_indices``: the absolute block indices asked for and the largest.
    None: every block; an int n: the last n; a list, tuple, NumPy array or tensor: those
    blocks (negative from the end). NumPy integers count as ints."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, (bool, str, bytes)):
        raise VitkitError(f"indices must be an int, a list of ints or None, got {indices!r}")
    if getattr(indices, "ndim", 0) == 0 and not isinstance(indices, Sequence):
        try:
            n = operator.index(indices)
        except TypeError:
            raise VitkitError(
                f"indices must be an int, a list of ints or None, got {indices!r}"
            ) from None
        if not 0 < n <= num_blocks:
            raise VitkitError(
                f"indices={n} asks for the last {n} blocks of {num_blocks} "
                f"(an int must be 1 to {num_blocks}; a list picks blocks)"
            )
        taken = list(range(num_blocks - n, num_blocks))
    else:
        taken = []
        for i in cast(Iterable[Any], indices):
            i = _as_index(i, indices)
            j = num_blocks + i if i < 0 else i
            if not 0 <= j < num_blocks:
                raise VitkitError(
                    f"block index {i} is out of range for {num_blocks} blocks "
                    f"(0 to {num_blocks - 1}, or -{num_blocks} to -1)"
                )
            taken.append(j)
        if not taken:
            raise VitkitError("indices is an empty list: name at least one block")
    return taken, max(taken)


def _check_fmt(output_fmt: str) -> None:
    if output_fmt not in FORMATS:
        raise VitkitError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")


def forward_intermediates(
    model: Any,
    x: Tensor | dict[str, Tensor],
    indices: Indices = None,
    return_prefix_tokens: bool = False,
    norm: bool = False,
    stop_early: bool = False,
    output_fmt: str = "NCHW",
    intermediates_only: bool = False,
    output_dict: bool = False,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
) -> Any:
    """timm's ``forward_intermediates`` on a vitkit ViT (see the module's docstring).

    Returns ``(final_tokens, intermediates)``, or the list alone with ``intermediates_only``.
    ``final_tokens`` is ``forward_features``' [B, T, D]; each intermediate is [B, D, h, w]
    (NCHW) or [B, h*w, D] (NLC), or with ``return_prefix_tokens`` a pair (that, prefix
    [B, prefix tokens, D]) where the model has prefix tokens (as timm's VisionTransformer).
    ``output_dict``: timm's dict instead, ``image_intermediates`` (the maps), with
    ``return_prefix_tokens`` ``image_intermediates_prefix``, unless ``intermediates_only``
    ``image_features``. ``attn_mask``: as ``scaled_dot_product_attention``'s (boolean: True
    attends; float: added to the logits), broadcast to [B, heads, T, T]; ``is_causal``: each
    token attends to itself and the tokens before it.
    A NaFlex batch dict (:func:`vitkit.models.naflex_packing.pack`) gives NLC only, padding
    tokens included (each image has its own grid: no one map shape).
    """
    _check_fmt(output_fmt)
    taken, last = take_indices(len(model.blocks), indices)
    blocks = list(model.blocks)[: last + 1] if stop_early else list(model.blocks)
    prefix = model.cfg.num_prefix_tokens
    grid: tuple[int, int] | None = None
    if isinstance(x, dict):
        if output_fmt == "NCHW":
            raise VitkitError(
                "a NaFlex batch has one patch grid per image: output_fmt='NCHW' has no single "
                "map shape; use output_fmt='NLC' (or pass images [B, C, H, W])"
            )
        if not model.cfg.naflex:
            raise VitkitError("packed patches need a NaFlex model (ViTConfig.naflex)")
        missing = [k for k in ("patches", "patch_coord", "patch_valid") if k not in x]
        if missing:
            raise VitkitError(f"a NaFlex batch needs {', '.join(missing)}")
        tokens = naflex.embed(model, x["patches"], x["patch_coord"])
        mask = naflex.attention_mask(x["patch_valid"].bool(), prefix, tokens.dtype)
        ropes: list[Tensor | None] = [None] * len(blocks)
        biases: list[Tensor | None] = [mask] * len(blocks)
    else:
        grid = model.patch_embed.grid_for((x.shape[-2], x.shape[-1]))
        tokens = model.embed(x)
        ropes, biases = model.rope_for(grid), model.attention_biases(tokens, grid)
    if attn_mask is not None or is_causal:
        extra = logit_mask(attn_mask, is_causal, tokens)
        biases = [extra if b is None else b + extra for b in biases]
    out = []
    for i, (block, rope, bias) in enumerate(zip(blocks, ropes, biases)):
        tokens = run_block(model, block, tokens, rope, bias)
        if i in taken:
            out.append(model.norm(tokens) if norm else tokens)
    prefixes = [y[:, :prefix] for y in out]
    out = [y[:, prefix:] for y in out]
    if grid is not None and output_fmt == "NCHW":
        b, h, w = tokens.shape[0], grid[0], grid[1]
        out = [y.reshape(b, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in out]
    if output_dict:
        named: dict[str, Any] = {"image_intermediates": out}
        if return_prefix_tokens and prefix:
            named["image_intermediates_prefix"] = prefixes
        if not intermediates_only:
            named["image_features"] = model.norm(tokens)
        return named
    result: list[Any] = list(zip(out, prefixes)) if return_prefix_tokens and prefix else out
    if intermediates_only:
        return result
    return model.norm(tokens), result


def logit_mask(attn_mask: Tensor | None, is_causal: bool, tokens: Tensor) -> Tensor:
    """``scaled_dot_product_attention``'s ``attn_mask`` / ``is_causal`` as one additive term on
    the attention logits: a boolean mask's False (and, causal, a later key) the most negative
    number of ``tokens``' dtype, a float mask as it is."""
    t, low = tokens.shape[1], torch.finfo(tokens.dtype).min
    if attn_mask is None:
        bias = tokens.new_zeros(t, t)
    elif attn_mask.dtype == torch.bool:
        bias = tokens.new_zeros(attn_mask.shape).masked_fill(~attn_mask, low)
    else:
        bias = attn_mask.to(tokens.dtype)
    if bias.shape[-2:] != (t, t):
        raise VitkitError(
            f"attn_mask of shape {tuple(bias.shape)} does not end in the {t} x {t} tokens "
            "(prefix tokens included)"
        )
    if is_causal:
        later = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
        bias = bias.masked_fill(later, low)
    return bias


def run_block(model: Any, block: nn.Module, x: Tensor, rope: Any, bias: Any) -> Tensor:
    """One block on ``x``; under ``torch.utils.checkpoint`` where the model's
    ``grad_checkpointing`` is set (timm's ``set_grad_checkpointing``) and gradients flow."""
    args = () if rope is None and bias is None else (rope, bias)
    if getattr(model, "grad_checkpointing", False) and torch.is_grad_enabled():
        out: Tensor = checkpoint(block, x, *args, use_reentrant=False)
        return out
    out = block(x, *args)
    return out


def prune_intermediate_layers(
    model: Any, indices: Indices = 1, prune_norm: bool = False, prune_head: bool = True
) -> list[int]:
    """timm's ``prune_intermediate_layers``: keep the blocks up to the last of ``indices``
    (the config's depth follows), with ``prune_norm`` drop the final norm, with ``prune_head``
    the head, the pooling and ``fc_norm``: the forward then returns every token, as timm's.
    Returns the absolute indices kept, which stay valid on the pruned model (negative ones
    would not)."""
    taken, last = take_indices(len(model.blocks), indices)
    model.blocks = model.blocks[: last + 1]
    kv = model.cfg.kv_heads
    changes: dict[str, Any] = {"depth": last + 1, "kv_heads": kv[: last + 1] if kv else kv}
    cfg = model.cfg
    if prune_norm:
        model.norm = nn.Identity()
        if not cfg.fc_norm:  # with fc_norm the final norm sits after pooling (the head's)
            changes["final_norm"] = False
    if prune_head:
        model.fc_norm, model.pre_logits = nn.Identity(), nn.Identity()
        model.attn_pool = model.head = model.head_dist = None
        changes |= {"num_classes": 0, "representation_size": None, "fc_norm": False}
        # timm's reset_classifier(0, ""): no pooling, so the forward returns every token
        changes |= {"pool": "none", "class_token": cfg.has_class_token}
        if cfg.fc_norm:  # the only norm went with the head
            changes["final_norm"] = False
    # The config follows, so that the pruned model saves and loads as itself; a MAP head has
    # no config without it (pool="map" builds one): such a model is refused when saved.
    model.cfg = cfg.replace(**changes)
    return taken


def reduction(cfg: Any) -> int:
    """Input pixels per feature-map step: the patch (times the hybrid's ResNet stride)."""
    return int(max(cfg.patch_size)) * int(cfg.stem_stride)


def block_feature_info(cfg: Any) -> list[dict[str, Any]]:
    """timm's ``model.feature_info``: per block ``{"module", "num_chs", "reduction"}`` (the
    model as built: pruning keeps the list whole, as timm's does)."""
    r = reduction(cfg)
    return [
        {"module": f"blocks.{i}", "num_chs": cfg.width, "reduction": r} for i in range(cfg.depth)
    ]


OutIndices = int | Sequence[int]
Idx = int | Sequence[int] | None


def _out_tuple(out_indices: OutIndices) -> tuple[int, ...]:
    """timm's reading of ``out_indices``: an int n is the last n (negative), else a tuple."""
    if isinstance(out_indices, bool):
        raise VitkitError(f"out_indices must be an int or a list of ints, got {out_indices!r}")
    if isinstance(out_indices, int):
        return tuple(range(-out_indices, 0))
    return tuple(out_indices)


class FeatureInfo:
    """timm's ``FeatureInfo``: ``info`` describes every feature the model can give (a ViT:
    each block, ``{"module", "num_chs", "reduction", "index"}``), ``out_indices`` (a tuple)
    the ones a features-only model returns.

    ``channels()``, ``reduction()``, ``module_name()``, ``get(key)`` and ``get_dicts()`` give
    the outputs' values in order; with ``idx`` an int (or a list of ints) they give those
    entries of ``info`` instead, the outputs aside; ``fi[i]`` is ``info[i]`` and ``len(fi)``
    ``len(info)``. The dicts are the ones given (``index`` added where absent), as timm's.
    """

    def __init__(self, feature_info: list[dict[str, Any]], out_indices: OutIndices) -> None:
        previous = 1
        for i, d in enumerate(feature_info):
            if not {"module", "num_chs", "reduction"} <= d.keys():
                raise VitkitError(f"feature_info[{i}] needs module, num_chs and reduction: {d}")
            if d["num_chs"] <= 0 or d["reduction"] < previous:
                raise VitkitError(
                    f"feature_info[{i}]: num_chs must be positive and reductions must not "
                    f"shrink, got {d}"
                )
            previous = d["reduction"]
            d.setdefault("index", i)
        self.out_indices = _out_tuple(out_indices)
        self.info = feature_info

    def from_other(self, out_indices: OutIndices) -> FeatureInfo:
        """The same features (copied) with other outputs."""
        return FeatureInfo(deepcopy(self.info), out_indices)

    def _rows(self, idx: Idx) -> list[int]:
        return list(self.out_indices if idx is None else idx)  # type: ignore[arg-type]

    def get(self, key: str, idx: Idx = None) -> Any:
        if idx is None or isinstance(idx, (list, tuple)):
            return [self.info[i][key] for i in self._rows(idx)]
        return self.info[idx][key]  # type: ignore[index]

    def get_dicts(self, keys: Sequence[str] | None = None, idx: Idx = None) -> Any:
        def pick(d: dict[str, Any]) -> dict[str, Any]:
            return d if keys is None else {k: d[k] for k in keys}

        if idx is None or isinstance(idx, (list, tuple)):
            return [pick(self.info[i]) for i in self._rows(idx)]
        return pick(self.info[idx])  # type: ignore[index]

    def channels(self, idx: Idx = None) -> Any:
        return self.get("num_chs", idx)

    def reduction(self, idx: Idx = None) -> Any:
        return self.get("reduction", idx)

    def module_name(self, idx: Idx = None) -> Any:
        return self.get("module", idx)

    def __getitem__(self, item: Any) -> Any:
        return self.info[item]

    def __len__(self) -> int:
        return len(self.info)


class Format(str, Enum):
    """timm's ``Format``: a features-only model's ``output_fmt`` (equal to its string)."""

    NCHW = "NCHW"
    NLC = "NLC"


class FeaturesModel(nn.Module):
    """A features-only model (timm's ``features_only=True``, its ``FeatureGetterNet``): the
    ViT pruned after the last block of ``out_indices`` (head and, unless ``norm``, the final
    norm cut away); ``forward(x)`` returns the list of those blocks' features, maps [B, D, h, w]
    (``output_fmt="NCHW"``) or [B, h*w, D]. ``model`` is the pruned ViT; its state dict keys
    are ``model.<the ViT's keys>``. ``norm_last``: the final norm on the output of the model's
    last block even without ``norm`` (Hugging Face's ``DINOv3ViTBackbone`` does so)."""

    def __init__(
        self,
        model: Any,
        out_indices: Indices = 3,
        output_fmt: str = "NCHW",
        norm: bool = False,
        norm_last: bool = False,
    ) -> None:
        super().__init__()
        _check_fmt(output_fmt)
        if not hasattr(model, "blocks") or not hasattr(model, "patch_embed"):
            raise VitkitError(
                f"features_only takes a Vision Transformer; {type(model).__name__} has no "
                "transformer blocks"
            )
        last = len(model.blocks) - 1
        self.norm_last = norm_last and not norm and last in take_indices(last + 1, out_indices)[0]
        prune_norm = not (norm or self.norm_last)
        self.out_indices = prune_intermediate_layers(model, out_indices, prune_norm=prune_norm)
        self.model = model
        self.output_fmt, self.norm = Format(output_fmt), norm
        info = model.feature_info  # the model's list: every block as built (timm's)
        if isinstance(info, FeatureInfo):
            self.feature_info = info.from_other(self.out_indices)
        else:
            self.feature_info = FeatureInfo(info, self.out_indices)
        if norm:  # (timm: a copy, in case the norm changes the channels)
            self.feature_info = self.feature_info.from_other(self.out_indices)

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """The model's (timm's features-only models carry it too)."""
        return dict(self.model.pretrained_cfg)

    @property
    def default_cfg(self) -> dict[str, Any]:
        return self.pretrained_cfg

    def __prepare_scriptable__(self) -> nn.Module:
        refuse_script("a features-only model (forward_intermediates)")

    def forward(self, x: Tensor) -> list[Tensor]:
        out: list[Tensor] = forward_intermediates(
            self.model,
            x,
            self.out_indices,
            norm=self.norm,
            output_fmt=self.output_fmt.value,
            intermediates_only=True,
        )
        if self.norm_last:  # (per token: the prefix tokens cut off or not, the same)
            i = self.out_indices.index(len(self.model.blocks) - 1)
            if self.output_fmt == "NLC":
                out[i] = self.model.norm(out[i])
            else:
                out[i] = (
                    self.model.norm(out[i].permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
                )
        return out


def pop_features_options(options: dict[str, Any]) -> dict[str, Any] | None:
    """The features-only settings taken out of ``options`` (create_model's, load's keyword
    arguments): None unless ``features_only=True``; out_indices and the rest alone refused."""
    got = {k: options.pop(k) for k in FEATURES_KEYS if k in options}
    if not got.pop("features_only", False):
        if got:
            raise VitkitError(f"{', '.join(sorted(got))} need features_only=True")
        return None
    return got


def features_model(model: nn.Module, options: dict[str, Any]) -> FeaturesModel:
    """``model`` as a :class:`FeaturesModel` with :func:`pop_features_options`' settings."""
    return FeaturesModel(
        model,
        options.get("out_indices", 3),
        options.get("output_fmt", "NCHW"),
        bool(options.get("feature_norm", False)),
        bool(options.get("norm_last", False)),
    )
