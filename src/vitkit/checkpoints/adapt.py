"""Moving a checkpoint to another resolution or label set, the way the paper fine-tunes.

- The position embeddings are resampled with
  :func:`vitkit.models.posemb_resample.resample_pos_embed` (the paper's 2-D interpolation; the same
  function a model uses for inputs of another size). Rotary embeddings (DINOv3, RoPE-ViT) and
  NaFlex's E_pos (its own grid) need nothing; a relative position bias table (BEiT) is refused at
  another size.
- :func:`adapt`: a (config, state dict) pair at a new image size, with a new zero-initialised
  head ("we remove the pre-trained prediction head and attach a zero-initialized D x K
  feedforward layer", Sec. 3.2) and with the pre-logits layer kept or dropped.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.models.posemb_resample import Resample, resample_pos_embed
from vitkit.registry.model_config import ModelConfig, ResNetConfig, ViTConfig


def is_zero_head(state_dict: dict[str, Tensor]) -> bool:
    """True when the checkpoint has a classification head whose weights are all zero (the
    released ImageNet-21k checkpoints ship one: their head must be trained or replaced)."""
    w, b = state_dict.get("head.weight"), state_dict.get("head.bias")
    return w is not None and not bool(w.any()) and (b is None or not bool(b.any()))


def adapt(
    cfg: ModelConfig,
    state_dict: dict[str, Tensor],
    *,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    pre_logits: bool | None = None,
    resample: Resample | None = None,
    source: str = "checkpoint",
    head_init: str = "zero",
) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Return ``(cfg, state_dict)`` for another image size and/or head.

    ``num_classes`` different from the checkpoint's (or ``pre_logits=False`` on a checkpoint with
    a pre-logits layer) puts in a zero-initialised head (the paper's fine-tuning rule;
    ``head_init="timm"``: timm's, weights from ``trunc_normal_(std=0.02)``, cut at +-2, and a
    zero bias). ``pre_logits=False`` drops the tanh
    pre-logits layer, as the paper does when fine-tuning. A loaded head that is all zeros and is
    kept gets a warning. A BiT ResNet has no position embeddings or pre-logits layer: a new
    image size only changes its config (convolutions run at any size). ``resample``: the
    kernel that moves E_pos to the new grid; the config's ``pos_resample`` (the kernel of the
    checkpoint's source, the one the model uses at other input sizes) when not given.
    """
    sd = dict(state_dict)
    new = cfg
    if image_size is not None:
        new = new.replace(image_size=image_size)
        if (
            not isinstance(cfg, ResNetConfig)
            and not isinstance(new, ResNetConfig)  # `new` is `cfg` resized: the same type
            and new.grid_size != cfg.grid_size
        ):
            mode = cfg.pos_resample if resample is None else resample
            sd.update(_resampled_pos_embed(cfg, new, sd, mode, source))
    representation = None if isinstance(cfg, ResNetConfig) else cfg.representation_size
    drop_pre = pre_logits is False and representation is not None
    if pre_logits is True and representation is None:
        raise VitkitError(f"{source} has no pre-logits layer to keep")
    if drop_pre:
        new = new.replace(representation_size=None)
        sd.pop("pre_logits.0.weight", None)
        sd.pop("pre_logits.0.bias", None)
    k = cfg.num_classes if num_classes is None else num_classes
    if head_init not in ("zero", "timm"):
        raise VitkitError(f"head_init must be 'zero' (the paper's) or 'timm', got {head_init!r}")
    if k < 0:
        raise VitkitError(f"num_classes must be >= 0, got {k}")
    new_head = k != cfg.num_classes or drop_pre
    new = new.replace(num_classes=k)
    if new_head:  # both of DeiT's heads: the class head and the distillation head
        heads = ["head"] + (["head_dist"] if "head_dist.weight" in sd else [])
        for head in heads:
            sd.pop(f"{head}.weight", None)
            sd.pop(f"{head}.bias", None)
            if k:
                sd[f"{head}.weight"] = torch.zeros(k, new.feature_dim)
                sd[f"{head}.bias"] = torch.zeros(k)
                if head_init == "timm":  # (timm's init_weights_vit_timm: trunc_normal_, std .02)
                    torch.nn.init.trunc_normal_(sd[f"{head}.weight"], std=0.02)
    elif is_zero_head(sd):
        warnings.warn(
            f"{source}: the classification head is all zeros (as in the released ImageNet-21k "
            "checkpoints); its predictions are meaningless until it is trained — fine-tune, or "
            "pass num_classes to replace it",
            stacklevel=2,
        )
    return new, sd


def _resampled_pos_embed(
    cfg: ViTConfig, new: ViTConfig, sd: dict[str, Tensor], resample: Resample, source: str
) -> dict[str, Tensor]:
    """E_pos for ``new``'s patch grid: resampled; nothing to do without a learned E_pos (RoPE
    follows any grid) or with NaFlex's (on its own grid, resampled per image in the forward)."""
    if cfg.rel_pos == "bias":
        h, w = cfg.grid_size
        raise VitkitError(
            f"{source}: its relative position bias table is learned for a {h}x{w} patch grid; "
            f"{new.image_size[0]}x{new.image_size[1]} px makes another (vitkit does not "
            "resample the table): keep the checkpoint's image size"
        )
    if not cfg.abs_pos_embed or cfg.naflex:
        return {}
    pos = resample_pos_embed(
        sd["pos_embed"], cfg.grid_size, new.grid_size, cfg.num_pos_prefix, resample
    )
    return {"pos_embed": pos}
