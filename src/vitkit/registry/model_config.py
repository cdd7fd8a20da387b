"""Model configuration and the variant tables.

A ViT is fully described by one frozen :class:`ViTConfig`. The paper's model sizes (Table 1 of
Dosovitskiy et al., 2021, plus the Ti and S sizes of the follow-up "How to train your ViT") live
in one table, :data:`SIZES`; a name such as ``"B/16"`` or ``"vit_b16"`` picks a size and a
patch size from it. The paper's named hybrids (``"r50_vit_b16"``, ...) are rows of
:data:`HYBRIDS` on top of it, and its baseline, BiT's ResNet-v2 (a :class:`ResNetConfig`), is
named by depth and width factor (``"bit_r50x1"``) from :data:`RESNET_DEPTHS`. Nothing else in
vitkit defines a variant; :func:`model_config` turns any of these names into a config.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from vitkit.errors import VitkitError
from vitkit.registry.config_checks import (
    check_fields,
    check_naflex,
    check_parallel_blocks,
    check_rel_pos,
    check_resnet,
    check_rope,
    check_vit,
    family_switches,
)
from vitkit.registry.families import FAMILIES, timm_vit
from vitkit.registry.preprocess_config import PreprocessConfig as PreprocessConfig

Pool = Literal["token", "gap", "avgmax", "max", "map", "token_gap", "none"]
GeluApprox = Literal["tanh", "none", "quick"]
ResNetRoot = Literal["bit", "small"]
ResNetEps = Literal["vit_jax", "timm"]
NormKind = Literal["layernorm", "rmsnorm"]
BlockKind = Literal["pre", "post"]
RopeKind = Literal["none", "dinov3", "axial", "mixed"]
RelPosKind = Literal["none", "bias", "mlp", "mlp_swin"]
NaFlexPos = Literal["learned", "factorized"]
NaFlexInterp = Literal["bicubic", "bilinear"]
Resample = Literal["bicubic", "bicubic-antialias", "bilinear", "zoom"]  # RESAMPLE_MODES


@dataclass(frozen=True)
class ViTConfig:
    """Everything needed to build a :class:`vitkit.models.vit.VisionTransformer`."""

    image_size: tuple[int, int] = (224, 224)  # input (height, width); need not be square
    patch_size: tuple[int, int] = (16, 16)  # (height, width) of one patch
    in_chans: int = 3  # input channels (1 for grayscale, 3 for RGB)
    num_classes: int = 1000  # size of the classification head; 0 = no head (features only)
    width: int = 768  # hidden size D of every token
    depth: int = 12  # number of encoder blocks L
    num_heads: int = 12  # attention heads per block
    mlp_dim: int = 3072  # hidden size of the MLP inside each block
    pool: Pool = (
        "token"  # "token": class token (Eq. 4); "gap": global average pool, no class token;
    )
    # "avgmax" / "max": (mean + max) / 2 or max over the patch tokens (timm's global_pool);
    # "map": a learned probe attends over the patch tokens (SigLIP's MAP head; models.map_head)
    # "token_gap": [class token; mean patch token], 2D wide (HF's Dinov2ForImageClassification)
    # "none": no pooling, the head (if any) on every token (timm's global_pool="", pruned heads)
    map_heads: int | None = None  # the MAP head's heads (Perception Encoder: 8); None: num_heads
    map_mlp_dim: int | None = None  # the MAP head's MLP width (PE gigantic: 4 D); None: mlp_dim
    map_prefix: bool = False  # the MAP head attends over the prefix tokens too (PE, timm Eva)
    representation_size: int | None = None  # width of the tanh pre-logits layer; None = none
    dropout: float = 0.0  # dropout after the embedding, in the MLP and after attention projection
    attn_dropout: float = 0.0  # dropout on the attention weights
    drop_path: float = 0.0  # stochastic depth of the last block (linear in depth); not in paper
    head_dropout: float = 0.0  # dropout on the head's input (timm's drop_rate); not in paper
    layer_norm_eps: float = 1e-6  # flax's default, used by the official code (PyTorch uses 1e-5)
    gelu: GeluApprox = (
        "tanh"  # flax's default; "none": exact (timm, HF); "quick": CLIP's x*sigmoid(1.702x)
    )
    qkv_bias: bool = True  # biases on query/key/value projections (official: yes)
    # Hybrid (paper Sec. 3.1): a ResNet turns the image into a feature map whose "patches" become
    # the tokens. None: a plain ViT on pixel patches. A tuple: units per ResNet stage after the
    # root (() = root only), as vit_jax's ``resnet.num_layers``; see vitkit.models.hybrid_stem.
    resnet_layers: tuple[int, ...] | None = None
    resnet_width_factor: float = 1.0  # ResNet width multiplier (root width 64 x factor)
    resnet_eps: ResNetEps = "vit_jax"  # kernel standardisation / GroupNorm epsilons: vit_jax's
    # (w - mean) / (std + 1e-5) and 1e-6, or timm's (w - mean) / sqrt(var + 1e-8) and 1e-5
    # The family's switches (timm's VisionTransformer arguments); the defaults are the paper's.
    class_token: bool | None = None  # None: a class token exactly when pool="token"; True with
    # pool="gap" averages the patch tokens only (timm's class_token=True, global_pool="avg")
    fc_norm: bool = False  # LayerNorm after pooling instead of the final norm (timm "avg" default)
    num_reg_tokens: int = 0  # register tokens after the class token (DINOv2-reg, Darcet et al.)
    pos_embed_prefix: bool = True  # E_pos covers the prefix tokens too; False: patches only
    # (timm's no_embed_class: DINOv2-reg, DeiT-III)
    pos_resample: Resample = "bicubic"  # how E_pos is resampled to another patch grid: the
    # source's kernel (timm's, Dinov2WithRegisters' "bicubic-antialias"; models.posemb_resample)
    layer_scale_init: float | None = None  # per-channel residual scale, initialised to this (CaiT,
    # DeiT-III, DINOv2); None: no layer scale
    norm_pre: bool = False  # LayerNorm on the embeddings before the first block (CLIP)
    patch_bias: bool = True  # bias of the patch projection E (CLIP has none)
    mlp: Literal["mlp", "swiglu"] = "mlp"  # "swiglu": SiLU(first half of fc1) x second half,
    # fc2 from mlp_dim / 2 (DINOv2-giant; timm's SwiGLUPacked)
    qk_norm: bool = False  # LayerNorm over each head's queries and keys (ViT-22B, some timm)
    dist_token: bool = False  # DeiT's distillation token after the class token, with its own
    # head; the two heads' logits are averaged (timm's VisionTransformerDistilled at eval)
    final_norm: bool = True  # the LayerNorm of Eq. 4; False: none at all (timm's final_norm)
    # parallel blocks (vitkit.models.parallel_blocks; the paper's block is Eq. 2, then Eq. 3)
    parallel: int = 1  # attention and MLP branches per block, summed (Touvron et al. 2022,
    # "Three things everyone should know about ViTs"; timm's ParallelThingsBlock, vit_*_18x2_*)
    parallel_scaling: bool = False  # attention and MLP side by side from one LayerNorm and one
    # fused input projection (ViT-22B; timm's ParallelScalingBlock, vit_*_xp_*, vit_pwee_*)
    diff_attn: bool = False  # differential attention, softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)
    # (Ye et al. 2024; timm's DiffAttention, DiffParallelScalingBlock: vit_d*wee_*, vit_dlittle_*)
    # AIMv2 / BEiT-3 / post-norm (timm's names in brackets); the defaults are the paper's.
    norm: NormKind = "layernorm"  # every norm's kind; "rmsnorm": x / rms(x) * g, no bias
    # (AIMv2, timm's norm_layer=RmsNorm; eps is layer_norm_eps)
    patch_norm: bool = False  # a norm on the patch embeddings before E_pos (timm embed_norm_layer)
    proj_bias: bool = True  # biases of the attention projection and the MLP (timm proj_bias)
    scale_attn_norm: bool = False  # a norm on the heads' output before the projection (BEiT-3)
    scale_mlp_norm: bool = False  # a norm on the MLP hidden after the activation (BEiT-3)
    block: BlockKind = "pre"  # "post": z + LN(F(z)), post-norm residual (timm ResPostBlock)
    abs_pos_embed: bool = True  # Eq. 1's learned E_pos; False: none (DINOv3, RoPE-ViT, BEiT)
    k_bias: bool = True  # False: q and v biases only, the key's 0 (timm / BEiT q_bias, v_bias)
    kv_heads: tuple[int, ...] | None = None  # key / value heads per block, shared by groups of
    # query heads (grouped-query attention, Ainslie et al. 2023; Sapiens2); None: num_heads
    layer_scale_mlp: bool = True  # False: layer scale on the attention branch only (Sapiens2)
    # Rotary position embeddings on the patch tokens' q / k (vitkit.models.rope; timm eva.py's
    # family)
    rope: RopeKind = "none"  # "dinov3": centred coords in [-1, 1] (DINOv3); "axial": patch
    # indices (RoPE-ViT, EVA-02, PE); "mixed": learned per-block frequencies (RoPE-ViT mixed)
    rope_theta: float = 100.0  # RoPE base (timm rope_temperature): DINOv3 / RoPE-ViT 100
    rope_half: bool = False  # pair channel c with c + d/2 (timm rotate_half; DINOv3); False:
    # pairs (2c, 2c + 1), RoFormer's interleaved layout (EVA-02, RoPE-ViT)
    rope_xy: bool = False  # per-axis channels (x, y), not (row, column) (timm grid_indexing="xy")
    rope_offset: float = 0.0  # added to every patch coordinate (timm rope_grid_offset; PE: 1)
    rope_ref_grid: tuple[int, int] | None = None  # indices rescaled to this grid (EVA-02)
    rope_hf: bool = False  # DINOv3's angles as transformers' DINOv3ViT: 2 pi x coords in float32
    # times 1 / period (float32-rounded); False: timm's, divided in the model's dtype
    # relative position bias (vitkit.models.relpos; timm beit.py, vision_transformer_relpos.py)
    rel_pos: RelPosKind = "none"  # a bias on the attention logits by query-key offset: "bias" a
    # learned table (BEiT, timm RelPosBias), "mlp" / "mlp_swin" an MLP of log offsets (RelPosMlp)
    rel_pos_shared: bool = False  # one bias for every block (timm shared_rel_pos, BEiT shared)
    rel_pos_dim: int = 128  # hidden width of the "mlp" bias's MLP (timm rel_pos_dim)
    # NaFlex (timm's NaFlexVit, vitkit.models.naflex_packing); the defaults are the paper's fixed
    # grid.
    naflex: bool = False  # E_pos on its own grid, resampled to each image's patch grid, none on
    # prefix tokens; forward also takes packed patches + coordinates + a valid mask (a dict)
    naflex_grid: tuple[int, int] = (16, 16)  # (rows, columns) of E_pos (pos_embed_grid_size)
    naflex_pos: NaFlexPos = "learned"  # "factorized": a row table + a column table, summed
    naflex_interp: NaFlexInterp = "bicubic"  # how the learned table is resampled (2-D)
    naflex_antialias: bool = True  # antialias when the learned table shrinks (timm's default)
    naflex_ar_preserving: bool = False  # resample to a max(h, w) square, keep the top-left h x w
    naflex_align_corners: bool = False  # align_corners of the learned table's resampling
    naflex_resample_own: bool = False  # resample (in float32) at the table's own grid too, as
    # transformers' SigLIP 2 on the CPU; False: the table as it is there (timm)

    def __post_init__(self) -> None:
        for name, value in check_vit(self).items():  # every field's type and range
            object.__setattr__(self, name, value)
        check_parallel_blocks(self)
        check_rope(self)
        check_naflex(self)
        s = self.stem_stride
        for side, (i, p) in zip(("height", "width"), zip(self.image_size, self.patch_size)):
            # A plain ViT's own size need not be a multiple of the patch: the patch grid is
            # floor(size / patch) and the remainder is unused, as timm and big_vision compute it
            # (SigLIP so400m/14 at 384 px: 27 x 27 patches, the last 6 pixels left out).
            if i < p * s or (s > 1 and i % (p * s)):
                what = f"the patch {side} {p}" + (f" x the ResNet stride {s}" if s > 1 else "")
                least = "a positive multiple of" if s > 1 else "at least"
                raise VitkitError(f"image {side} {i} is not {least} {what}")
        if self.resnet_layers is not None and int(64 * self.resnet_width_factor) < 1:
            raise VitkitError(f"resnet_width_factor must be > 0, got {self.resnet_width_factor}")
        if self.width % self.num_heads:
            raise VitkitError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        if self.pool == "token" and self.class_token is False:
            raise VitkitError('pool="token" needs the class token; set class_token or pool="gap"')
        if self.mlp == "swiglu" and self.mlp_dim % 2:
            raise VitkitError(f"mlp='swiglu' needs an even mlp_dim, got {self.mlp_dim}")
        if self.pool == "token_gap" and (self.representation_size or self.fc_norm):
            raise VitkitError('pool="token_gap" has no representation_size or fc_norm')
        if self.pool == "token_gap" and self.class_token is False:
            raise VitkitError('pool="token_gap" needs the class token')
        if self.dist_token and (
            self.pool not in ("token", "none") or self.representation_size or self.fc_norm
        ):
            raise VitkitError('dist_token needs pool="token", no representation_size, no fc_norm')
        if self.pool != "map" and (self.map_heads or self.map_mlp_dim or self.map_prefix):
            raise VitkitError(
                'map_heads, map_mlp_dim and map_prefix are the MAP head\'s (pool="map")'
            )
        if self.pool == "map" and self.width % (self.map_heads or self.num_heads):
            raise VitkitError(f"width {self.width} is not divisible by map_heads {self.map_heads}")
        if self.pool == "map" and self.mlp == "swiglu":
            raise VitkitError('pool="map" has a GELU MLP; it does not combine with mlp="swiglu"')
        if self.pool == "map" and (self.later_switches.keys() - {"block", "patch_norm"}):
            raise VitkitError(
                f'pool="map" (SigLIP\'s head) with {", ".join(self.later_switches)}: no checkpoint '
                "has both, and the MAP head keeps the paper's LayerNorm and biased MLP"
            )
        if self.block == "post" and self.layer_scale_init is not None:
            raise VitkitError('block="post" has no layer scale (timm\'s ResPostBlock)')
        check_rel_pos(self)
        if self.fc_norm and not self.final_norm:
            raise VitkitError(
                "fc_norm=True with final_norm=False: fc_norm is the final norm moved after "
                "pooling, so a model without one has fc_norm=False"
            )

    @property
    def later_switches(self) -> dict[str, Any]:
        """The AIMv2 / BEiT-3 / post-norm switches that differ from the paper (name: value)."""
        names = ("norm", "patch_norm", "proj_bias", "scale_attn_norm", "scale_mlp_norm", "block")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: getattr(self, k) for k in names if getattr(self, k) != defaults[k]}

    @property
    def has_class_token(self) -> bool:
        default = self.pool in ("token", "token_gap")
        return default if self.class_token is None else self.class_token

    @property
    def is_hybrid(self) -> bool:
        return self.resnet_layers is not None

    @property
    def stem_stride(self) -> int:
        """Downsampling of the hybrid's ResNet (root conv + max-pool: 4, then 2 per later stage)."""
        if self.resnet_layers is None:
            return 1
        return 4 * 2 ** max(len(self.resnet_layers) - 1, 0)

    @property
    def resnet_width(self) -> int:
        """Channels of the ResNet root (64 x width factor, as vit_jax)."""
        return int(64 * self.resnet_width_factor)

    @property
    def patch_in_chans(self) -> int:
        """Channels the patch embedding sees: the image's, or the ResNet feature map's."""
        if self.resnet_layers is None:
            return self.in_chans
        if not self.resnet_layers:
            return self.resnet_width
        return self.resnet_width * 2 ** (len(self.resnet_layers) - 1) * 4

    @property
    def grid_size(self) -> tuple[int, int]:
        """Number of patches (tokens) along (height, width)."""
        s = self.stem_stride
        return (
            self.image_size[0] // (self.patch_size[0] * s),
            self.image_size[1] // (self.patch_size[1] * s),
        )

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch tokens: the class token (if any), then the registers."""
        return int(self.has_class_token) + int(self.dist_token) + self.num_reg_tokens

    @property
    def num_pos_prefix(self) -> int:
        """Rows of E_pos before the patch grid (0 when E_pos covers the patches only)."""
        return self.num_prefix_tokens if self.pos_embed_prefix else 0

    @property
    def seq_len(self) -> int:
        return self.num_patches + self.num_prefix_tokens

    @property
    def family_switches(self) -> dict[str, Any]:
        """The switches of the ViT family that differ from the paper (name: value)."""
        return family_switches(self)

    @property
    def feature_dim(self) -> int:
        """Width of the features the head sees (pre-logits size if there is one)."""
        return self.representation_size or self.width * (2 if self.pool == "token_gap" else 1)

    @property
    def short_name(self) -> str:
        """``"B/16"`` for a size of the table, else ``"ViT-w64-d6-h4/4"``; hybrids get a
        ``"R(3,4,9)x1+"`` prefix and their patch size counts pixels of the input image."""
        ph, pw = (p * self.stem_stride for p in self.patch_size)
        patch = str(ph) if ph == pw else f"{ph}x{pw}"
        prefix = ""
        if self.resnet_layers is not None:
            layers = ",".join(str(n) for n in self.resnet_layers)
            prefix = f"R({layers})x{self.resnet_width_factor:g}+"
        for name, size in SIZES.items():
            if (size.width, size.depth, size.mlp_dim, size.num_heads) == (
                self.width,
                self.depth,
                self.mlp_dim,
                self.num_heads,
            ):
                return f"{prefix}{name}/{patch}"
        return f"{prefix}ViT-w{self.width}-d{self.depth}-h{self.num_heads}/{patch}"

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["image_size"] = list(self.image_size)
        d["patch_size"] = list(self.patch_size)
        d["naflex_grid"] = list(self.naflex_grid)
        if self.resnet_layers is not None:
            d["resnet_layers"] = list(self.resnet_layers)
        if self.rope_ref_grid is not None:
            d["rope_ref_grid"] = list(self.rope_ref_grid)
        if self.kv_heads is not None:
            d["kv_heads"] = list(self.kv_heads)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        check_fields(cls, d, "model config fields")
        return cls(**d)


@dataclass(frozen=True)
class Size:
    """One row of the size table: the transformer's shape without patch size."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int


