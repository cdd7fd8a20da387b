"""A vitkit ViT as Hugging Face's backbone classes (``Dinov2Backbone``,
``Dinov2WithRegistersBackbone``, ``DINOv3ViTBackbone``): what code written for
``transformers.AutoBackbone`` reads, with transformers' numbering and outputs.

Stages are numbered as transformers numbers them: ``stem`` (0) is the embeddings, ``stageI``
(I) the output of block I - 1; ``out_indices`` (negative from the end) or ``out_features``
(the names) choose among them, in order, without repeats. ``forward(pixel_values)`` returns a
:class:`BackboneOutput` whose ``feature_maps`` hold, per chosen stage, the hidden state through
the final norm where ``apply_layernorm`` says (DINOv3: the last stage always) and, with
``reshape_hidden_states``, the patch tokens as maps [B, D, h, w]; without it the tokens, the
prefix included for Dinov2's classes (patch tokens only for DINOv3's), as transformers gives
them. ``output_hidden_states`` adds the embeddings and every block's output,
``output_attentions`` every block's attention weights (through the explicit-softmax path);
``return_dict=False`` gives the tuple. ``channels``, ``out_features``, ``out_indices``,
``stage_names``, ``num_features`` and ``out_feature_channels`` are transformers' attributes;
``config`` holds the settings under transformers' names.
"""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models import features

DINOV2_CLASSES = ("Dinov2Backbone", "Dinov2WithRegistersBackbone")
DINOV3_CLASSES = ("DINOv3ViTBackbone",)
_FIELDS = ("feature_maps", "hidden_states", "attentions", "cls_tokens")


class ModelOutput(OrderedDict[str, Any]):
    """transformers' ``ModelOutput``: fields as attributes (None when not set), the set ones as
    dict entries in field order, ``out[0]`` the first set field, ``to_tuple()`` all of them."""

    FIELDS: tuple[str, ...] = ()

    def __init__(self, **fields: Any) -> None:
        super().__init__((k, fields[k]) for k in self.FIELDS if fields.get(k) is not None)

    def __getattr__(self, name: str) -> Any:
        if name in self.FIELDS:
            return self.get(name)
        raise AttributeError(name)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())


class BackboneOutput(ModelOutput):
    """transformers' ``BackboneOutput``."""

    FIELDS = _FIELDS

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.__dict__["last_hidden_state"] = fields.get("last_hidden_state")


def stage_choice(
    depth: int, out_indices: Any = None, out_features: Any = None
) -> tuple[list[int], list[str]]:
    """transformers' ``out_indices`` / ``out_features`` for ``depth`` blocks (default the last
    stage), checked as transformers checks them; ``out_indices`` stay as given (negative ones
    too, as transformers keeps them)."""
    names = ["stem", *(f"stage{i}" for i in range(1, depth + 1))]
    if out_indices is not None:
        if isinstance(out_indices, tuple):
            out_indices = list(out_indices)
        if not isinstance(out_indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in out_indices
        ):
            raise VitkitError(f"out_indices must be a list of stage numbers, got {out_indices!r}")
        if any(not -len(names) <= i < len(names) for i in out_indices):
            raise VitkitError(f"out_indices {out_indices} name stages outside {names}")
    if out_features is not None and (
        not isinstance(out_features, list) or any(f not in names for f in out_features)
    ):
        raise VitkitError(f"out_features must be a list of {names}, got {out_features!r}")
    if out_features is None:
        out_indices = [depth] if out_indices is None else out_indices
        out_features = [names[i] for i in out_indices]
    elif out_indices is None:
        out_indices = [names.index(f) for f in out_features]
    elif out_features != [names[i] for i in out_indices]:
        raise VitkitError(f"out_features {out_features} and out_indices {out_indices} differ")
    stages = [names.index(f) for f in out_features]
    if stages != sorted(set(stages)):
        raise VitkitError(
            f"out_indices / out_features must follow the stage order without repeats, got "
            f"{out_features}"
        )
    return out_indices, out_features


