"""timm ``VisionTransformer`` state dicts ↔ vitkit: explicit, pure functions.

vitkit's parameter names were chosen to be timm's (``patch_embed.proj``, ``blocks.{i}.attn.qkv``,
``mlp.fc1``, ...), so most keys carry over unchanged. The differences:

- timm 1.x has no pre-logits layer; timm 0.x checkpoints stored it as ``pre_logits.fc`` (vitkit:
  ``pre_logits.0``). Writing a model with pre-logits to timm is refused rather than dropping it.
- The family's switches have timm's names and layouts, so they carry over unchanged:
  ``fc_norm`` (timm's ``global_pool="avg"`` normalises after pooling unless ``fc_norm=False``;
  the paper's GAP normalises every token, then averages), ``reg_token`` (``num_reg_tokens``), a
  ``pos_embed`` without prefix rows (``no_embed_class``: ``pos_embed_prefix=False``),
  ``blocks.{i}.ls1.gamma`` / ``ls2.gamma`` (``layer_scale_init``), ``norm_pre`` (timm then has
  no patch-embedding bias: ``patch_bias=False``) and
  ``act_layer="quick_gelu"``. A state dict does not say which pooling a model with a class token
  used nor the layer-scale init value: a timm folder's ``model_args`` do; otherwise pooling is
  the class token (or "avg" with ``fc_norm`` weights) and layer scale starts at 1e-5 (only
  training from scratch reads it). ``blocks.{i}.attn.q_norm`` / ``k_norm`` are ``qk_norm``;
  DeiT's ``dist_token`` and ``head_dist`` are ``dist_token`` (timm's
  ``deit_*_distilled_*``); an ``fc2`` half as wide as ``fc1`` is ``mlp="swiglu"``
  (``SwiGLUPacked``, written as timm's ``vit_giant_patch14_dinov2`` entry). ``attn_pool.*``
  (``latent``, ``q``, ``kv``, ``proj``, ``norm``, ``mlp``) is SigLIP's MAP head,
  ``global_pool="map"`` (``pool="map"``); a state dict with neither ``norm`` nor ``fc_norm`` is
  timm's ``final_norm=False``.
- timm's GELU is the exact erf form and its LayerNorm epsilon is 1e-6; a converted checkpoint keeps
  that (``gelu="none"``). Writing a tanh-GELU model stores ``act_layer="gelu_tanh"``.
- A state dict does not record the number of heads; it is taken from the standard sizes by width
  (Ti 3, S 6, B 12, L 16, H 16) or must be given.

Hybrids (timm's ``vit_base_r50_s16_224``, ``vit_small_r26_s32_224``, ``vit_tiny_r_s16_p8_224``,
...) are read too: their backbone is timm's ``ResNetV2(preact=False, stem_type="same")`` with
``StdConv2dSame``, i.e. the same post-activation ResNet as vit_jax's and vitkit's
(:mod:`vitkit.models.hybrid_stem`); keys ``patch_embed.backbone.stem.conv`` / ``.stem.norm``
(``.conv`` / ``.norm`` for a root-only stem), ``stages.{i}.blocks.{j}.{conv,norm}{1,2,3}`` and
``downsample.{conv,norm}`` become ``patch_embed.stem.conv_root`` / ``gn_root`` /
``stages.{i}.{j}.{conv,gn}{1,2,3}`` / ``{conv,gn}_proj``, and back. Two epsilons differ from the
official numerics: timm standardises kernels as ``(w - mean) / sqrt(var + 1e-8)`` (vit_jax:
``/ (std + 1e-5)``) and its GroupNorm epsilon is 1e-5 (flax: 1e-6), so a timm hybrid is read with
``resnet_eps="timm"`` and computes what timm computes (writing a ``"vit_jax"`` hybrid to timm
warns). A timm folder names a registered hybrid whose backbone has the same stages
(:data:`TIMM_HYBRIDS`; width factor 1). timm's other hybrids (``resnet26d`` / ``resnet50d``
backbones with BatchNorm) are other architectures and are refused.

BiT ResNets (timm's ``resnetv2_50x1_bit``: ``stem.conv``, ``stages.{i}.blocks.{j}.norm1`` ...,
``norm``, ``head.fc``) convert with :func:`timm_bit_config` / :func:`timm_bit_to_state_dict`.

:func:`timm_model_args` gives the ``timm.create_model`` keyword arguments of the same network;
:func:`timm_hub_config` the ``config.json`` that ``timm.create_model("local-dir:DIR")`` reads.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

from torch import Tensor

from vitkit.checkpoints.provenance import Provenance
from vitkit.checkpoints.timm import bare as timm_bare
from vitkit.checkpoints.timm import naflexvit as timm_naflex
from vitkit.checkpoints.timm import switches as later
from vitkit.checkpoints.timm.parallel import (
    parallel_architecture,
    parallel_model_args,
    plain_block_view,
)
from vitkit.errors import AssumptionWarning, VitkitError
from vitkit.registry.model_config import SIZES, Pool, PreprocessConfig, ResNetConfig, ViTConfig

HEADS_BY_WIDTH = {s.width: s.num_heads for s in SIZES.values()}
_MAP_PARTS = ("q", "kv", "proj", "norm", "mlp.fc1", "mlp.fc2")  # SigLIP's MAP head, timm's names
_MAP_KEYS = {"attn_pool.latent"} | {
    f"attn_pool.{m}.{p}" for m in _MAP_PARTS for p in ("weight", "bias")
}
_BACKBONE = "patch_embed.backbone."
# The MAE authors' pre-training checkpoints hold the decoder next to the encoder's timm keys.
_MAE_DECODER = re.compile(r"^(decoder_(embed|pos_embed|blocks|norm|pred)\b|mask_token$)")


def unwrap_state_dict(obj: Any, source: str) -> dict[str, Tensor]:
    """The model weights inside what ``torch.load`` returned: a state dict, or a training
    checkpoint holding one under ``state_dict`` / ``model`` (the MAE and DeiT authors' files,
    which may also hold ``model_ema``, ``optimizer``, ``args``: the model is taken) / ``module``
    / ``model_ema`` alone (``module.`` prefixes stripped)."""
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "module", "model_ema"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise VitkitError(f"{source}: does not hold a state dict of tensors")
    return {(k[7:] if k.startswith("module.") else k): v for k, v in obj.items()}


def timm_config(
    sd: dict[str, Tensor],
    *,
    num_heads: int | None = None,
    grid: tuple[int, int] | None = None,
    source: str = "timm state dict",
) -> ViTConfig:
    """Infer the architecture of a bare timm ViT state dict (see
    :mod:`vitkit.checkpoints.timm.bare`)."""
    return timm_config_provenance(sd, num_heads=num_heads, grid=grid, source=source)[0]


def timm_config_provenance(
    sd: dict[str, Tensor],
    *,
    num_heads: int | None = None,
    grid: tuple[int, int] | None = None,
    source: str = "timm state dict",
    bare: bool = True,
) -> tuple[ViTConfig, Provenance]:
    """The architecture of a timm ViT state dict and where each field came from; ``bare``:
    no config nor name says anything else (:mod:`vitkit.checkpoints.timm.bare` completes it)."""
    if timm_naflex.is_naflex_state_dict(sd):
        timm_naflex.refuse_bare(source)
    timm_bare.refuse_other_keys(sd, source)
    cfg = _timm_shapes(sd, grid=grid, source=source)
    sd = later.pack_swiglu(sd, source)
    return timm_bare.complete(sd, cfg, num_heads, source, bare, grid_given=grid is not None)


def _timm_shapes(sd: dict[str, Tensor], *, grid: tuple[int, int] | None, source: str) -> ViTConfig:
    """What the shapes and key names of a timm state dict say (one head as a placeholder)."""
    sd = later.pack_swiglu(sd, source)  # AIMv2's fc1_g / fc1_x as one fc1
    sd, parallel_blocks = plain_block_view(sd, source)  # timm_parallel: their switches
    map_head = _timm_map_head(sd, source)
    resnet_layers, resnet_wf, stem_in = _timm_backbone(sd, source)
    fc_norm = "fc_norm.weight" in sd
    final_norm = fc_norm or "norm.weight" in sd  # neither: timm's final_norm=False
    need = ("patch_embed.proj.weight", "pos_embed", "blocks.0.attn.qkv.weight")
    missing = [k for k in need if k not in sd]
    if missing:
        raise VitkitError(f"{source}: not a timm ViT state dict (missing {', '.join(missing)})")
    if "blocks.0.mlp.fc1.weight" not in sd or "blocks.0.mlp.fc2.weight" not in sd:
        has = sorted(k[len("blocks.0.mlp.") :] for k in sd if k.startswith("blocks.0.mlp."))
        raise VitkitError(
            f"{source}: an MLP vitkit does not have (blocks.0.mlp has {', '.join(has) or 'nothing'}"
            "; vitkit reads fc1 and fc2, SwiGLU packed in fc1)"
        )
    width, in_chans, ph, pw = sd["patch_embed.proj.weight"].shape
    depth = 1 + max(int(m[1]) for k in sd if (m := re.match(r"^blocks\.(\d+)\.", k)))
    class_token = "cls_token" in sd
    mlp_dim = sd["blocks.0.mlp.fc1.weight"].shape[0]
    pool: Pool = "map" if map_head else "token" if class_token and not fc_norm else "gap"
    regs = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    prefix, rows = int(class_token) + ("dist_token" in sd) + regs, sd["pos_embed"].shape[1]
    pos_embed_prefix = (
        rows > prefix and (_square(rows - prefix) or not _square(rows))  # (fewer: no prefix rows)
        if grid is None
        else (rows == prefix + grid[0] * grid[1])
    )
    n = rows - prefix if pos_embed_prefix else rows
    if grid is None:
        if not _square(n):
            raise VitkitError(
                f"{source}: {n} position embeddings are not a square grid; say the patch grid "
                "(grid=(H, W) when loading, -o grid=H,W on the command line)"
            )
        grid = (math.isqrt(n), math.isqrt(n))
    rep = None
    for k in ("pre_logits.fc.weight", "pre_logits.0.weight"):
        if k in sd:
            rep = sd[k].shape[0]
    stride = 1
    if resnet_layers is not None:
        in_chans, stride = stem_in, 4 * 2 ** max(len(resnet_layers) - 1, 0)
    return ViTConfig(
        image_size=(grid[0] * ph * stride, grid[1] * pw * stride),
        patch_size=(ph, pw),
        in_chans=in_chans,
        resnet_layers=resnet_layers,
        resnet_width_factor=resnet_wf,
        resnet_eps="timm" if resnet_layers is not None else "vit_jax",
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        width=width,
        depth=depth,
        num_heads=1,  # (the heads are not in the shapes: timm_bare.complete)
        mlp_dim=mlp_dim,
        pool=pool,
        representation_size=rep,
        layer_norm_eps=later.bare_eps(sd),  # timm's 1e-6; AIMv2's and BEiT-3's weights 1e-5
        gelu="none",
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        class_token=class_token if class_token != (pool == "token") else None,
        fc_norm=fc_norm,
        num_reg_tokens=regs,
        pos_embed_prefix=pos_embed_prefix,
        layer_scale_init=1e-5 if "blocks.0.ls1.gamma" in sd else None,
        norm_pre="norm_pre.weight" in sd,
        patch_bias="patch_embed.proj.bias" in sd,
        qk_norm="blocks.0.attn.q_norm.weight" in sd,
        dist_token="dist_token" in sd,
        mlp="swiglu" if 2 * sd["blocks.0.mlp.fc2.weight"].shape[1] == mlp_dim else "mlp",
        final_norm=final_norm,
        **parallel_blocks,
        # AIMv2 / BEiT-3 (read from the paper's block keys; not parallel blocks' own)
        **({} if parallel_blocks else later.later_switches(sd)),
    )


def _timm_map_head(sd: dict[str, Tensor], source: str) -> bool:
    """Whether the state dict has timm's ``AttentionPoolLatent`` (SigLIP's MAP head) in the
    layout vitkit's :class:`vitkit.models.map_head.MAPHead` has: one probe, a query projection, no
    position embedding of its own, the blocks' MLP width."""
    keys = {k for k in sd if k.startswith("attn_pool.")}
    if not keys:
        return False
    extra, missing = sorted(keys - _MAP_KEYS), sorted(_MAP_KEYS - keys)
    if extra or missing:
        odd = f"has {extra[0]}" if extra else f"lacks {missing[0]}"
        raise VitkitError(
            f"{source}: an attention-pooling head other than SigLIP's MAP head ({odd}); "
            "vitkit reads timm's AttentionPoolLatent with one probe and a query projection"
        )
    if sd["attn_pool.latent"].shape[1] != 1:
        raise VitkitError(f"{source}: a MAP head with {sd['attn_pool.latent'].shape[1]} probes")
    if sd["attn_pool.mlp.fc1.weight"].shape != sd["blocks.0.mlp.fc1.weight"].shape:
        raise VitkitError(f"{source}: the MAP head's MLP is not as wide as the blocks' MLP")
    return True


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def _timm_backbone(sd: dict[str, Tensor], source: str) -> tuple[tuple[int, ...] | None, float, int]:
    """(resnet_layers, width factor, input channels) of a timm hybrid's backbone; layers None
    for a plain ViT."""
    keys = [k[len(_BACKBONE) :] for k in sd if k.startswith(_BACKBONE)]
    if not keys:
        return None, 1.0, 0
    if "stem.conv.weight" in keys:
        root = sd[_BACKBONE + "stem.conv.weight"]
        units: dict[int, int] = {}
        for k in keys:
            if m := re.match(r"^stages\.(\d+)\.blocks\.(\d+)\.", k):
                units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) + 1)
        layers = tuple(units[i] for i in range(len(units)))
        if layers and "stages.0.blocks.0.downsample.norm.weight" not in keys:
            raise VitkitError(
                f"{source}: the hybrid backbone is a pre-activation ResNetV2 (no norm in its "
                "shortcut); the paper's hybrids use timm's preact=False layout"
            )
    elif "conv.weight" in keys and "norm.weight" in keys:
        root, layers = sd[_BACKBONE + "conv.weight"], ()
    else:
        raise VitkitError(
            f"{source}: a hybrid backbone in a layout other than timm's ResNetV2 "
            f"({_BACKBONE}{keys[0]}); vitkit reads the paper's R+ViT hybrids"
        )
    known = re.compile(
        r"^(stem\.conv\.weight|stem\.norm\.(weight|bias)|conv\.weight|norm\.(weight|bias)|"
        r"stages\.\d+\.blocks\.\d+\.(conv[123]\.weight|norm[123]\.(weight|bias)|"
        r"downsample\.conv\.weight|downsample\.norm\.(weight|bias)))$"
    )
    odd = [k for k in keys if not known.match(k)]
    if odd:
        raise VitkitError(
            f"{source}: the hybrid backbone has weights vitkit's ResNet does not "
            f"({_BACKBONE}{odd[0]}); vitkit reads timm's ResNetV2(preact=False) hybrids"
        )
    width, in_chans, kh, _ = root.shape
    if kh != 7:
        raise VitkitError(f"{source}: hybrid root conv is {kh}x{kh}; the paper's is 7x7")
    return layers, width / 64, int(in_chans)