# The paper's Table 1 (B, L, H) and the Ti/S sizes of Steiner et al. (2021), as in vit_jax.
SIZES: dict[str, Size] = {
    "Ti": Size(width=192, depth=12, mlp_dim=768, num_heads=3),
    "S": Size(width=384, depth=12, mlp_dim=1536, num_heads=6),
    "B": Size(width=768, depth=12, mlp_dim=3072, num_heads=12),
    "L": Size(width=1024, depth=24, mlp_dim=4096, num_heads=16),
    "H": Size(width=1280, depth=32, mlp_dim=5120, num_heads=16),
}
"""The model sizes by name (Ti, S, B, L, H): width, depth, MLP size and heads of each."""

# The released (size, patch) combinations; `vitkit models` lists these. Any other patch size works
# through the same names ("B/12", "vit_s8"), these are just the ones people ask for by name.
STANDARD_MODELS: tuple[str, ...] = (
    "Ti/16",
    "S/16",
    "S/32",
    "B/8",
    "B/16",
    "B/32",
    "L/16",
    "L/32",
    "H/14",
)
"""The released (size, patch) names, such as ``"B/16"``, that ``vitkit models`` lists first."""

_NAME_RE = re.compile(r"^(?:vit[_-])?(?P<size>ti|s|b|l|h)[/_-]?(?P<patch>\d+)$", re.IGNORECASE)
_SIZE_BY_LOWER = {k.lower(): k for k in SIZES}


