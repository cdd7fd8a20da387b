"""timm's relative-position ViTs ↔ vitkit: BEiT (``beit.py``: ``beit_*``, ``beitv2_*``) and
``vision_transformer_relpos.py`` (``vit_relpos_*``, ``vit_srelpos_*``, ``test_vit_relpos``).

Both are the paper's block with a relative position bias on the attention logits
(:mod:`vitkit.models.relpos`) and no absolute E_pos (``abs_pos_embed=False``). The keys show nearly
everything: the bias's kind (``relative_position_bias_table``: a table; ``rel_pos.mlp``: an
MLP, without an ``fc2`` bias in Swin v2's mode), shared or per block, the heads (the table's
or the MLP's last dimension), the grid (a table's rows), BEiT's separate ``q_bias`` /
``v_bias`` (``k_bias=False``), layer scale, the class token and ``fc_norm``. Every registered
entry of either module has LayerNorm eps 1e-6 and the exact GELU. Names:

- BEiT → vitkit: ``blocks.{i}.gamma_{1,2}`` → ``blocks.{i}.ls{1,2}.gamma``,
  ``blocks.{i}.attn.relative_position_bias_table`` →
  ``blocks.{i}.attn.rel_pos.relative_position_bias_table``, ``rel_pos_bias.*`` →
  ``shared_rel_pos.*``; a stored ``relative_position_index`` (the authors' files) is checked
  against vitkit's and dropped. relpos: the identity.
- What the weights cannot say: an MLP bias's grid (the input size; the MLP follows any grid,
  224 px assumed for a bare file), and whether a relpos ViT without layer scale is timm's
  post-norm ``*_rpn_*`` (assumed, said). A timm folder's name and ``model_args`` say both.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import torch
from torch import Tensor

from vitkit.checkpoints.provenance import Assumption, Provenance
from vitkit.errors import VitkitError
from vitkit.models.relpos import relative_position_index
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

_BEIT_KEY = re.compile(r"(^rel_pos_bias\.|\.attn\.relative_position_bias_table$)")
_RELPOS_KEY = re.compile(r"(^shared_rel_pos\.|\.attn\.rel_pos\.)")
_TRAINING = frozenset(
    "drop_rate pos_drop_rate proj_drop_rate attn_drop_rate drop_path_rate head_init_scale "
    "weight_init fix_init device dtype".split()
)
_BEIT_ARGS = frozenset(
    "img_size patch_size in_chans num_classes global_pool embed_dim depth num_heads qkv_bias "
    "mlp_ratio init_values use_abs_pos_emb use_rel_pos_bias use_shared_rel_pos_bias "
    "use_fc_norm swiglu_mlp scale_mlp".split()
)
_RELPOS_ARGS = frozenset(
    "img_size patch_size in_chans num_classes global_pool embed_dim depth num_heads mlp_ratio "
    "qkv_bias qk_norm init_values class_token fc_norm rel_pos_type rel_pos_dim "
    "shared_rel_pos".split()
)


def relpos_family(sd: dict[str, Tensor]) -> str | None:
    """ "beit" or "relpos" when the keys are one of these modules', else None."""
    if any(_BEIT_KEY.search(k) for k in sd):
        return "beit"
    if any(_RELPOS_KEY.search(k) for k in sd):
        return "relpos"
    return None


def writes_relpos(cfg: ViTConfig) -> bool:
    """Whether ``cfg`` is written as one of these modules' models (not timm's ViT)."""
    no_rope = cfg.rope == "none"  # (rotary models, and EVA-1's E_pos with q / v biases, are
    return cfg.rel_pos != "none" or (no_rope and not cfg.abs_pos_embed)  # timm eva.py's)


