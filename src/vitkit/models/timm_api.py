"""timm's ``VisionTransformer`` interface on vitkit's: the attributes and methods that dense and
training code written for timm reads, with timm's values (``timm/models/vision_transformer.py``).

- Sizes: ``embed_dim`` = ``num_features`` (the token width D), ``head_hidden_size`` (what
  ``forward_head(pre_logits=True)`` gives), ``num_prefix_tokens`` (class, distillation,
  registers), ``num_reg_tokens``, ``has_class_token``, ``no_embed_class`` (E_pos on the patches
  only), ``num_classes``, ``in_chans``, ``global_pool`` (timm's name of the pooling: ``"token"``,
  ``"avg"``, ``"map"``, ``"max"``, ``"avgmax"``), ``pool_include_prefix``; ``feature_info``
  (every block, set by the model) and ``pretrained_cfg`` / ``default_cfg`` (the input and its
  preprocessing as timm's dict: the checkpoint's where the model was loaded; the timm entry's
  name as ``architecture`` where it was read as one, and, as timm gives them, ``mean`` / ``std``
  as lists for a timm folder, tuples otherwise).
- Training: ``set_grad_checkpointing`` (each block under ``torch.utils.checkpoint`` while
  gradients flow), ``no_weight_decay`` and ``group_matcher`` (the names timm's optimizer
  factory and layer-wise decay read; vitkit's parameter names are timm's ``VisionTransformer``'s,
  and its values are that class's, DeiT's for a distilled model), ``get_classifier`` and
  ``reset_classifier`` (a distilled model's two heads, as timm's DeiT), ``set_input_size``
  (E_pos resampled to another grid once).
- Dense: ``get_intermediate_layers`` (DINO's call, through ``forward_intermediates``), and on the
  patch embedding ``img_size``, ``num_patches``, ``feat_ratio()``, ``dynamic_feat_size()``.

``torch.jit.script`` compiles the model as timm's does (:mod:`vitkit.models.scriptable`; the
families it does not cover are refused in one line). Where vitkit differs, it says so: any multiple
of the patch size is a valid input (``dynamic_img_size`` is True, ``patch_embed.strict_img_size``
False), and a pooling vitkit has no head for (timm's ``""``: no pooling) is refused by
``reset_classifier``, another patch size by ``set_input_size``. A block's LayerScale parameters come
after its MLP's in ``named_parameters()`` (timm's: after each branch; a saved run's optimizer state
is positional).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models import features
from vitkit.registry.preprocess_config import PreprocessConfig

TIMM_POOL = {"token": "token", "gap": "avg", "map": "map", "max": "max", "avgmax": "avgmax"}
TIMM_POOL["none"] = ""  # (no pooling: every token, the head on each)
VITKIT_POOL = {timm: ours for ours, timm in TIMM_POOL.items()}


class TimmPatchEmbed:
    """timm's ``PatchEmbed`` attributes (mixed into vitkit's)."""

    image_size: tuple[int, int]
    grid_size: tuple[int, int]
    patch_size: tuple[int, int]
    stem_stride: int
    flatten = True
    strict_img_size = False  # any multiple of the patch size (grid_for refuses the rest)
    dynamic_img_pad = False

    def grid_for(self, size: tuple[int, int]) -> tuple[int, int]:
        raise NotImplementedError

    @property
    def img_size(self) -> tuple[int, int]:
        return self.image_size

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    def feat_ratio(self, as_scalar: bool = True) -> int | tuple[int, int]:
        """Input pixels per feature-map step (the patch, times a hybrid's ResNet stride)."""
        ratio = (self.patch_size[0] * self.stem_stride, self.patch_size[1] * self.stem_stride)
        return max(ratio) if as_scalar else ratio

    def dynamic_feat_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid of images ``img_size`` (H, W); sizes the patches do not tile are
        refused (timm would floor them, then fail in the forward)."""
        return self.grid_for((int(img_size[0]), int(img_size[1])))


class TimmModel:
    """timm's ``VisionTransformer`` attributes and methods (mixed into vitkit's; see the module)."""

    cfg: Any
    head: nn.Module | None
    head_dist: nn.Module | None
    attn_pool: Any  # the MAP head or None
    pos_embed: Any  # E_pos (a Parameter) or None
    training: bool
    grad_checkpointing = False
    preprocess_config: PreprocessConfig | None = None  # the checkpoint's (set by vitkit.load)
    timm_architecture: str | None = None  # the timm entry it was read as (set by vitkit.load)
    timm_folder = False  # read from a timm folder: its pretrained_cfg's JSON lists, as timm's
    dynamic_img_size = True  # any multiple of the patch size runs (E_pos resampled)

    @property
    def embed_dim(self) -> int:
        return int(self.cfg.width)

    @property
    def num_features(self) -> int:
        return int(self.cfg.width)

    @property
    def head_hidden_size(self) -> int:
        return int(self.cfg.feature_dim)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.cfg.num_prefix_tokens)

    @property
    def num_reg_tokens(self) -> int:
        return int(self.cfg.num_reg_tokens)

    @property
    def has_class_token(self) -> bool:
        return bool(self.cfg.has_class_token)

    @property
    def no_embed_class(self) -> bool:
        return not self.cfg.pos_embed_prefix

    @property
    def num_classes(self) -> int:
        return int(self.cfg.num_classes)

    @property
    def in_chans(self) -> int:
        return int(self.cfg.in_chans)

    @property
    def global_pool(self) -> str:
        return TIMM_POOL.get(self.cfg.pool, self.cfg.pool)

    @property
    def pool_include_prefix(self) -> bool:
        return bool(self.cfg.pool == "map" and self.cfg.map_prefix)

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg``: the input size and its preprocessing (the checkpoint's,
        else vitkit's defaults: the paper's mean and std 0.5, bilinear, no crop)."""
        cfg = self.cfg
        pre = self.preprocess_config or PreprocessConfig(
            image_size=cfg.image_size,
            channels=cfg.in_chans,
            mean=(0.5,) * cfg.in_chans,
            std=(0.5,) * cfg.in_chans,
        )
        k = 255 * pre.rescale_factor  # timm has no rescale factor: folded into mean and std
        seq: Any = list if self.timm_folder else tuple  # (timm: a folder's JSON lists)
        return {
            "architecture": self.timm_architecture,
            "input_size": (cfg.in_chans, *pre.image_size),  # (set_input_size leaves it)
            "fixed_input_size": False,
            "interpolation": pre.interpolation,
            "crop_pct": pre.crop_pct,
            "crop_mode": "squash" if pre.resize == "squash" else "center",
            "mean": seq(m / k for m in pre.mean),
            "std": seq(s / k for s in pre.std),
            "num_classes": cfg.num_classes,
            "pool_size": None,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
        }

    @property
    def default_cfg(self) -> dict[str, Any]:
        return self.pretrained_cfg

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Run each block under ``torch.utils.checkpoint`` (non-reentrant) while gradients
        flow: activations recomputed in the backward pass, the same numbers."""
        self.grad_checkpointing = enable

    def no_weight_decay(self) -> set[str]:
        """Parameters timm's optimizer factory keeps from weight decay (besides every 1-d
        parameter and bias, which it leaves out itself)."""
        return {"pos_embed", "cls_token", "reg_token", "dist_token"}

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups for layer-wise learning-rate decay: the embedding (``stem``),
        then one group per block and the final norm after them; the rest (pooling, head) last."""
        if self.cfg.dist_token:  # timm's DeiT's
            stem = r"^cls_token|pos_embed|patch_embed|dist_token"
        else:  # timm's ViT's
            stem = r"^cls_token|reg_token|pos_embed|patch_embed|norm_pre"
        stem += "|shared_rel_pos" if self.cfg.rel_pos_shared else ""  # (BEiT's rel_pos_bias)
        return {"stem": stem, "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]}

    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        """The head (an identity without one); a distilled model's two, as timm's DeiT."""
        head = self.head if self.head is not None else nn.Identity()
        if self.cfg.dist_token:
            return head, self.head_dist if self.head_dist is not None else nn.Identity()
        return head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new head for ``num_classes`` (0: none), initialised as timm's (PyTorch's Linear),
        optionally with another pooling (timm's names; ``"map"`` only where the model has
        its MAP head)."""
        changes: dict[str, Any] = {"num_classes": num_classes}
        if self.cfg.dist_token and global_pool not in (None, "token"):
            raise VitkitError(
                f"global_pool {global_pool!r}: a distilled model's heads read the class and "
                "distillation tokens (global_pool='token' or None)"
            )
        if global_pool is not None:
            if global_pool not in VITKIT_POOL:
                raise VitkitError(
                    f"global_pool {global_pool!r}: vitkit pools with one of "
                    f"{', '.join(VITKIT_POOL)} (unpooled tokens: forward_features)"
                )
            pool = VITKIT_POOL[global_pool]
            if pool == "map" and self.attn_pool is None:
                raise VitkitError("global_pool 'map' needs the model's MAP head; it has none")
            if pool != "map":
                self.attn_pool = None  # (timm: the attention pooling goes)
            changes |= {"pool": pool, "class_token": self.cfg.has_class_token}  # (kept)
        self.cfg = self.cfg.replace(**changes)
        weight = next(iter(self.parameters()))  # type: ignore[attr-defined]
        dd: dict[str, Any] = {"device": weight.device, "dtype": weight.dtype}
        self.head = nn.Linear(self.cfg.feature_dim, num_classes, **dd) if num_classes else None
        if self.cfg.dist_token:
            self.head_dist = nn.Linear(self.cfg.width, num_classes, **dd) if num_classes else None
        for head in (self.head, self.head_dist):
            if head is not None:
                head.train(self.training)

    def set_input_size(
        self, img_size: int | tuple[int, int] | None = None, patch_size: Any = None
    ) -> None:
        """timm's: the model's own input size becomes ``img_size``, E_pos resampled to its grid
        once (with the kernel other sizes use). Another patch size (FlexiViT's kernel
        resampling) is refused, as are models whose position terms have no one table (NaFlex,
        a relative position bias)."""
        cfg, pe = self.cfg, self.patch_embed  # type: ignore[attr-defined]
        if patch_size is not None and tuple(_pair(patch_size)) != tuple(cfg.patch_size):
            raise VitkitError("set_input_size: vitkit does not resample the patch kernel")
        if cfg.naflex or cfg.rel_pos != "none":
            raise VitkitError("set_input_size: NaFlex and relative-position models run any size")
        if img_size is None:
            return
        size = _pair(img_size)
        grid = pe.grid_for(size)
        pos = self.pos_embed_for(grid)  # type: ignore[attr-defined]
        if pos is not None:
            old = self.pos_embed
            self.pos_embed = nn.Parameter(pos.detach().clone(), requires_grad=old.requires_grad)
        self.cfg = cfg.replace(image_size=size)
        pe.image_size, pe.grid_size = size, grid

    def get_intermediate_layers(
        self,
        x: Tensor,
        n: features.Indices = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        attn_mask: Tensor | None = None,
    ) -> Any:
        """DINO's call (as timm's): the last ``n`` blocks' (or those listed) patch tokens, maps
        with ``reshape``."""
        return features.forward_intermediates(
            self,
            x,
            n,
            return_prefix_tokens=return_prefix_tokens,
            norm=norm,
            output_fmt="NCHW" if reshape else "NLC",
            intermediates_only=True,
            attn_mask=attn_mask,
        )


def _pair(x: Any) -> tuple[int, int]:
    return (int(x), int(x)) if isinstance(x, int) else (int(x[0]), int(x[1]))