def _timm_backbone_key(k: str) -> str:
    k = k[len(_BACKBONE) :]
    k = re.sub(r"^stem\.conv\.|^conv\.", "conv_root.", k)
    k = re.sub(r"^stem\.norm\.|^norm\.", "gn_root.", k)
    k = re.sub(r"^stages\.(\d+)\.blocks\.(\d+)\.", r"stages.\1.\2.", k)
    k = k.replace("downsample.conv.", "conv_proj.").replace("downsample.norm.", "gn_proj.")
    k = re.sub(r"\.norm([123])\.", r".gn\1.", k)
    return "patch_embed.stem." + k


def timm_to_state_dict(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """timm keys → vitkit keys (``pre_logits.fc`` → ``pre_logits.0``; a hybrid's
    ``patch_embed.backbone.*`` → ``patch_embed.stem.*``; an MAE pre-training file's decoder,
    ``decoder_*`` and ``mask_token``, dropped; everything else equal)."""
    if cfg.naflex:  # timm's NaFlexVit: its embedding's own layout
        return timm_naflex.naflex_to_state_dict(sd, cfg)
    out = {}
    for k, v in later.pack_swiglu(sd, "timm state dict").items():  # AIMv2's SwiGLU packed
        if _MAE_DECODER.match(k):  # an MAE pre-training file's pixel decoder: not the ViT
            continue
        if k.startswith(_BACKBONE):
            out[_timm_backbone_key(k)] = v
        else:
            out[k.replace("pre_logits.fc.", "pre_logits.0.")] = v
    return out


def is_timm_bit(sd: dict[str, Tensor]) -> bool:
    """Whether a state dict is a timm ResNetV2 (BiT) classifier."""
    return "stem.conv.weight" in sd and any(k.startswith("stages.0.blocks.0.") for k in sd)


def timm_bit_config(
    sd: dict[str, Tensor], *, image_size: int | tuple[int, int] = 224, source: str = "timm"
) -> ResNetConfig:
    """Architecture of a timm ``resnetv2_*_bit`` state dict (pre-activation ResNetV2). A state
    dict does not record the resolution; ``image_size`` sets it (convolutions run at any)."""
    if not is_timm_bit(sd):
        raise VitkitError(f"{source}: not a timm ResNetV2 state dict (no stem.conv.weight)")
    if "stages.0.blocks.0.norm1.weight" not in sd or "norm.weight" not in sd:
        raise VitkitError(
            f"{source}: a ResNetV2 without pre-activation norms; vitkit's BiT ResNet is "
            "pre-activation (preact=True)"
        )
    units: dict[int, int] = {}
    for k in sd:
        if m := re.match(r"^stages\.(\d+)\.blocks\.(\d+)\.", k):
            units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) + 1)
    width, in_chans, kh, _ = sd["stem.conv.weight"].shape
    if kh not in (7, 3):
        raise VitkitError(f"{source}: root conv {kh}x{kh}: not BiT's 7x7 (or vitkit's 3x3)")
    head = sd.get("head.fc.weight")
    return ResNetConfig(
        image_size=(image_size, image_size) if isinstance(image_size, int) else image_size,
        in_chans=int(in_chans),
        num_classes=0 if head is None else int(head.shape[0]),
        layers=tuple(units[i] for i in range(len(units))),
        width_factor=width / 64,
        root="bit" if kh == 7 else "small",
    )