class HFBackbone(nn.Module):
    """A ViT as transformers' backbone class ``cls_name`` (see the module's docstring)."""

    def __init__(
        self,
        model: Any,
        cls_name: str = "Dinov2Backbone",
        out_indices: Any = None,
        out_features: Any = None,
        apply_layernorm: bool = True,
        reshape_hidden_states: bool = True,
        return_class_token: bool = False,
    ) -> None:
        super().__init__()
        if cls_name not in (*DINOV2_CLASSES, *DINOV3_CLASSES):
            raise VitkitError(f"{cls_name!r} is not one of {DINOV2_CLASSES + DINOV3_CLASSES}")
        if not hasattr(model, "blocks") or not hasattr(model, "patch_embed"):
            raise VitkitError(f"a backbone takes a Vision Transformer, not {type(model).__name__}")
        cfg = model.cfg
        self.model = model
        self.cls_name = cls_name
        self.stage_names = ["stem", *(f"stage{i}" for i in range(1, cfg.depth + 1))]
        oi, of = stage_choice(cfg.depth, out_indices, out_features)
        self.num_features = [cfg.width] * (cfg.depth + 1)
        self.config = SimpleNamespace(
            architectures=[cls_name],
            hidden_size=cfg.width,
            num_hidden_layers=cfg.depth,
            num_attention_heads=cfg.num_heads,
            patch_size=cfg.patch_size[0],
            image_size=cfg.image_size[0],
            num_register_tokens=cfg.num_reg_tokens,
            stage_names=self.stage_names,
            out_indices=oi,
            out_features=of,
            apply_layernorm=apply_layernorm,
            reshape_hidden_states=reshape_hidden_states,
            return_class_token=return_class_token,
            output_hidden_states=False,
        )

    @property
    def out_indices(self) -> list[int]:
        return list(self.config.out_indices)

    @property
    def out_features(self) -> list[str]:
        return list(self.config.out_features)

    @property
    def out_feature_channels(self) -> dict[str, int]:
        return dict(zip(self.stage_names, self.num_features))

    @property
    def channels(self) -> list[int]:
        return [self.out_feature_channels[name] for name in self.out_features]

    def forward(
        self,
        pixel_values: Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> Any:
        model, c = self.model, self.config
        want_hidden = (
            c.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        grid = model.patch_embed.grid_for((pixel_values.shape[-2], pixel_values.shape[-1]))
        x = model.embed(pixel_values)
        ropes, biases = model.rope_for(grid), model.attention_biases(x, grid)
        stages = [self.stage_names.index(f) for f in self.out_features]
        depth = len(model.blocks)
        dinov3 = self.cls_name in DINOV3_CLASSES
        last = depth if want_hidden or output_attentions else max(stages)
        hidden, attentions = [x], []
        for block, rope, bias in list(zip(model.blocks, ropes, biases))[:last]:
            if output_attentions:
                extra = () if rope is None and bias is None else (rope, bias)
                x, weights = block.forward_explicit(x, *extra)
                attentions.append(weights)
            else:
                x = features.run_block(model, block, x, rope, bias)
            hidden.append(x)
        prefix = model.cfg.num_prefix_tokens
        maps, cls_tokens, final = [], [], None
        for i in stages:
            h = hidden[i]
            if c.apply_layernorm or (dinov3 and i == depth):
                h = model.norm(h)
            cls_tokens.append(h[:, 0])
            if c.reshape_hidden_states:
                b = h.shape[0]
                h = h[:, prefix:].reshape(b, grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()
            elif dinov3:
                h = h[:, prefix:]
            maps.append(h)
        if dinov3 and want_hidden:  # (transformers' output keeps it only then)
            final = model.norm(hidden[-1])
        out = BackboneOutput(
            feature_maps=tuple(maps),
            hidden_states=tuple(hidden) if want_hidden else None,
            attentions=tuple(attentions) if output_attentions else None,
            cls_tokens=tuple(cls_tokens) if dinov3 and c.return_class_token else None,
            last_hidden_state=final,
        )
        return out if return_dict is None or return_dict else out.to_tuple()
