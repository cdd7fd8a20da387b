"""transformers' model interface on a ViT that ``vitkit.load`` read from a transformers folder.

The rule, stated once: a model read from a transformers folder answers a call **as that
folder's class** when the call passes ``pixel_values=`` or any of transformers' keywords
(``output_hidden_states``, ``output_attentions``, ``interpolate_pos_encoding``, ``return_dict``,
``labels``); called with the pixels alone, ``model(x)``, it answers as every vitkit model does
(the logits, or a headless model's pooled features), so code written for vitkit, timm or the
CLI meets no change. Every other method and attribute is vitkit's and timm's.

What the classes give, as transformers 5.23 gives it:

- ``ViTModel`` / ``DeiTModel``: ``BaseModelOutputWithPooling``: ``last_hidden_state`` (every
  token through the final norm), ``pooler_output`` (the pooler, tanh of a dense layer on the
  class token; None where the folder has none);
- ``Dinov2Model``, ``Dinov2WithRegistersModel``, ``DINOv3ViTModel``: the same, the pooler output
  being the normed class token;
- ``*ForImageClassification``: ``ImageClassifierOutput``: ``logits`` (``loss`` with ``labels``,
  by the config's ``problem_type`` or as transformers infers it);
  ``DeiTForImageClassificationWithTeacher``: ``logits``, ``cls_logits``, ``distillation_logits``;
- the backbone classes (``Dinov2Backbone``, ``Dinov2WithRegistersBackbone``,
  ``DINOv3ViTBackbone``): their ``BackboneOutput`` with the folder's stages
  (:class:`vitkit.models.hf_backbone.HFBackbone`), and ``channels``, ``out_features``,
  ``out_indices``, ``stage_names``, ``out_feature_channels``.

``output_hidden_states``: the embeddings and every block's output (before the final norm);
``output_attentions``: every block's attention weights (the explicit-softmax path);
``return_dict=False``: the tuple of the fields set. ViT's and DeiT's classes refuse another
input size unless ``interpolate_pos_encoding=True`` (E_pos is then resampled with the class's
own kernel, :mod:`vitkit.checkpoints.posemb_kernels`); Dinov2's always resample, DINOv3's rotary
embeddings fit any size. ``.config`` is the folder's ``config.json`` as transformers reads it
(attributes, ``id2label`` with integer keys, ``num_labels``, ``to_dict()``), its size and labels
those of the model as loaded. Other classes vitkit reads (CLIP, SigLIP, BEiT, ViTMAE, SigLIP 2)
refuse transformers' keywords in one line: their outputs are not these.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.models import features
from vitkit.models.hf_backbone import HFBackbone, ModelOutput
from vitkit.models.vit import VisionTransformer

KEYWORDS = (
    "output_hidden_states",
    "output_attentions",
    "interpolate_pos_encoding",
    "return_dict",
    "labels",
)
# transformers class -> what it returns: "pooler" (the class's dense + tanh pooler), "cls" (the
# normed class token), "logits", "teacher" (DeiT's two heads), "backbone"
CLASSES = {
    "ViTModel": "pooler",
    "DeiTModel": "pooler",
    "Dinov2Model": "cls",
    "Dinov2WithRegistersModel": "cls",
    "DINOv3ViTModel": "cls",
    "ViTForImageClassification": "logits",
    "DeiTForImageClassification": "logits",
    "Dinov2ForImageClassification": "logits",
    "Dinov2WithRegistersForImageClassification": "logits",
    "DeiTForImageClassificationWithTeacher": "teacher",
    "Dinov2Backbone": "backbone",
    "Dinov2WithRegistersBackbone": "backbone",
    "DINOv3ViTBackbone": "backbone",
}
_STRICT_SIZE = ("ViT", "DeiT")  # classes refusing another size without interpolate_pos_encoding
_BACKBONE_ATTRIBUTES = ("channels", "out_features", "out_indices", "stage_names")


class BaseModelOutputWithPooling(ModelOutput):
    FIELDS = ("last_hidden_state", "pooler_output", "hidden_states", "attentions")


class ImageClassifierOutput(ModelOutput):
    FIELDS = ("loss", "logits", "hidden_states", "attentions")


class DeiTForImageClassificationWithTeacherOutput(ModelOutput):
    FIELDS = ("logits", "cls_logits", "distillation_logits", "hidden_states", "attentions")


class TransformersConfig(dict[str, Any]):
    """A folder's ``config.json`` as transformers' config object reads: every key an attribute,
    ``id2label`` keyed by integers, ``num_labels``, ``use_return_dict``, ``to_dict()``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    @property
    def num_labels(self) -> int:
        return len(self.get("id2label") or {})

    @property
    def use_return_dict(self) -> bool:
        return bool(self.get("return_dict", True))

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