def parse_name(name: str) -> tuple[str, int]:
    """``"B/16"``, ``"vit_b16"``, ``"vit-b/16"`` → ``("B", 16)``."""
    m = _NAME_RE.match(name.strip())
    if not m:
        known = ", ".join(STANDARD_MODELS)
        raise VitkitError(
            f"unknown model '{name}': expected a size and a patch size such as 'B/16' or "
            f"'vit_b16' (sizes {', '.join(SIZES)}; standard models {known})"
        )
    return _SIZE_BY_LOWER[m["size"].lower()], int(m["patch"])


def canonical_name(name: str) -> str:
    size, patch = parse_name(name)
    return f"{size}/{patch}"


# The paper's hybrids as named in its code (vit_jax ``configs/models.py``; timm's
# ``vit_*_r*_s*``): (transformer size, patch size on the ResNet feature map, ResNet stage depths).
# The ResNet downsamples 4x (root) and 2x per stage after the first, so "r50_vit_b16" (stages
# (3, 4, 9): 16x) with 1x1 patches sees 16-pixel patches. "r_vit_ti16" is vit_jax's "R+ViT-Ti/16":
# root only (4x) and 8x8 patches, which makes 32-pixel patches despite the name (timm calls it
# "vit_tiny_r_s16_p8"; both have a 7x7 grid at 224 px).
HYBRIDS: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "r_vit_ti16": ("Ti", 8, ()),
    "r26_vit_s32": ("S", 1, (2, 2, 2, 2)),
    "r26_vit_b32": ("B", 1, (2, 2, 2, 2)),
    "r50_vit_b16": ("B", 1, (3, 4, 9)),
    "r50_vit_l32": ("L", 1, (3, 4, 6, 3)),
}