def timm_bit_to_state_dict(sd: dict[str, Tensor], cfg: ResNetConfig) -> dict[str, Tensor]:
    """timm ResNetV2 keys → :class:`vitkit.models.bit.ResNetV2` keys."""
    del cfg
    out = {}
    for k, v in sd.items():
        if k == "stem.conv.weight":
            out["root.weight"] = v
            continue
        if k.startswith("head.fc."):
            out["head." + k[len("head.fc.") :]] = v.flatten(1) if v.ndim == 4 else v
            continue
        k = re.sub(r"^stages\.(\d+)\.blocks\.(\d+)\.", r"stages.\1.\2.", k)
        k = k.replace("downsample.conv.", "downsample.")
        out[re.sub(r"\.norm([123])\.", r".gn\1.", k)] = v
    return out


def state_dict_to_timm(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit keys → timm 1.x keys."""
    if cfg.naflex:  # timm's NaFlexVit
        return timm_naflex.state_dict_to_naflex(sd, cfg)
    if cfg.representation_size:
        raise VitkitError(
            "timm's VisionTransformer has no pre-logits layer; drop it first "
            "(convert with --drop-pre-logits, which puts in a new zero head)"
        )
    if cfg.is_hybrid and cfg.resnet_width % 32:
        raise VitkitError(
            f"timm's hybrid ResNet has GroupNorm with 32 groups; this one's root is "
            f"{cfg.resnet_width} channels wide"
        )
    if cfg.pool == "token_gap":
        raise VitkitError(
            "timm's ViT has no pooling that concatenates the class token and the mean patch "
            "token (pool='token_gap', Hugging Face's Dinov2ForImageClassification)"
        )
    if cfg.patch_bias == cfg.norm_pre:
        raise VitkitError(
            "timm's ViT has a patch-embedding bias exactly when it has no norm_pre; this model "
            f"has patch_bias={cfg.patch_bias} with norm_pre={cfg.norm_pre}"
        )
    if cfg.dist_token and not cfg.pos_embed_prefix:
        raise VitkitError("timm's distilled DeiT has position embeddings for its prefix tokens")
    why = later.later_write_checks(cfg)  # AIMv2 / BEiT-3 / post-norm
    if why:
        raise VitkitError(why)
    root_only = cfg.resnet_layers == ()
    out = {
        (_to_timm_backbone_key(k, root_only) if k.startswith(_STEM) else k): v.contiguous()
        for k, v in sd.items()
    }
    return later.unpack_swiglu(out) if later.is_aimv2(cfg) else out


_STEM = "patch_embed.stem."
# timm's registered hybrids by ResNet stages (their backbone is fixed by the name; width 1x).
TIMM_HYBRIDS: dict[tuple[int, ...], str] = {
    (): "vit_tiny_r_s16_p8_224",
    (2, 2, 2, 2): "vit_small_r26_s32_224",
    (3, 4, 9): "vit_base_r50_s16_224",
    (3, 4, 6, 3): "vit_large_r50_s32_224",
}


def _to_timm_backbone_key(k: str, root_only: bool) -> str:
    """The inverse of :func:`_timm_backbone_key`."""
    k = k[len(_STEM) :]
    root = "" if root_only else "stem."
    k = re.sub(r"^conv_root\.", f"{root}conv.", k)
    k = re.sub(r"^gn_root\.", f"{root}norm.", k)
    k = re.sub(r"^stages\.(\d+)\.(\d+)\.", r"stages.\1.blocks.\2.", k)
    k = k.replace("conv_proj.", "downsample.conv.").replace("gn_proj.", "downsample.norm.")
    return _BACKBONE + re.sub(r"\.gn([123])\.", r".norm\1.", k)


def timm_architecture(cfg: ViTConfig) -> str:
    """A registered timm name whose class builds ``cfg`` (with :func:`timm_model_args`)."""
    if cfg.naflex:  # NaFlexVit: model_args set every setting its entries differ in
        return "naflexvit_base_patch16_gap"
    if cfg.resnet_layers is not None:
        if cfg.resnet_layers not in TIMM_HYBRIDS or cfg.resnet_width_factor != 1:
            stages = ", ".join(str(s) for s in TIMM_HYBRIDS)
            raise VitkitError(
                f"timm registers hybrids with the ResNet stages {stages} at width factor 1; "
                f"this one has {cfg.resnet_layers} x{cfg.resnet_width_factor:g} (write the "
                "state dict alone: a .safetensors or .pth file)"
            )
        return TIMM_HYBRIDS[cfg.resnet_layers]
    if (parallel := parallel_architecture(cfg)) is not None:  # nor a block class
        return parallel
    if later.later_architecture(cfg):  # AIMv2 / BEiT-3 / post-norm entries
        return str(later.later_architecture(cfg))
    if cfg.mlp == "swiglu":  # timm's model_args cannot name SwiGLUPacked; this entry sets it
        return "vit_giant_patch14_dinov2"
    return "deit_base_distilled_patch16_224" if cfg.dist_token else "vit_base_patch16_224"


def warn_hybrid_eps(cfg: ViTConfig) -> None:
    """Warn that timm will run a hybrid made with the official epsilons with its own."""
    if cfg.is_hybrid and cfg.resnet_eps != "timm":
        warnings.warn(
            "timm's hybrid ResNet standardises kernels as (w - mean) / sqrt(var + 1e-8) with "
            "GroupNorm epsilon 1e-5; this model uses vit_jax's (std + 1e-5) and 1e-6, so timm's "
            "outputs will differ slightly (about 1e-5 relative)",
            stacklevel=3,
        )


def timm_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments for ``timm.create_model("vit_base_patch16_224", **args)`` (any
    registered plain-ViT name: these override all of its architecture settings)."""
    if cfg.naflex:
        return timm_naflex.naflex_model_args(cfg)
    return {
        "img_size": list(cfg.image_size),
        "patch_size": list(cfg.patch_size),
        "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes,
        "embed_dim": cfg.width,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "mlp_ratio": cfg.mlp_dim / cfg.width,
        "qkv_bias": cfg.qkv_bias,
        "class_token": cfg.has_class_token,
        "global_pool": {"gap": "avg", "none": ""}.get(cfg.pool, cfg.pool),
        "fc_norm": cfg.fc_norm,
        "reg_tokens": cfg.num_reg_tokens,
        "no_embed_class": not cfg.pos_embed_prefix,
        "init_values": cfg.layer_scale_init,
        "pre_norm": cfg.norm_pre,
        "qk_norm": cfg.qk_norm,
        "final_norm": cfg.final_norm,
        **({} if cfg.mlp == "swiglu" else {"act_layer": _TIMM_ACT[cfg.gelu]}),
        **parallel_model_args(cfg),
        **later.later_model_args(cfg),  # AIMv2 / BEiT-3 / post-norm
    }


_TIMM_ACT = {"tanh": "gelu_tanh", "none": "gelu", "quick": "quick_gelu"}


def timm_hub_config(
    cfg: ViTConfig, preprocess: PreprocessConfig, class_names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The ``config.json`` of a timm local-dir / Hub model folder."""
    fixed = timm_architecture(cfg).startswith(("aimv2_", "beit3_"))  # entries with eps 1e-5
    if cfg.layer_norm_eps != (1e-5 if fixed else 1e-6):
        warnings.warn(
            f"timm's ViT has LayerNorm epsilon 1e-6; this model was made with "
            f"{cfg.layer_norm_eps:g}, so timm's outputs will differ slightly",
            stacklevel=2,
        )
    warn_hybrid_eps(cfg)
    if preprocess.resize == "none":
        warnings.warn("timm's eval transform always resizes; written as crop_pct 1", stacklevel=2)
    out: dict[str, Any] = {
        "architecture": timm_architecture(cfg),
        "num_classes": cfg.num_classes,
        "num_features": cfg.width,
        "global_pool": timm_model_args(cfg)["global_pool"],
        "model_args": timm_model_args(cfg),
        "pretrained_cfg": pretrained_cfg(
            cfg, preprocess, "embeds.proj" if cfg.naflex else "patch_embed.proj", True
        ),
    }
    if class_names:
        out["label_names"] = list(class_names)
    return out


def pretrained_cfg(
    cfg: ViTConfig, preprocess: PreprocessConfig, first_conv: str, fixed_input_size: bool
) -> dict[str, Any]:
    """A timm folder's ``pretrained_cfg``: the input and its preprocessing (a rescale factor
    other than 1/255 folded into mean and std, as timm has none)."""
    k = 255 * preprocess.rescale_factor if preprocess.rescale_factor != 1 / 255 else 1.0
    return {
        "input_size": [cfg.in_chans, *cfg.image_size],
        "fixed_input_size": fixed_input_size,
        "interpolation": preprocess.interpolation,
        "crop_pct": preprocess.crop_pct,
        "crop_mode": "squash" if preprocess.resize == "squash" else "center",
        "mean": [m / k for m in preprocess.mean],
        "std": [v / k for v in preprocess.std],
        "num_classes": cfg.num_classes,
        "first_conv": first_conv,
        "classifier": "head",
    }


# timm's registered sizes outside the paper's table (name pattern → heads), first match wins;
# checked against every registered name by bench/coverage.py and tests/test_coverage.py
_NAME_HEADS: tuple[tuple[str, int], ...] = (
    (r"^vit_base_patch16_gap_224$", 16),  # B width with 16 heads
    (r"^vit_giant_patch\d+_(reg\d_)?(dinov2|tipsv2|radio_v\d)$", 24),
    (r"_(d?p?wee|xsmall)_", 4),
    (r"_d?little_", 5),
    (r"_mediumd?_", 8),
    (r"_betwixt_", 10),
    (r"_so150m2_", 13),
    (r"_so150m_|^vit_base_patch\d+_plus_", 14),
    (r"_(so400m|giant|giantopt|gigantic)_", 16),
    *later.NAME_HEADS,  # AIMv2, timm's test models
)
# SigLIP 2 towers (and timm's SigLIP-GAP copies of them) use the tanh GELU; SigLIP 1's exact
_TANH_GELU = re.compile(
    r"^vit_(base_patch32_siglip_|large_patch16_siglip_(gap_)?512|so400m_patch16_siglip_|"
    r"giantopt_patch16_siglip_)"
)
# timm names whose blocks compute something their weights cannot show
_NAME_REFUSED: dict[str, str] = {}


def _name_settings(arch: str) -> dict[str, Any]:
    """What a timm model name fixes that its weights do not (timm's vision_transformer.py and
    deit.py): CLIP towers' LayerNorm epsilon and quick GELU, SigLIP 2's tanh GELU, the
    layer-scale init, the heads of timm's sizes outside the paper's table."""
    out: dict[str, Any] = {"layer_norm_eps": 1e-5} if "_clip_" in arch else {}
    if "quickgelu" in arch:
        out["act_layer"] = "quick_gelu"
    if _TANH_GELU.match(arch):
        out["act_layer"] = "gelu_tanh"
    if arch.startswith("deit3_") or "dinov2" in arch:
        out["init_values"] = 1e-6 if arch.startswith("deit3_") else 1e-5
    out.update(later.later_name_settings(arch))  # AIMv2 / BEiT-3 / post-norm
    for pattern, heads in _NAME_HEADS:
        if re.search(pattern, arch):
            out["num_heads"] = heads
            break
    return out


def timm_hub_preprocess(
    hub: dict[str, Any], cfg: ViTConfig | ResNetConfig, source: str = "config.json"
) -> PreprocessConfig:
    """``pretrained_cfg`` as timm's ``resolve_data_config`` + ``create_transform`` read it, with
    their defaults (ImageNet's mean and std, bicubic, crop_pct 0.875, crop_mode "center"); the
    crop's offset rounded as torchvision's CenterCrop. crop_mode "border" is refused."""
    p = hub.get("pretrained_cfg", {}) or {}
    c = cfg.in_chans
    mean = tuple(p.get("mean") or (0.485, 0.456, 0.406))
    std = tuple(p.get("std") or (0.229, 0.224, 0.225))
    mode = p.get("crop_mode") or "center"
    if "crop_pct" in p and p["crop_pct"] is not None and not p["crop_pct"]:
        warnings.warn(  # timm's resolve_data_config takes a falsy crop_pct as its default
            AssumptionWarning(
                f"{source}: pretrained_cfg crop_pct={p['crop_pct']!r} read as 0.875, as timm "
                "reads it (a crop_pct of 0 means timm's default); set another with -o crop_pct=X"
            ),
            stacklevel=3,
        )
    if mode not in ("center", "squash"):
        raise VitkitError(f"pretrained_cfg crop_mode={mode!r}: vitkit has 'center' and 'squash'")
    return PreprocessConfig(
        image_size=cfg.image_size,
        channels=c,
        mean=mean[:c] if len(mean) >= c else mean * c,
        std=std[:c] if len(std) >= c else std * c,
        interpolation=str(p.get("interpolation") or "bicubic"),
        crop_pct=float(p.get("crop_pct") or 0.875),
        resize="squash" if mode == "squash" else "shortest_edge",
        crop_offset="round",
    )
