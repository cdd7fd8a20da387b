"""Google's ``.npz`` ViT checkpoints ↔ vitkit: explicit, pure array-to-array functions.

Reads every naming era of the official releases:

- **released** (google-research/vision_transformer, flax.nn era; also AugReg): blocks
  ``Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
  MlpBlock_3/Dense_{0,1}}``, ``Transformer/posembed_input/pos_embedding``, ``cls``,
  ``embedding``, ``Transformer/encoder_norm``, ``pre_logits``, ``head``;
- **Linen / big_vision**: ``MultiHeadDotProductAttention_0``, ``LayerNorm_1``, ``MlpBlock_0``;
  big_vision puts ``pos_embedding`` at the top level *without* a class-token row (its class token
  gets no position embedding; vitkit stores a zero row, which is the same function);
- key prefixes ``opt/target/`` (flax.optim checkpoints) and ``params/`` (big_vision); a
  big_vision SigLIP (``params/img/`` and ``params/txt/``) is read for its image tower, the text
  tower and the contrastive temperature and bias (``params/t``, ``params/b``) left out;
- big_vision's attention-pooling head (``MAPHead_0/{probe, MultiHeadDotProductAttention_0,
  LayerNorm_0, MlpBlock_0}``; SigLIP): ``pool="map"``;
- scan-stacked blocks (one ``Transformer/encoderblock`` whose arrays have a leading depth axis);
- bf16 arrays (numpy stores them as 2-byte void ``V2``; they are widened to float32 exactly);
- hybrids: ``conv_root``, ``gn_root``, ``block{s}/unit{u}/{conv,gn}{1,2,3,_proj}``.

The architecture is inferred from the arrays (:func:`npz_config`). Writing
(:func:`state_dict_to_npz`) uses the released naming, which vit_jax, timm and big_vision's
loaders all read; a model with the MAP head, which only big_vision makes, is written in
big_vision's naming instead (Linen layer names, a top-level ``pos_embedding``, scan-stacked
``Transformer/encoderblock``, ``MAPHead_0``), as its SigLIP files are, which timm reads too.

Layouts: flax Dense kernels are ``[in, out]`` (PyTorch: ``[out, in]``); conv kernels are
``[kh, kw, in, out]`` (PyTorch: ``[out, in, kh, kw]``); attention kernels are per projection,
``query/kernel [D, heads, head_dim]`` and ``out/kernel [heads, head_dim, D]``, which vitkit fuses
into one ``qkv`` matrix.
"""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitkit.checkpoints.provenance import Assumption, Provenance
from vitkit.errors import VitkitError
from vitkit.registry.model_config import Pool, ViTConfig

# Block-internal layer names: (first norm, attention, second norm, MLP) per naming era.
_ERAS = {
    "released": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
    "linen": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"),
}
_PREFIXES = ("opt/target/", "params/")
_IMAGE_TOWER = "params/img/"  # big_vision's two-tower (SigLIP / LiT) checkpoints
_MAP = "MAPHead_0"