# BiT's ResNet-v2 depths (Kolesnikov et al., 2020): units per stage. Depth = 3 x units + 2.
RESNET_DEPTHS: dict[int, tuple[int, ...]] = {
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}
# The BiT models people ask for by name (`vitkit models` lists them).
STANDARD_RESNETS: tuple[str, ...] = ("bit_r26x1", "bit_r50x1", "bit_r50x3", "bit_r101x1")

_RESNET_RE = re.compile(
    r"^(?:bit[_-]?(?:[sm][_-])?)?(?:resnet[_-]?v?2?[_-]?)?r?(?P<depth>\d+)(?:x(?P<wf>\d+(?:\.\d+)?))?$",
    re.IGNORECASE,
)


def _squash(name: str) -> str:
    """``"R50+ViT-B/16"``, ``"r50_vit_b16"`` → ``"r50b16"``: the key hybrid names are matched by."""
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("vit", ""))


_HYBRID_BY_SQUASHED = {_squash(k): k for k in HYBRIDS}


def hybrid_name(name: str) -> str | None:
    """The :data:`HYBRIDS` key a name refers to (``"R50+ViT-B/16"`` → ``"r50_vit_b16"``)."""
    return _HYBRID_BY_SQUASHED.get(_squash(name))


def parse_resnet_name(name: str) -> tuple[tuple[int, ...], float] | None:
    """``"bit_r50x3"``, ``"BiT-M-R101x1"``, ``"resnet50"`` → ``((3, 4, 6, 3), 3.0)``; None when
    the name is not a ResNet's. A depth outside :data:`RESNET_DEPTHS` is an error."""
    stripped = name.strip()
    if not re.match(r"^(bit|resnet|r\d)", stripped, re.IGNORECASE):
        return None
    m = _RESNET_RE.match(stripped)
    if not m:
        return None
    depth = int(m["depth"])
    if depth not in RESNET_DEPTHS:
        raise VitkitError(
            f"unknown ResNet depth {depth} in '{name}': BiT's depths are "
            f"{', '.join(str(d) for d in RESNET_DEPTHS)} (other stage depths: -o layers=1,1,1)"
        )
    return RESNET_DEPTHS[depth], float(m["wf"] or 1.0)


