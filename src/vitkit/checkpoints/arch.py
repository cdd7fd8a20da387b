"""What a timm architecture name says about its weights, checked against the weights.

A timm folder's ``config.json`` names its ``architecture``; ``vitkit.load(path, arch=NAME)`` and
``--arch NAME`` name one for a file that says nothing. timm builds that entry (its own settings,
then the folder's ``model_args``) and loads the weights strictly. vitkit reads the weights with
what the name fixes, so a name whose entry has another layout than the weights (a class token,
position embeddings, a SwiGLU MLP, layer scale, a MAP head, fc_norm) would
be read as that entry with no word. :func:`check_name_against_weights` refuses it, naming the keys
that contradict the name. Sizes (width, depth, patch, MLP width) are read from the weights, as
they always were: they leave nothing to guess. ``timm/entries.json`` holds, for every
registered entry vitkit reads,
the layout facts of its state dict (:func:`layout_facts`) and the settings its name fixes;
``bench/timm_entries.py`` writes it from the installed timm and ``tests/test_arch_names.py``
checks it against timm.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from vitkit.errors import AssumptionWarning, VitkitError

# layout facts a state dict's key names and shapes show, and the keys that show them
FACT_KEYS: dict[str, str] = {
    "width": "patch_embed.proj.weight",
    "patch": "patch_embed.proj.weight",
    "depth": "blocks.N",
    "class_token": "cls_token",
    "reg_tokens": "reg_token",
    "pos_embed": "pos_embed",
    "pos_prefix": "pos_embed (rows beyond the patch grid)",
    "norm_pre": "norm_pre.weight",
    "norm": "norm.weight",
    "fc_norm": "fc_norm.weight",
    "attn_pool": "attn_pool.*",
    "layer_scale": "blocks.0.ls1.gamma / blocks.0.gamma_1",
    "qkv_bias": "blocks.0.attn.qkv.bias / blocks.0.attn.q_bias",
    "qk_norm": "blocks.0.attn.q_norm.weight",
    "mlp": "blocks.0.mlp.*",
    "mlp_hidden": "blocks.0.mlp.fc1.weight / fc1_x.weight / fc2.weight",
    "attn_norm": "blocks.0.attn.norm.weight",
    "mlp_norm": "blocks.0.mlp.norm.weight",
}

# timm VisionTransformer / Eva arguments and the facts they change: a folder's model_args that
# sets one makes timm build that fact from the argument, not from the name's entry
_ARG_FACTS: dict[str, tuple[str, ...]] = {
    "embed_dim": ("width", "mlp_hidden"),
    "patch_size": ("patch",),
    "depth": ("depth",),
    "mlp_ratio": ("mlp_hidden",),
    "class_token": ("class_token", "pos_embed", "pos_prefix"),
    "reg_tokens": ("reg_tokens", "pos_prefix"),
    "num_reg_tokens": ("reg_tokens", "pos_prefix"),
    "no_embed_class": ("pos_embed", "pos_prefix"),
    "pos_embed": ("pos_embed",),
    "use_abs_pos_emb": ("pos_embed",),
    "pre_norm": ("norm_pre",),
    "final_norm": ("norm", "fc_norm"),
    "fc_norm": ("norm", "fc_norm"),
    "global_pool": ("norm", "fc_norm", "attn_pool"),
    "use_fc_norm": ("norm", "fc_norm"),
    "init_values": ("layer_scale",),
    "qkv_bias": ("qkv_bias",),
    "qk_norm": ("qk_norm",),
    "mlp_layer": ("mlp", "mlp_hidden", "mlp_norm"),
    "swiglu_mlp": ("mlp", "mlp_hidden"),
    "scale_mlp": ("mlp_norm",),
    "scale_attn_norm": ("attn_norm",),
    "scale_mlp_norm": ("mlp_norm",),
    "scale_attn_inner": ("attn_norm",),
    "use_pre_transformer_norm": ("norm_pre",),
    "use_post_transformer_norm": ("norm", "fc_norm"),
    "qkv_fused": ("qkv_bias",),
    "attn_only_layer_scale": ("layer_scale",),
    "swiglu_align_to": ("mlp_hidden",),
    "attn_type": ("qkv_bias", "qk_norm", "attn_norm"),
}
_POOLED = ("avg", "avgmax", "max")
# sizes the weights fix exactly whatever the name; but the entry's heads are its width's, so
# another width needs its heads given (:func:`check_name_against_weights`)
_SIZES = frozenset({"width", "patch", "depth", "mlp_hidden"})


def pool_contradictions(shapes: dict[str, tuple[int, ...]], args: dict[str, Any]) -> list[str]:
    """timm's VisionTransformer builds ``fc_norm`` (and no final ``norm``) for a pooled
    ``global_pool`` unless ``fc_norm`` is given: ``args`` (the name's and the folder's
    merged) against the weights."""
    pool = args.get("global_pool")
    if pool is None:
        return []
    fc = args.get("fc_norm")
    fc = pool in _POOLED if fc is None else bool(fc)
    has_fc = "fc_norm.weight" in shapes
    if fc == has_fc:
        return []
    why = f"global_pool {pool!r}" + (
        f" with fc_norm={args['fc_norm']}" if "fc_norm" in args else ""
    )
    return [
        f"timm builds {why} {'with' if fc else 'without'} fc_norm.weight, the weights have "
        f"{'none' if fc else 'it'}"
    ]


def entry_fc_norm(arch: str, entry_pool: Any) -> dict[str, bool]:
    """``{"fc_norm": value}`` where timm's ``arch`` entry passes fc_norm itself (its layout's
    fc_norm is not what its own ``entry_pool`` would build), else ``{}``."""
    entry = entries().get(arch)
    if entry is None:
        return {}
    layout = entry["layout"]
    if entry_pool is None:  # an entry with no class token and no MAP head pools the patches
        pooling = not layout["class_token"] and not layout["attn_pool"]
        entry_pool = "avg" if pooling else "token"
    has = bool(layout["fc_norm"])
    return {} if has == (entry_pool in _POOLED) else {"fc_norm": has}


def layout_facts(shapes: dict[str, tuple[int, ...]], img_size: Any = None) -> dict[str, Any]:
    """The layout a timm ViT / Eva state dict shows (``shapes``: key -> shape); with the input
    ``img_size`` also how many position-embedding rows are not the patch grid's."""

    def has(k: str) -> bool:
        return k in shapes

    proj = shapes.get("patch_embed.proj.weight")
    depth = 1 + max(
        (int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1
    )
    mlp_keys = {k.split(".", 3)[3] for k in shapes if k.startswith("blocks.0.mlp.")}
    if any(k.startswith("fc1_g") for k in mlp_keys):
        mlp, hidden = "swiglu", shapes.get("blocks.0.mlp.fc1_x.weight", (0,))[0]
    elif any(k.startswith("w12") for k in mlp_keys):
        mlp, hidden = "swiglu_packed", shapes.get("blocks.0.mlp.w3.weight", (0, 0))[1]
    else:
        fc1 = shapes.get("blocks.0.mlp.fc1.weight", (0, 0))
        fc2 = shapes.get("blocks.0.mlp.fc2.weight", (0, 0))
        mlp, hidden = ("glu" if fc1[0] == 2 * fc2[1] and fc1[0] else "mlp"), fc2[1]
    reg = shapes.get("reg_token")
    pos, prefix = shapes.get("pos_embed"), None
    hybrid = any(k.startswith("patch_embed.backbone.") for k in shapes)  # a stem's stride
    if pos is not None and proj is not None and img_size is not None and not hybrid:
        h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
        prefix = pos[1] - (int(h) // proj[2]) * (int(w) // proj[3])
    return {
        "width": proj[0] if proj else None,
        "patch": list(proj[2:]) if proj else None,
        "depth": depth,
        "class_token": has("cls_token"),
        "reg_tokens": reg[1] if reg else 0,
        "pos_embed": has("pos_embed"),
        "pos_prefix": prefix,
        "norm_pre": has("norm_pre.weight"),
        "norm": has("norm.weight"),
        "fc_norm": has("fc_norm.weight"),
        "attn_pool": any(k.startswith("attn_pool.") for k in shapes),
        "layer_scale": has("blocks.0.ls1.gamma") or has("blocks.0.gamma_1"),
        "qkv_bias": has("blocks.0.attn.qkv.bias") or has("blocks.0.attn.q_bias"),
        "qk_norm": has("blocks.0.attn.q_norm.weight"),
        "mlp": mlp,
        "mlp_hidden": hidden,
        "attn_norm": has("blocks.0.attn.norm.weight"),
        "mlp_norm": has("blocks.0.mlp.norm.weight"),
    }


@cache
def entries() -> dict[str, dict[str, Any]]:
    """Every registered timm entry vitkit reads: ``{"layout": facts, "settings": {...}}``."""
    text = resources.files("vitkit.checkpoints.timm").joinpath("entries.json").read_text()
    return dict(json.loads(text)["entries"])


def _said(fact: str, want: Any, seen: Any) -> str:
    if isinstance(want, bool):
        where = ("in" if want else "not in", "in" if seen else "not in")
        return f"{FACT_KEYS[fact]}: {where[0]} the entry, {where[1]} the weights"
    return f"{FACT_KEYS[fact]}: {fact} {want} in the entry, {seen} in the weights"


def name_contradictions(
    arch: str, shapes: dict[str, tuple[int, ...]], model_args: dict[str, Any]
) -> list[str]:
    """What the weights show against what timm's ``arch`` entry builds (less what the folder's
    ``model_args`` set): one phrase per contradicted fact, naming its keys."""
    entry = entries().get(arch)
    if entry is None:
        return []
    given = {f for a in model_args for f in _ARG_FACTS.get(a, ())}
    # (the prefix rows where the folder says its input; else vitkit reads the grid from the rows)
    want, seen = entry["layout"], layout_facts(shapes, model_args.get("img_size"))
    if seen.get("pos_prefix") is None:
        given.add("pos_prefix")
    if seen["width"] is None:  # a hybrid's stem or another layout: the converters decide
        return []
    out = []
    # timm's EVA / EVA-02 keep their q / v biases apart (no k bias); its VisionTransformer fuses
    # them; the other entries of its Eva class (RoPE ViTs, DINOv3, PE) may have either
    fused, split = "blocks.0.attn.qkv.bias" in shapes, "blocks.0.attn.q_bias" in shapes
    eva_class = arch in _eva_names()
    apart = eva_class and arch.startswith(("eva_", "eva02_"))
    if "qkv_bias" not in given and (fused if apart else split and not eva_class):
        key = "blocks.0.attn.qkv.bias" if fused else "blocks.0.attn.q_bias"
        theirs = "q_bias / v_bias" if fused else "qkv.bias"
        out.append(f"{key}: in the weights, not in the entry (its biases are {theirs})")
    for fact, value in want.items():
        if fact in _SIZES or fact in given or seen.get(fact) == value or value is None:
            continue
        if fact == "pos_prefix":  # the rows the input size leaves: say what decides them
            out.append(_rows_said(shapes, model_args["img_size"], value, want["patch"]))
            continue
        out.append(_said(fact, value, seen[fact]))
    return out


def _rows_said(shapes: dict[str, tuple[int, ...]], size: Any, prefix: int, patch: Any) -> str:
    """A table whose rows do not fit the input size: its rows, the grid the size makes with
    the weights' patch, and the patch where it is not the name's (the real cause then)."""
    rows, proj = shapes["pos_embed"][1], shapes["patch_embed.proj.weight"]
    h, w = (size, size) if isinstance(size, int) else size
    grid = (int(h) // proj[2], int(w) // proj[3])
    said = (
        f"pos_embed: {rows} rows, not the entry's {prefix} prefix + {grid[0]}x{grid[1]} patches "
        f"of a {h}x{w} input with patch {proj[2]}x{proj[3]}"
    )
    if list(proj[2:]) != list(patch):
        return (
            f"{said}: the weights' patch is {proj[2]}x{proj[3]}, the name's {patch[0]}x{patch[1]}"
        )
    return f"{said}: the weights were trained at another input size (img_size in model_args)"


def check_name_against_weights(
    arch: str,
    shapes: dict[str, tuple[int, ...]],
    model_args: dict[str, Any],
    source: str,
    pool_args: dict[str, Any] | None = None,
    heads_given: bool = False,
) -> None:
    """Refuse a timm name whose entry the weights contradict (:func:`name_contradictions`, and
    with ``pool_args`` given, :func:`pool_contradictions`)."""
    bad = name_contradictions(arch, shapes, model_args)
    entry, proj = entries().get(arch), shapes.get("patch_embed.proj.weight")
    width = None if entry is None or proj is None else entry["layout"]["width"]
    other = width is not None and proj is not None and proj[0] != width
    if other and not heads_given and "num_heads" not in model_args:
        bad.append(
            f"patch_embed.proj.weight: width {proj[0] if proj else None}, the entry's {width}, "
            "so the entry's heads do not apply: give num_heads (--num-heads N, or model_args)"
        )
    bad += pool_contradictions(shapes, pool_args) if pool_args is not None else []
    if bad:
        raise VitkitError(
            f"{source}: architecture {arch!r} does not match the weights ({'; '.join(bad)}); "
            "timm refuses these weights for it too: name the architecture they were trained as "
            "(--arch NAME), or give the settings in model_args"
        )


def named_hub(arch: str, path: Any, fmt: str, read_json: Callable[[Any], Any]) -> dict[str, Any]:
    """The timm ``config.json`` that ``arch=NAME`` states for the file at ``path``: the entry's
    name and its default ``pretrained_cfg`` (its input and preprocessing). A folder that names
    its own architecture must name the same one; other formats say theirs."""
    name = arch.split(".")[0]
    if name not in entries():
        raise VitkitError(
            f"{path}: arch={arch!r} is not a timm entry vitkit reads (a registered "
            f"VisionTransformer or eva.py name of timm {_timm_version()})"
        )
    if fmt != "timm":
        raise VitkitError(
            f"{path}: arch={arch!r} names a timm entry for a timm state dict; this is a {fmt} "
            "checkpoint, which says its own architecture"
        )
    if path.is_dir():
        own = (read_json(path / "config.json") or {}).get("architecture", "")
        if str(own).split(".")[0] != name:
            raise VitkitError(
                f"{path}: its config.json names {own!r}, not {name!r}; a folder says its own "
                "architecture (arch= is for a file that does not)"
            )
    pcfg = dict(entries()[name]["pretrained_cfg"])
    size = {"img_size": list(pcfg["input_size"][1:])} if "input_size" in pcfg else {}
    return {"architecture": name, "model_args": size, "pretrained_cfg": pcfg}


def named_checkpoint(
    path: Any,
    sd: dict[str, Any],
    hub: dict[str, Any],
    num_heads: int | None,
    read_eva: Callable[..., Any],
    read_vit: Callable[..., Any],
    grid: tuple[int, int] | None = None,
    image_size: Any = None,
) -> Any:
    """A bare timm state dict read as the entry ``hub`` names: the weights checked against the
    entry, then read as a folder naming it would be, at the input size their position
    embeddings fill (:func:`weights_input_size`; ``grid``: theirs where not square)."""
    name = hub["architecture"]
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    check_name_against_weights(name, shapes, {}, str(path), None, num_heads is not None)
    size = weights_input_size(name, shapes, grid, str(path), image_size)
    if size is not None:  # (the grid is a free setting of a name, as timm's img_size=)
        pcfg = {**hub["pretrained_cfg"], "input_size": [3, *size]}
        hub = {**hub, "model_args": {**hub["model_args"], "img_size": size}, "pretrained_cfg": pcfg}
    eva = name in _eva_names()
    ckpt = read_eva(path, hub, sd, num_heads) if eva else read_vit(path, hub, sd, num_heads)
    ckpt.meta = {**ckpt.meta, "timm_arch": name}
    prov = ckpt.provenance
    if prov is not None:
        note = f"timm's {name} (arch=)"
        prov.set("name", [f for f, s in prov.sources.items() if s == "file"], note)
        prov.assumptions = []
    return ckpt


def weights_input_size(
    name: str,
    shapes: dict[str, tuple[int, ...]],
    grid: tuple[int, int] | None,
    source: str,
    image_size: Any = None,
) -> list[int] | None:
    """The input size [H, W] at which timm's entry ``name`` has the weights' position
    embeddings, as ``timm.create_model(name, img_size=...)`` takes it: the entry's own where
    they fit it, else ``grid`` x the weights' patch, else the square grid their rows make (said
    in one line); None where the weights have no table to fit. A patch other than the name's is
    said too: it is the real cause of a table that fits no grid of the name."""
    entry = entries()[name]
    pos, proj = shapes.get("pos_embed"), shapes.get("patch_embed.proj.weight")
    prefix = entry["layout"]["pos_prefix"]
    own = list(entry["pretrained_cfg"].get("input_size", [3, 224, 224])[1:])
    if pos is None or proj is None or prefix is None or any(".backbone." in k for k in shapes):
        return None
    ph, pw = proj[2], proj[3]
    theirs = entry["layout"]["patch"]
    patch = "" if [ph, pw] == list(theirs) else (
        f"; the weights' patch is {ph}x{pw}, the name's {theirs[0]}x{theirs[1]} (timm refuses "
        "these weights for this name; vitkit reads them with their own patch)"
    )  # fmt: skip
    n = pos[1] - prefix
    if grid is None and image_size is not None:  # the size given, where the rows fill it
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        grid = (h // ph, w // pw) if (h // ph) * (w // pw) == n else None
    if grid is not None and grid[0] * grid[1] != n:
        raise VitkitError(
            f"{source}: pos_embed holds {pos[1]} rows, {prefix} prefix and {n} patches, not a "
            f"{grid[0]}x{grid[1]} grid{patch}"
        )
    if grid is None and (own[0] // ph) * (own[1] // pw) == n:
        if patch:
            warnings.warn(f"{source}: {name}{patch}", AssumptionWarning, stacklevel=5)
        return None if not patch else own
    side = math.isqrt(max(n, 0))
    if grid is None and (n <= 0 or side * side != n):
        raise VitkitError(
            f"{source}: pos_embed holds {pos[1]} rows: {prefix} prefix rows ({name}'s) leave "
            f"{n} for the patches, which fill no square grid{patch}; give grid=(rows, columns) "
            "(--grid) for a non-square one"
        )
    rows, cols = grid or (side, side)
    if grid is None:
        warnings.warn(
            f"{source}: position embeddings for a {rows}x{cols} grid, not {name}'s "
            f"{own[0] // theirs[0]}x{own[1] // theirs[1]}: read at {rows * ph}x{cols * pw} px "
            f"(a square grid assumed; grid=(rows, columns) for another){patch}",
            AssumptionWarning,
            stacklevel=5,
        )
    return [rows * ph, cols * pw]


@cache
def _eva_names() -> frozenset[str]:
    from vitkit.checkpoints.timm.names import EVA_NAMES

    return EVA_NAMES


def _timm_version() -> str:
    text = resources.files("vitkit.checkpoints.timm").joinpath("entries.json").read_text()
    return str(json.loads(text)["timm"])