def _to_vitkit_key(k: str) -> str:
    k = re.sub(r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma", k)
    k = re.sub(
        r"\.attn\.relative_position_bias_table$", ".attn.rel_pos.relative_position_bias_table", k
    )
    return re.sub(r"^rel_pos_bias\.", "shared_rel_pos.", k)


def _shape_config(sd: dict[str, Tensor], fam: str, source: str) -> tuple[ViTConfig, bool]:
    """The config the keys and shapes show, and whether its grid came from the weights."""
    sd = {_to_vitkit_key(k): v for k, v in sd.items() if not k.endswith("relative_position_index")}
    need = ["patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight"]
    missing = [k for k in need if k not in sd]
    if missing:
        raise VitkitError(f"{source}: not a timm {fam} state dict (missing {', '.join(missing)})")
    width, in_chans, ph, pw = sd["patch_embed.proj.weight"].shape
    depth = 1 + max(int(m[1]) for k in sd if (m := re.match(r"^blocks\.(\d+)\.", k)))
    shared = any(k.startswith("shared_rel_pos.") for k in sd)
    where = "shared_rel_pos." if shared else "blocks.0.attn.rel_pos."
    table = sd.get(where + "relative_position_bias_table")
    fc1, fc2 = sd.get(where + "mlp.fc1.weight"), sd.get(where + "mlp.fc2.weight")
    class_token = "cls_token" in sd
    grid: tuple[int, int] | None = None
    if table is not None:
        kind, heads, dim = "bias", table.shape[1], 128
        side = math.isqrt(table.shape[0] - 3 * class_token)
        if side**2 != table.shape[0] - 3 * class_token or side % 2 == 0:
            raise VitkitError(f"{source}: a bias table of {table.shape[0]} rows is no square grid")
        grid = ((side + 1) // 2,) * 2
    elif fc1 is not None and fc2 is not None:
        swin = where + "mlp.fc2.bias" not in sd
        kind, heads, dim = "mlp_swin" if swin else "mlp", fc2.shape[0], fc1.shape[0]
    elif fam == "beit":  # (BEiT without any relative position bias)
        kind, heads, dim = "none", 0, 128
    else:
        raise VitkitError(f"{source}: relative position weights vitkit does not know ({where}*)")
    if "pos_embed" in sd:
        n = sd["pos_embed"].shape[1] - class_token
        if grid is None and math.isqrt(n) ** 2 == n:
            grid = (math.isqrt(n),) * 2
    fc_norm = "fc_norm.weight" in sd
    cfg = ViTConfig(
        image_size=(
            (grid or (14, 14))[0] * ph,
            (grid or (14, 14))[1] * pw,
        ),  # (an MLP bias's grid is not in the weights)
        patch_size=(ph, pw),
        in_chans=in_chans,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        width=width,
        depth=depth,
        num_heads=heads or 1,
        mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0],
        pool="gap" if fc_norm or not class_token else "token",
        class_token=class_token if fc_norm or not class_token else None,
        fc_norm=fc_norm,
        layer_norm_eps=1e-6,
        gelu="none",
        qkv_bias="blocks.0.attn.qkv.bias" in sd or "blocks.0.attn.q_bias" in sd,
        k_bias="blocks.0.attn.q_bias" not in sd,
        layer_scale_init=1e-5 if "blocks.0.ls1.gamma" in sd else None,
        qk_norm="blocks.0.attn.q_norm.weight" in sd,
        abs_pos_embed="pos_embed" in sd,
        rel_pos=kind,  # type: ignore[arg-type]  # (one of the kinds above)
        rel_pos_shared=shared,
        rel_pos_dim=dim,
    )
    return cfg, grid is not None


def relpos_config_provenance(
    sd: dict[str, Tensor],
    hub: dict[str, Any] | None,
    source: str,
    num_heads: int | None = None,
    grid: tuple[int, int] | None = None,
) -> tuple[ViTConfig, Provenance]:
    """The architecture of a BEiT / relpos state dict, from the keys, then (``hub``: a timm
    folder's ``config.json``) its name and ``model_args``; and where each field came from."""
    fam = relpos_family(sd) or ("beit" if hub and "beit" in str(hub.get("architecture")) else "")
    if not fam:
        raise VitkitError(f"{source}: not the weights of timm's beit or relpos ViTs")
    cfg, grid_known = _shape_config(sd, fam, source)
    prov = Provenance().set("weights", cfg.to_dict(), f"timm's {fam} layout")
    if num_heads is not None and cfg.rel_pos != "none" and num_heads != cfg.num_heads:
        raise VitkitError(
            f"{source}: num_heads={num_heads}, but the relative position bias has "
            f"{cfg.num_heads} heads"
        )
    changes: dict[str, Any] = {}
    if cfg.rel_pos == "none":
        if num_heads is None:
            raise VitkitError(f"{source}: the heads are not in these weights; pass num_heads")
        changes["num_heads"] = num_heads
        prov.set("given", ["num_heads"])
    if grid is not None:
        changes["image_size"] = (grid[0] * cfg.patch_size[0], grid[1] * cfg.patch_size[1])
    if hub is None:
        changes.update(_bare_guesses(cfg, fam, grid_known or grid is not None, prov))
    else:
        changes.update(_hub_settings(hub, cfg, fam, source, prov))
    try:
        return cfg.replace(**changes), prov
    except VitkitError as e:
        raise VitkitError(f"{source}: {e}") from None


def _bare_guesses(cfg: ViTConfig, fam: str, grid_known: bool, prov: Provenance) -> dict:
    out: dict[str, Any] = {}
    if not grid_known:
        side = (224 // cfg.patch_size[0]) * cfg.patch_size[0]
        out["image_size"] = (side, side)
        prov.assume(
            Assumption(
                "image_size",
                (side, side),
                "timm's relpos entries' 224 px (the MLP bias follows any grid)",
                "vit_relpos_base_patch16_plus_240 is 240 px, *_plus_rpn_256 256",
                (256, 256),
            )
        )
    if fam == "relpos" and cfg.layer_scale_init is None:
        out["block"] = "post"
        prov.assume(
            Assumption(
                "block",
                "post",
                "timm's relpos entries without layer scale are the post-norm *_rpn_*",
                "a relpos ViT made with init_values=None is pre-norm",
                "pre",
            )
        )
    return out


def _name_size(arch: str) -> int:
    m = re.search(r"_(\d+)$", arch)
    return int(m[1]) if m else 224


def _hub_settings(
    hub: dict[str, Any], cfg: ViTConfig, fam: str, source: str, prov: Provenance
) -> dict[str, Any]:
    """What a timm folder's name and ``model_args`` fix (checked against the weights)."""
    from vitkit.checkpoints.timm.names import check_architecture, relpos_module

    arch = check_architecture(str(hub.get("architecture", "")), source)
    module = relpos_module(arch)
    if module != fam:
        raise VitkitError(f"{source}: {arch} is timm's {module}, but the weights are {fam}'s")
    args = hub.get("model_args") or {}
    if not isinstance(args, dict):
        raise VitkitError(f"{source}: model_args is not a JSON object")
    known = _BEIT_ARGS if fam == "beit" else _RELPOS_ARGS
    odd = sorted(k for k in args if k not in known and k not in _TRAINING)
    if odd:
        raise VitkitError(
            f"{source}: model_args {', '.join(odd)}: not arguments of timm's {fam} vitkit "
            "reads; vitkit will not guess what they change"
        )
    for flag in ("swiglu_mlp", "scale_mlp"):
        if args.get(flag):
            raise VitkitError(f"{source}: {flag}=True is not supported in timm's BEiT")
    kind = str(args.get("rel_pos_type", "mlp"))
    want = "mlp_swin" if kind.startswith("mlp") and "swin" in kind else kind
    want = want if want.startswith("mlp") else "bias"
    if fam == "relpos" and cfg.rel_pos != want:
        raise VitkitError(f"{source}: rel_pos_type={kind!r}, but the weights hold {cfg.rel_pos}")
    out: dict[str, Any] = {}
    size = args.get("img_size", _name_size(arch))
    size = (size, size) if isinstance(size, int) else tuple(size)
    out["image_size"] = size
    pool = args.get("global_pool", hub.get("global_pool"))
    pool = pool if pool is not None else "token" if cfg.pool == "token" else "avg"
    if pool not in ("avg", "token"):
        raise VitkitError(f"{source}: global_pool {pool!r}; vitkit reads 'avg' and 'token'")
    if pool == "token" and not cfg.has_class_token:
        raise VitkitError(f"{source}: global_pool 'token' without a class token")
    if pool == "avg" and cfg.pool == "token":  # a class token, the final norm, then the mean
        out.update(pool="gap", class_token=True)
    if pool == "token" and cfg.pool == "gap":  # fc_norm on the class token
        out.update(pool="token", class_token=None)
    if "_rpn_" in arch:
        out["block"] = "post"
    if cfg.layer_scale_init is not None and args.get("init_values"):
        out["layer_scale_init"] = float(args["init_values"])
    note = f"timm's {arch}"
    prov.set("name", ["gelu", "layer_norm_eps", "block", "image_size"], note)
    prov.set("file", [k for k in ("pool", "image_size") if k in out], "model_args")
    return out


def relpos_to_state_dict(sd: dict[str, Tensor], cfg: ViTConfig, source: str) -> dict[str, Tensor]:
    """timm keys → vitkit keys; a stored ``relative_position_index`` must be vitkit's own."""
    out = {}
    for k, v in sd.items():
        if k.endswith("relative_position_index"):
            want = relative_position_index(cfg.grid_size, cfg.has_class_token)
            if v.numel() != want.numel() or not torch.equal(v.reshape(-1).long(), want.view(-1)):
                raise VitkitError(f"{source}: {k} is not the index of a {cfg.grid_size} grid")
            continue
        out[_to_vitkit_key(k)] = v
    return out


def _beit_writable(cfg: ViTConfig) -> bool:
    return not cfg.k_bias or cfg.rel_pos == "none"


def state_dict_to_relpos(sd: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """vitkit keys → timm's beit / relpos keys (refused where neither module computes it)."""
    why = _write_checks(cfg)
    if why:
        raise VitkitError(why)
    if not _beit_writable(cfg):
        return {k: v.contiguous() for k, v in sd.items()}
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^blocks\.(\d+)\.ls([12])\.gamma$", r"blocks.\1.gamma_\2", k)
        k = k.replace(
            ".attn.rel_pos.relative_position_bias_table", ".attn.relative_position_bias_table"
        )
        out[re.sub(r"^shared_rel_pos\.", "rel_pos_bias.", k)] = v.contiguous()
    return out


def _write_checks(cfg: ViTConfig) -> str:
    """Why timm's beit / relpos cannot hold ``cfg`` ("" when it can)."""
    odd = {k: v for k, v in cfg.family_switches.items() if k not in _WRITABLE}
    if odd or cfg.gelu != "none" or cfg.layer_norm_eps != 1e-6 or cfg.representation_size:
        what = ", ".join(f"{k}={v!r}" for k, v in odd.items()) or "its GELU / eps / pre-logits"
        return (
            f"timm's BEiT and relpos ViTs have the exact GELU, LayerNorm eps 1e-6 and none of "
            f"{what}"
        )
    if _beit_writable(cfg):
        if not cfg.has_class_token or cfg.rel_pos not in ("none", "bias") or cfg.block != "pre":
            return "timm's BEiT has a class token, a table bias and the pre-norm block"
        if cfg.qk_norm or (cfg.qkv_bias and cfg.k_bias):
            return "timm's BEiT has no q/k norm and no key bias"
        if cfg.pool == "gap" and not cfg.fc_norm:
            return "timm's BEiT averages the tokens with fc_norm only (use_fc_norm)"
        return ""
    if cfg.abs_pos_embed:
        return "timm's relpos ViT has no absolute position embedding (abs_pos_embed=False)"
    return ""


_WRITABLE = frozenset(
    "fc_norm layer_scale_init class_token qk_norm block abs_pos_embed rel_pos rel_pos_shared "
    "rel_pos_dim k_bias pool".split()
)


def relpos_architecture(cfg: ViTConfig) -> str:
    if _beit_writable(cfg):
        return "beit_base_patch16_224"
    return (
        "vit_relpos_base_patch16_rpn_224" if cfg.block == "post" else "vit_relpos_base_patch16_224"
    )


def relpos_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """``timm.create_model(relpos_architecture(cfg), **args)`` builds ``cfg`` (every setting;
    no layer scale is ``init_values=0``, as timm's create_model drops a None)."""
    common = {
        "img_size": list(cfg.image_size),
        "patch_size": list(cfg.patch_size),
        "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes,
        "global_pool": "token" if cfg.pool == "token" else "avg",
        "embed_dim": cfg.width,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "mlp_ratio": cfg.mlp_dim / cfg.width,
        "qkv_bias": cfg.qkv_bias,
        "init_values": cfg.layer_scale_init or 0.0,
    }
    if _beit_writable(cfg):
        shared = cfg.rel_pos_shared
        return {
            **common,
            "use_abs_pos_emb": cfg.abs_pos_embed,
            "use_rel_pos_bias": cfg.rel_pos != "none" and not shared,
            "use_shared_rel_pos_bias": shared,
            "use_fc_norm": cfg.fc_norm,
        }
    return {
        **common,
        "qk_norm": cfg.qk_norm,
        "class_token": cfg.has_class_token,
        "fc_norm": cfg.fc_norm,
        "rel_pos_type": cfg.rel_pos,
        "rel_pos_dim": cfg.rel_pos_dim,
        "shared_rel_pos": cfg.rel_pos_shared,
    }


def relpos_hub_config(
    cfg: ViTConfig, preprocess: PreprocessConfig, class_names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The ``config.json`` of a timm folder holding ``cfg`` as a beit / relpos entry."""
    from vitkit.checkpoints.timm.vision_transformer import timm_hub_config

    with warnings.catch_warnings():  # (its eps warning is for timm's ViT; checked above)
        warnings.simplefilter("ignore")
        out = timm_hub_config(cfg.replace(**_PLAIN), preprocess, class_names)
    args = relpos_model_args(cfg)
    out.update(architecture=relpos_architecture(cfg), global_pool=args["global_pool"])
    out["model_args"] = args
    return out


# a config timm_hub_config can describe (its preprocessing part is all that is kept)
_PLAIN = {
    "abs_pos_embed": True,
    "rel_pos": "none",
    "rel_pos_shared": False,
    "k_bias": True,
    "block": "pre",
    "layer_scale_init": None,
    "qkv_bias": True,
}