def model_config(name: str, **overrides: Any) -> ModelConfig:
    """A named variant's config with any field overridden (``depth=6``, ``image_size=384``).

    ViTs (``"B/16"``), the paper's hybrids (``"r50_vit_b16"``) and the family's named models
    (``"deit3_small_patch16_224"``) give a ViTConfig, BiT ResNets (``"bit_r50x1"``) a ResNetConfig.
    """
    resnet = parse_resnet_name(name)
    if resnet is not None:
        layers, width_factor = resnet
        check_fields(ResNetConfig, overrides, "ResNet model option(s)")
        return ResNetConfig(**{"layers": layers, "width_factor": width_factor, **overrides})
    hybrid = hybrid_name(name)
    if hybrid is not None:
        size, patch, layers = HYBRIDS[hybrid]
        base: dict[str, Any] = dataclasses.asdict(SIZES[size])
        base.update(patch_size=patch, resnet_layers=layers)
    elif name.strip() in FAMILIES:  # the family's named models (vitkit.registry.families)
        base = dict(FAMILIES[name.strip()])
    elif (plain := timm_vit(name.strip())) is not None:  # timm's vit_base_patch16_224, ...
        base = plain
    else:
        size, patch = parse_name(name)
        base = dataclasses.asdict(SIZES[size])
        base["patch_size"] = patch
    check_fields(ViTConfig, overrides, "model option(s)")
    base.update(overrides)
    cfg = ViTConfig(**base)
    for side, i, p in zip(("height", "width"), cfg.image_size, cfg.patch_size):
        if i % p:  # a new model tiles its images; a loaded one may floor (so400m/14 at 384)
            raise VitkitError(
                f"image {side} {i} is not a positive multiple of the patch {p}" + _tiling_fix(i, p)
            )
    return cfg