# ---------------------------------------------------------------------------------------------
# Reading the file


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` as float32 (bf16/fp16 widened), never unpickling anything."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise VitkitError(f"{path}: unreadable .npz ({e})") from None
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # np.load would try it as a pickle
        raise VitkitError(
            f"{path}: not an .npz (a zip archive of .npy arrays); it starts with {magic!r}"
        )
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            arrays = {k: _to_float32(k, _array(z[k], k, path), path) for k in z.files}
    except ValueError as e:
        if "allow_pickle" in str(e) or "pickle" in str(e).lower():
            raise VitkitError(
                f"{path}: contains pickled Python objects; refusing to load them (they could run "
                "code). Re-save the arrays with numpy.savez."
            ) from None
        raise VitkitError(f"{path}: unreadable .npz ({e})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise VitkitError(
            f"{path}: unreadable .npz, truncated or not a zip archive ({e})"
        ) from None
    if not arrays:
        raise VitkitError(f"{path}: the .npz holds no arrays")
    return arrays


def _array(value: Any, key: str, path: Path) -> np.ndarray:
    """An .npz member; numpy hands back a member that is not a ``.npy`` file as bytes."""
    if not isinstance(value, np.ndarray):
        raise VitkitError(f"{path}: member {key!r} is not a .npy array (an .npz holds only arrays)")
    return value


def _to_float32(key: str, a: np.ndarray, path: Path) -> np.ndarray:
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bfloat16 saved without ml_dtypes
        bits = a.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if a.dtype.name == "bfloat16":  # ml_dtypes registered
        return a.astype(np.float32)
    if a.dtype.kind not in "fiu":
        raise VitkitError(f"{path}: array {key!r} has unsupported dtype {a.dtype}")
    return a.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Normalising key names


def canonical_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Strip ``opt/target/`` / ``params/``, unstack scanned blocks, and rename Linen/big_vision
    block layers and the top-level ``pos_embedding`` to the released naming."""
    out: dict[str, np.ndarray] = {}
    if any(k.startswith(_IMAGE_TOWER) for k in arrays):  # the image tower only
        n = len(_IMAGE_TOWER)
        arrays = {k[n:]: v for k, v in arrays.items() if k.startswith(_IMAGE_TOWER)}
    for k, v in arrays.items():
        for prefix in _PREFIXES:
            if k.startswith(prefix):
                k = k[len(prefix) :]
                break
        out[k] = v
    # Scan-stacked blocks: Transformer/encoderblock/... with a leading depth axis.
    stacked = {k: v for k, v in out.items() if k.startswith("Transformer/encoderblock/")}
    if stacked:
        depths = {v.shape[0] for v in stacked.values()}
        if len(depths) != 1:
            raise VitkitError(f"scan-stacked blocks disagree on depth: {sorted(depths)}")
        for k, v in stacked.items():
            del out[k]
            rest = k[len("Transformer/encoderblock/") :]
            for i in range(v.shape[0]):
                out[f"Transformer/encoderblock_{i}/{rest}"] = v[i]
    # Linen / big_vision layer names inside blocks → released names.
    renamed: dict[str, np.ndarray] = {}
    for k, v in out.items():
        m = re.match(r"^(Transformer/encoderblock_\d+)/([^/]+)/(.*)$", k)
        if m and _block_era(out, m[1]) == "linen":
            rel = dict(zip(_ERAS["linen"], _ERAS["released"]))
            k = f"{m[1]}/{rel.get(m[2], m[2])}/{m[3]}"
        renamed[k] = v
    out = renamed
    if "pos_embedding" in out:  # big_vision: top level, no class-token row
        pos = out.pop("pos_embedding")
        if "cls" in out:
            pos = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)
        out["Transformer/posembed_input/pos_embedding"] = pos
    return out


def _block_era(arrays: dict[str, np.ndarray], block: str) -> str:
    if any(k.startswith(f"{block}/MultiHeadDotProductAttention_1/") for k in arrays):
        return "released"
    return "linen"


# ---------------------------------------------------------------------------------------------
# Architecture


def npz_config(arrays: dict[str, np.ndarray], grid: tuple[int, int] | None = None) -> ViTConfig:
    """Infer the :class:`ViTConfig` of canonical arrays (see :func:`canonical_arrays`).

    The position-embedding grid is taken as square unless ``grid`` (rows, columns) is given.
    """
    a = arrays
    _need(
        a,
        "embedding/kernel",
        "Transformer/posembed_input/pos_embedding",
        "Transformer/encoder_norm/scale",
    )
    if any(k.startswith("head_0/") for k in a):
        raise VitkitError(
            "unsupported head 'head_0'; vitkit reads class-token, global-average-pooled and "
            "MAP-head ViTs"
        )
    kh, kw, cin, width = a["embedding/kernel"].shape
    blocks = sorted(
        {int(m[1]) for k in a if (m := re.match(r"^Transformer/encoderblock_(\d+)/", k))}
    )
    if not blocks or blocks != list(range(len(blocks))):
        raise VitkitError(f"encoder blocks are not numbered 0..L-1: found {blocks}")
    attn = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1"
    _need(a, f"{attn}/query/kernel", "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel")
    heads = a[f"{attn}/query/kernel"].shape[1]
    mlp_dim = a["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"].shape[1]
    map_head = f"{_MAP}/probe" in a
    if map_head and a[f"{_MAP}/MlpBlock_0/Dense_0/kernel"].shape[1] != mlp_dim:
        raise VitkitError(f"the {_MAP} MLP is not as wide as the blocks' MLP")
    pool: Pool = "map" if map_head else "token" if "cls" in a else "gap"
    n = a["Transformer/posembed_input/pos_embedding"].shape[1] - ("cls" in a)
    if grid is None:
        side = math.isqrt(n)
        if side * side != n:
            raise VitkitError(
                f"{n} position embeddings are not a square grid; give the grid (rows, columns)"
            )
        grid = (side, side)
    elif grid[0] * grid[1] != n:
        raise VitkitError(f"grid {grid} does not hold the checkpoint's {n} position embeddings")
    resnet_layers, width_factor, in_chans = None, 1.0, cin
    if "conv_root/kernel" in a:
        in_chans = a["conv_root/kernel"].shape[2]
        width_factor = a["conv_root/kernel"].shape[3] / 64
        stages = sorted({int(m[1]) for k in a if (m := re.match(r"^block(\d+)/unit\d+/", k))})
        resnet_layers = tuple(
            len({m[1] for k in a if (m := re.match(rf"^block{s}/unit(\d+)/", k))}) for s in stages
        )
    stride = 1 if resnet_layers is None else 4 * 2 ** max(len(resnet_layers) - 1, 0)
    return ViTConfig(
        image_size=(grid[0] * kh * stride, grid[1] * kw * stride),
        patch_size=(kh, kw),
        in_chans=in_chans,
        num_classes=a["head/kernel"].shape[1] if "head/kernel" in a else 0,
        width=width,
        depth=len(blocks),
        num_heads=heads,
        mlp_dim=mlp_dim,
        pool=pool,
        class_token=True if map_head and "cls" in a else None,
        representation_size=a["pre_logits/kernel"].shape[1] if "pre_logits/kernel" in a else None,
        qkv_bias=f"{attn}/query/bias" in a,
        resnet_layers=resnet_layers,
        resnet_width_factor=width_factor,
    )


# An .npz without a class token or a MAP head does not say how its head pools: vit_jax's
# classifier="gap" and big_vision's default pool_type="gap" average the tokens, but big_vision's
# pool_type="0" feeds the head the first patch token (big_vision/models/vit.py).
GAP_ASSUMED = Assumption(
    "pool",
    "gap",
    "no class token and no MAP head: the mean over the tokens, as vit_jax's classifier='gap' "
    "and big_vision's default pool_type='gap'",
    "a big_vision model trained with pool_type='0' feeds its head the first patch token, "
    "which vitkit does not compute",
    None,
)


def npz_provenance(cfg: ViTConfig, preprocess: tuple[str, ...]) -> Provenance:
    """Where an .npz config's fields came from: the arrays, the official code's fixed choices
    (eps, GELU, block order, ``preprocess``), and the pooling where it was assumed."""
    official = "the official JAX code's (vision_transformer, big_vision)"
    prov = (
        Provenance()
        .set("weights", cfg.to_dict())
        .set("format", ["layer_norm_eps", "gelu", "block", "resnet_eps", *preprocess], official)
    )
    return prov.assume(GAP_ASSUMED) if cfg.pool == "gap" else prov


def _need(a: dict[str, np.ndarray], *keys: str) -> None:
    missing = [k for k in keys if k not in a]
    if missing:
        sample = ", ".join(sorted(a)[:8])
        raise VitkitError(
            f"not a ViT checkpoint in any known naming: missing {', '.join(missing)} "
            f"(it has {len(a)} arrays: {sample}{', ...' if len(a) > 8 else ''})"
        )


# ---------------------------------------------------------------------------------------------
# Arrays → vitkit state dict


def _t(x: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def _conv(k: np.ndarray) -> Tensor:  # [kh, kw, in, out] → [out, in, kh, kw]
    return _t(k.transpose(3, 2, 0, 1))


def _dense(k: np.ndarray) -> Tensor:  # [in, out] → [out, in]
    return _t(k.T)


def npz_to_state_dict(arrays: dict[str, np.ndarray], cfg: ViTConfig) -> dict[str, Tensor]:
    """Canonical arrays → vitkit state dict. Every array must be used: leftovers are an error."""
    a = dict(arrays)
    used: set[str] = set()

    def take(k: str) -> np.ndarray:
        if k not in a:
            raise VitkitError(f"checkpoint is missing {k!r}")
        used.add(k)
        return a[k]

    sd: dict[str, Tensor] = {}
    d = cfg.width
    sd["patch_embed.proj.weight"] = _conv(take("embedding/kernel"))
    sd["patch_embed.proj.bias"] = _t(take("embedding/bias"))
    if cfg.has_class_token:
        sd["cls_token"] = _t(take("cls"))
    sd["pos_embed"] = _t(take("Transformer/posembed_input/pos_embedding"))
    for i in range(cfg.depth):
        b, o = f"Transformer/encoderblock_{i}", f"blocks.{i}"
        ln1, mha, ln2, mlp = _ERAS["released"]
        sd[f"{o}.norm1.weight"] = _t(take(f"{b}/{ln1}/scale"))
        sd[f"{o}.norm1.bias"] = _t(take(f"{b}/{ln1}/bias"))
        qkv = [take(f"{b}/{mha}/{n}/kernel").reshape(d, d).T for n in ("query", "key", "value")]
        sd[f"{o}.attn.qkv.weight"] = _t(np.concatenate(qkv, axis=0))
        if cfg.qkv_bias:
            qkv_b = [take(f"{b}/{mha}/{n}/bias").reshape(d) for n in ("query", "key", "value")]
            sd[f"{o}.attn.qkv.bias"] = _t(np.concatenate(qkv_b))
        sd[f"{o}.attn.proj.weight"] = _t(take(f"{b}/{mha}/out/kernel").reshape(d, d).T)
        sd[f"{o}.attn.proj.bias"] = _t(take(f"{b}/{mha}/out/bias"))
        sd[f"{o}.norm2.weight"] = _t(take(f"{b}/{ln2}/scale"))
        sd[f"{o}.norm2.bias"] = _t(take(f"{b}/{ln2}/bias"))
        for j, fc in enumerate(("fc1", "fc2")):
            sd[f"{o}.mlp.{fc}.weight"] = _dense(take(f"{b}/{mlp}/Dense_{j}/kernel"))
            sd[f"{o}.mlp.{fc}.bias"] = _t(take(f"{b}/{mlp}/Dense_{j}/bias"))
    sd["norm.weight"] = _t(take("Transformer/encoder_norm/scale"))
    sd["norm.bias"] = _t(take("Transformer/encoder_norm/bias"))
    if cfg.pool == "map":
        sd.update(_map_from_npz(take, cfg))
    if cfg.representation_size:
        sd["pre_logits.0.weight"] = _dense(take("pre_logits/kernel"))
        sd["pre_logits.0.bias"] = _t(take("pre_logits/bias"))
    if cfg.num_classes:
        sd["head.weight"] = _dense(take("head/kernel"))
        sd["head.bias"] = _t(take("head/bias"))
    if cfg.is_hybrid:
        sd.update(_resnet_from_npz(a, take, cfg))
    leftover = sorted(set(a) - used)
    if leftover:
        raise VitkitError(
            f"checkpoint arrays not understood: {', '.join(leftover[:10])}"
            f"{f' (+{len(leftover) - 10} more)' if len(leftover) > 10 else ''}"
        )
    return sd


def _map_from_npz(take: Any, cfg: ViTConfig) -> dict[str, Tensor]:
    """big_vision's ``MAPHead_0`` → ``attn_pool.*`` (:class:`vitkit.models.map_head.MAPHead`)."""
    d, mha = cfg.width, f"{_MAP}/MultiHeadDotProductAttention_0"
    kernels = {n: take(f"{mha}/{n}/kernel").reshape(d, d).T for n in ("query", "key", "value")}
    biases = {n: take(f"{mha}/{n}/bias").reshape(d) for n in ("query", "key", "value")}
    sd = {
        "attn_pool.latent": _t(take(f"{_MAP}/probe")),
        "attn_pool.q.weight": _t(kernels["query"]),
        "attn_pool.q.bias": _t(biases["query"]),
        "attn_pool.kv.weight": _t(np.concatenate([kernels["key"], kernels["value"]])),
        "attn_pool.kv.bias": _t(np.concatenate([biases["key"], biases["value"]])),
        "attn_pool.proj.weight": _t(take(f"{mha}/out/kernel").reshape(d, d).T),
        "attn_pool.proj.bias": _t(take(f"{mha}/out/bias")),
        "attn_pool.norm.weight": _t(take(f"{_MAP}/LayerNorm_0/scale")),
        "attn_pool.norm.bias": _t(take(f"{_MAP}/LayerNorm_0/bias")),
    }
    for j, fc in enumerate(("fc1", "fc2")):
        sd[f"attn_pool.mlp.{fc}.weight"] = _dense(take(f"{_MAP}/MlpBlock_0/Dense_{j}/kernel"))
        sd[f"attn_pool.mlp.{fc}.bias"] = _t(take(f"{_MAP}/MlpBlock_0/Dense_{j}/bias"))
    return sd


def _resnet_from_npz(a: dict[str, np.ndarray], take: Any, cfg: ViTConfig) -> dict[str, Tensor]:
    sd = {"patch_embed.stem.conv_root.weight": _conv(take("conv_root/kernel"))}
    sd["patch_embed.stem.gn_root.weight"] = _t(take("gn_root/scale"))
    sd["patch_embed.stem.gn_root.bias"] = _t(take("gn_root/bias"))
    for s, n in enumerate(cfg.resnet_layers or ()):
        for u in range(n):
            src, dst = f"block{s + 1}/unit{u + 1}", f"patch_embed.stem.stages.{s}.{u}"
            for nm in ("1", "2", "3", "_proj"):
                if nm == "_proj" and f"{src}/conv_proj/kernel" not in a:
                    continue
                sd[f"{dst}.conv{nm}.weight"] = _conv(take(f"{src}/conv{nm}/kernel"))
                sd[f"{dst}.gn{nm}.weight"] = _t(take(f"{src}/gn{nm}/scale"))
                sd[f"{dst}.gn{nm}.bias"] = _t(take(f"{src}/gn{nm}/bias"))
    return sd


# ---------------------------------------------------------------------------------------------
# vitkit state dict → arrays (released naming)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def state_dict_to_npz(state_dict: dict[str, Tensor], cfg: ViTConfig) -> dict[str, np.ndarray]:
    """vitkit state dict → arrays in the released naming (what vit_jax and timm load); with the
    MAP head in big_vision's (:func:`to_big_vision`)."""
    other = [k for k in cfg.family_switches if k != "pool" or cfg.pool != "map"]
    if other:
        names = ", ".join(other)
        raise VitkitError(f"the official .npz naming cannot hold {names}; write timm instead")
    sd = {k: _np(v) for k, v in state_dict.items()}
    d, h = cfg.width, cfg.num_heads
    out: dict[str, np.ndarray] = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
    }
    if cfg.has_class_token:
        out["cls"] = sd["cls_token"]
    ln1, mha, ln2, mlp = _ERAS["released"]
    for i in range(cfg.depth):
        b, o = f"Transformer/encoderblock_{i}", f"blocks.{i}"
        out[f"{b}/{ln1}/scale"], out[f"{b}/{ln1}/bias"] = (
            sd[f"{o}.norm1.weight"],
            sd[f"{o}.norm1.bias"],
        )
        out[f"{b}/{ln2}/scale"], out[f"{b}/{ln2}/bias"] = (
            sd[f"{o}.norm2.weight"],
            sd[f"{o}.norm2.bias"],
        )
        qkv = sd[f"{o}.attn.qkv.weight"].reshape(3, d, d)
        for j, n in enumerate(("query", "key", "value")):
            out[f"{b}/{mha}/{n}/kernel"] = qkv[j].T.reshape(d, h, d // h)
            if cfg.qkv_bias:
                out[f"{b}/{mha}/{n}/bias"] = sd[f"{o}.attn.qkv.bias"].reshape(3, h, d // h)[j]
        out[f"{b}/{mha}/out/kernel"] = sd[f"{o}.attn.proj.weight"].T.reshape(h, d // h, d)
        out[f"{b}/{mha}/out/bias"] = sd[f"{o}.attn.proj.bias"]
        for j, fc in enumerate(("fc1", "fc2")):
            out[f"{b}/{mlp}/Dense_{j}/kernel"] = sd[f"{o}.mlp.{fc}.weight"].T
            out[f"{b}/{mlp}/Dense_{j}/bias"] = sd[f"{o}.mlp.{fc}.bias"]
    if cfg.pool == "map":
        out.update(_map_to_npz(sd, cfg))
    if cfg.representation_size:
        out["pre_logits/kernel"] = sd["pre_logits.0.weight"].T
        out["pre_logits/bias"] = sd["pre_logits.0.bias"]
    if cfg.num_classes:
        out["head/kernel"] = sd["head.weight"].T
        out["head/bias"] = sd["head.bias"]
    if cfg.is_hybrid:
        stem = "patch_embed.stem."
        for k, v in sd.items():
            if not k.startswith(stem):
                continue
            k = k[len(stem) :]
            m = re.match(r"^stages\.(\d+)\.(\d+)\.(conv|gn)(\d|_proj)\.(weight|bias)$", k)
            if m:
                name = f"block{int(m[1]) + 1}/unit{int(m[2]) + 1}/{m[3]}{m[4]}"
            else:
                name, _, _ = k.rpartition(".")
            leaf = "kernel" if name.split("/")[-1].startswith("conv") else None
            if leaf:
                out[f"{name}/kernel"] = v.transpose(2, 3, 1, 0)
            else:
                out[f"{name}/{'scale' if k.endswith('weight') else 'bias'}"] = v
    out = to_big_vision(out) if cfg.pool == "map" else out
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _map_to_npz(sd: dict[str, np.ndarray], cfg: ViTConfig) -> dict[str, np.ndarray]:
    d, h = cfg.width, cfg.num_heads
    mha = f"{_MAP}/MultiHeadDotProductAttention_0"
    kv_w, kv_b = sd["attn_pool.kv.weight"].reshape(2, d, d), sd["attn_pool.kv.bias"].reshape(2, d)
    weights = {"query": sd["attn_pool.q.weight"], "key": kv_w[0], "value": kv_w[1]}
    biases = {"query": sd["attn_pool.q.bias"], "key": kv_b[0], "value": kv_b[1]}
    out = {f"{_MAP}/probe": sd["attn_pool.latent"]}
    for n in ("query", "key", "value"):
        out[f"{mha}/{n}/kernel"] = weights[n].T.reshape(d, h, d // h)
        out[f"{mha}/{n}/bias"] = biases[n].reshape(h, d // h)
    out[f"{mha}/out/kernel"] = sd["attn_pool.proj.weight"].T.reshape(h, d // h, d)
    out[f"{mha}/out/bias"] = sd["attn_pool.proj.bias"]
    out[f"{_MAP}/LayerNorm_0/scale"] = sd["attn_pool.norm.weight"]
    out[f"{_MAP}/LayerNorm_0/bias"] = sd["attn_pool.norm.bias"]
    for j, fc in enumerate(("fc1", "fc2")):
        out[f"{_MAP}/MlpBlock_0/Dense_{j}/kernel"] = sd[f"attn_pool.mlp.{fc}.weight"].T
        out[f"{_MAP}/MlpBlock_0/Dense_{j}/bias"] = sd[f"attn_pool.mlp.{fc}.bias"]
    return out


def to_big_vision(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Released naming → big_vision's: Linen layer names inside the blocks, the blocks stacked
    into one scanned ``Transformer/encoderblock`` (leading depth axis), ``pos_embedding`` at the
    top level (a class token's row dropped: big_vision gives it none, so it must be zero)."""
    renames = dict(zip(_ERAS["released"], _ERAS["linen"]))
    out: dict[str, np.ndarray] = {}
    blocks: dict[str, dict[int, np.ndarray]] = {}
    for k, v in arrays.items():
        m = re.match(r"^Transformer/encoderblock_(\d+)/([^/]+)/(.*)$", k)
        if m:
            blocks.setdefault(f"{renames[m[2]]}/{m[3]}", {})[int(m[1])] = v
        else:
            out[k] = v
    for rest, by_index in blocks.items():
        stack = [by_index[i] for i in sorted(by_index)]
        out[f"Transformer/encoderblock/{rest}"] = np.stack(stack)
    pos = out.pop("Transformer/posembed_input/pos_embedding")
    if "cls" in out:
        if np.any(pos[:, 0]):
            raise VitkitError(
                "big_vision gives the class token no position embedding; this model's is not zero"
            )
        pos = pos[:, 1:]
    out["pos_embedding"] = pos
    return out