def transformers_config(hf: dict[str, Any], cfg: Any) -> TransformersConfig:
    """``.config`` for a model of ``cfg`` read from the folder whose config.json is ``hf``."""
    config = TransformersConfig(hf)
    h, w = cfg.image_size
    config["image_size"] = h if h == w else [h, w]
    labels = {int(k): v for k, v in (hf.get("id2label") or {}).items()}
    if cfg.num_classes and len(labels) != cfg.num_classes:  # a new head: transformers' names
        labels = {i: f"LABEL_{i}" for i in range(cfg.num_classes)}
    labels = labels or {0: "LABEL_0", 1: "LABEL_1"}  # (transformers' default: two)
    config["id2label"] = labels
    config["label2id"] = {v: k for k, v in labels.items()}
    config.setdefault("output_hidden_states", False)
    config.setdefault("output_attentions", False)
    return config


class TransformersViT(VisionTransformer):
    """A :class:`VisionTransformer` read from a transformers folder: the module's rule."""

    hf_class: str = ""
    config: TransformersConfig
    backbone_settings: dict[str, Any]

    def forward(
        self,
        x: Tensor | dict[str, Tensor] | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        *,
        pixel_values: Tensor | None = None,
        **hf: Any,
    ) -> Any:
        if pixel_values is None and not hf:  # model(x): vitkit's answer
            if x is None:
                raise VitkitError("no input: call model(pixels) or model(pixel_values=...)")
            return super().forward(x, attn_mask, is_causal)
        unknown = sorted(set(hf) - set(KEYWORDS))
        if unknown or attn_mask is not None or is_causal or isinstance(x, dict):
            what = ", ".join(unknown) or "attn_mask / is_causal / a NaFlex batch"
            raise VitkitError(
                f"{what}: not a keyword of transformers' call that vitkit answers (pixel_values, "
                f"{', '.join(KEYWORDS)})"
            )
        if (x is None) == (pixel_values is None):
            raise VitkitError("pass the pixels once: model(pixel_values=x) or model(x, ...)")
        pixels = pixel_values if pixel_values is not None else x
        assert isinstance(pixels, Tensor)
        return self.transformers_forward(pixels, **hf)

    def transformers_forward(
        self,
        pixel_values: Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        labels: Tensor | None = None,
    ) -> Any:
        """The folder's class's ``forward`` (see the module)."""
        kind = CLASSES.get(self.hf_class)
        if kind is None:
            raise VitkitError(
                f"{self.hf_class or 'this class'}: vitkit answers transformers' call for "
                f"{', '.join(CLASSES)} only; call model(pixels) for vitkit's output"
            )
        c = self.config
        hidden = c.output_hidden_states if output_hidden_states is None else output_hidden_states
        attend = c.output_attentions if output_attentions is None else output_attentions
        as_dict = c.use_return_dict if return_dict is None else return_dict
        if kind == "backbone":
            if labels is not None:
                raise VitkitError(f"{self.hf_class} takes no labels")
            return self.as_backbone()(pixel_values, hidden, attend, as_dict)
        if labels is not None and kind not in ("logits",):
            raise VitkitError(f"{self.hf_class} takes no labels (a classification class does)")
        pixel_values = pixel_values.to(self.patch_embed.proj.weight.dtype)
        size = (int(pixel_values.shape[-2]), int(pixel_values.shape[-1]))
        own = tuple(self.cfg.image_size)
        if self.hf_class.startswith(_STRICT_SIZE) and not interpolate_pos_encoding and size != own:
            raise VitkitError(
                f"Input image size ({size[0]}*{size[1]}) doesn't match model ({own[0]}*{own[1]}): "
                "pass interpolate_pos_encoding=True, as transformers asks"
            )
        last, states, maps = self._encoded(pixel_values, attend)
        extra = {
            "hidden_states": tuple(states) if hidden else None,
            "attentions": tuple(maps) if attend else None,
        }
        out: ModelOutput
        if kind in ("pooler", "cls"):
            pooled = last[:, 0] if kind == "cls" else None
            if kind == "pooler" and self.cfg.representation_size:
                pooled = self.pre_logits(last[:, 0])
            out = BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled, **extra)
        elif kind == "teacher":
            assert self.head is not None and self.head_dist is not None
            cls, dist = self.head(last[:, 0]), self.head_dist(last[:, 1])
            out = DeiTForImageClassificationWithTeacherOutput(
                logits=(cls + dist) / 2, cls_logits=cls, distillation_logits=dist, **extra
            )
        else:
            logits = self.forward_head(last)
            loss = None if labels is None else self._loss(logits, labels)
            out = ImageClassifierOutput(loss=loss, logits=logits, **extra)
        return out if as_dict else out.to_tuple()

    def _encoded(self, pixels: Tensor, attend: bool) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The normed tokens, the embeddings and every block's output, and (``attend``) every
        block's attention weights."""
        grid = self.patch_embed.grid_for((pixels.shape[-2], pixels.shape[-1]))
        x = self.embed(pixels)
        ropes, biases = self.rope_for(grid), self.attention_biases(x, grid)
        states, maps = [x], []
        for block, rope, bias in zip(self.blocks, ropes, biases):
            if attend:
                args = () if rope is None and bias is None else (rope, bias)
                x, weights = block.forward_explicit(x, *args)  # type: ignore[operator]
                maps.append(weights)
            else:
                x = features.run_block(self, block, x, rope, bias)
            states.append(x)
        return self.norm(x), states, maps

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """transformers' ``ForImageClassification`` loss: the config's ``problem_type``, else
        regression for one label, single-label for integer labels, multi-label otherwise."""
        n = logits.shape[-1]
        kind = self.config.get("problem_type")
        if kind is None:
            integer = labels.dtype in (torch.long, torch.int)
            kind = "regression" if n == 1 else "single_label_classification" if integer else ""
        if kind == "regression":
            return F.mse_loss(logits.squeeze(), labels.squeeze().to(logits.dtype))
        if kind == "single_label_classification":
            return F.cross_entropy(logits.view(-1, n), labels.view(-1))
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))

    def as_backbone(self) -> Any:
        """The folder's backbone class over this model (shares its weights)."""
        if CLASSES.get(self.hf_class) != "backbone":
            raise VitkitError(f"{self.hf_class} is not a backbone class")
        return HFBackbone(self, self.hf_class, **self.backbone_settings)

    def __getattr__(self, name: str) -> Any:
        backbone = CLASSES.get(self.__dict__.get("hf_class", "")) == "backbone"
        if backbone and name in (*_BACKBONE_ATTRIBUTES, "out_feature_channels"):
            return getattr(self.as_backbone(), name)
        return super().__getattr__(name)


def as_transformers(
    model: Any, hf: dict[str, Any], backbone_settings: dict[str, Any] | None = None
) -> Any:
    """``model`` (a plain :class:`VisionTransformer`, loaded) answering transformers' call as
    the class of the folder whose ``config.json`` is ``hf``; any other model as it is."""
    if type(model) is not VisionTransformer:
        return model
    model.__class__ = TransformersViT  # (the same module and weights; forward gains the rule)
    ours = cast(TransformersViT, model)
    ours.hf_class = str((hf.get("architectures") or [""])[0])
    ours.config = transformers_config(hf, model.cfg)
    ours.backbone_settings = dict(backbone_settings or {})
    return ours