def _tiling_fix(image: int, patch: int) -> str:
    """What makes ``patch`` tile ``image``: a smaller patch that divides it, or an image size
    that is a multiple of the patch."""
    fixes = [f"--image-size {max(patch, image // patch * patch)}"]
    divisor = next((d for d in range(patch - 1, 1, -1) if image % d == 0), None)
    if divisor is not None:
        fixes.insert(0, f"-o patch_size={divisor}")
    return ": pass " + " or ".join(fixes)


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """A config from its ``to_dict()``: a ResNet's carries ``"architecture": "resnet"``."""
    if isinstance(d, dict) and d.get("architecture") == ResNetConfig.architecture:
        return ResNetConfig.from_dict(d)
    return ViTConfig.from_dict(d)


@dataclass(frozen=True)
class ResNetConfig:
    """Everything needed to build a :class:`vitkit.models.bit.ResNetV2`: BiT's ResNet-v2
    classifier."""

    architecture: ClassVar[str] = "resnet"

    image_size: tuple[int, int] = (224, 224)  # input (height, width)
    in_chans: int = 3  # input channels
    num_classes: int = 1000  # size of the classification head; 0 = no head (features only)
    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck units per stage (R50); any depths
    width_factor: float = 1.0  # channel multiplier: root width 64 x factor (BiT's "x3")
    # "bit": 7x7 stride-2 root conv + 3x3 stride-2 max-pool (BiT, for ImageNet-size images);
    # "small": a 3x3 stride-1 root conv and no pool (for 28-32 px images; not in BiT).
    root: ResNetRoot = "bit"

    def __post_init__(self) -> None:
        for name, value in check_resnet(self).items():  # every field's type and range
            object.__setattr__(self, name, value)
        if int(64 * self.width_factor) < 1:
            raise VitkitError(f"width_factor must be > 0, got {self.width_factor}")

    is_hybrid: ClassVar[bool] = False

    @property
    def width(self) -> int:
        """Channels of the root conv (64 x width factor)."""
        return int(64 * self.width_factor)

    @property
    def depth(self) -> int:
        """Weight layers in the classic count: 3 per bottleneck unit + root + head."""
        return 3 * sum(self.layers) + 2

    @property
    def feature_dim(self) -> int:
        """Channels of the last stage (what the head sees after global average pooling)."""
        return 4 * self.width * 2 ** (len(self.layers) - 1)

    @property
    def stride(self) -> int:
        """Downsampling from the image to the last feature map."""
        return (4 if self.root == "bit" else 1) * 2 ** (len(self.layers) - 1)

    @property
    def short_name(self) -> str:
        """``"BiT-R50x1"`` for BiT's depths, else ``"BiT-R(1,1,1)x0.25"``."""
        named = {v: k for k, v in RESNET_DEPTHS.items()}
        depth = (
            f"{named[self.layers]}"
            if self.layers in named
            else f"({','.join(map(str, self.layers))})"
        )
        root = "" if self.root == "bit" else "-small"
        return f"BiT-R{depth}x{self.width_factor:g}{root}"

    def replace(self, **changes: Any) -> ResNetConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(image_size=list(self.image_size), layers=list(self.layers))
        return {"architecture": self.architecture, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResNetConfig:
        d = {k: v for k, v in d.items() if k != "architecture"}
        check_fields(cls, d, "ResNet config fields")
        return cls(**d)


ModelConfig = ViTConfig | ResNetConfig
