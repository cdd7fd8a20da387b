"""The reference side of bench/coverage.py: which models, and their small random-weight copies.

- timm: every model registered in :data:`TIMM_MODULES`, built by timm's own entry point with
  depth 2, a 2x2 patch grid (naflexvit: a 2x2 learned position grid and images of 2x2 patches),
  10 classes, and widths above :data:`NATIVE_WIDTH` scaled to 32 per head (heads, MLP ratio and
  every other switch of the entry kept);
- the native-width heads check of a bare state dict: the entry at its own width and depth 1 on
  the meta device, whose shapes go through vitkit's config inference with no hint;
- Hugging Face: the ViT-family classes (those vitkit implements and those it must refuse),
  built tiny, and the output each is compared on.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any

import torch

from vitkit.checkpoints.timm.vision_transformer import timm_config_provenance
from vitkit.errors import AssumptionWarning, VitkitError

TIMM_MODULES = (
    "vision_transformer",
    "deit",
    "vision_transformer_hybrid",
    "eva",
    "naflexvit",
    "beit",
    "vision_transformer_relpos",
)
NATIVE_WIDTH = 384  # widths up to this are kept; wider models get 32 per head
GRID = 2  # patches per side
NUM_CLASSES = 10
ZEROS_LIMIT = 30_000_000  # elements: the most the heads check allocates where meta fails


def timm_names(timm: Any) -> list[tuple[str, str]]:
    """(timm module, model name) of every model registered in :data:`TIMM_MODULES`."""
    return [(m, n) for m in TIMM_MODULES for n in timm.list_models(module=m)]


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved by N(0, 0.05): no zero bias, layer scale or head left to hide a
    mismatch."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    return model.eval()


def heads_of(model: Any) -> int | None:
    """The heads of the first block: of its attention, one branch's, or the block's own."""
    block = model.blocks[0]
    attn = block.attns[0].attn if hasattr(block, "attns") else getattr(block, "attn", block)
    return getattr(attn, "num_heads", None)


def heads_hint_ok(name: str, heads: int | None, sd: dict[str, torch.Tensor]) -> bool:
    """Whether a hub folder of ``name`` at its native width, without ``num_heads`` in its
    ``model_args`` (as timm's Hub folders are), gets timm's number of heads from vitkit: the
    reader of that folder kind run on the entry's own (meta-device) weights. A refusal is not
    a wrong count."""
    from vitkit.checkpoints.timm.beit_relpos import relpos_config_provenance
    from vitkit.checkpoints.timm.eva import eva_hub_config_provenance
    from vitkit.checkpoints.timm.hub_folder import timm_hub_config_provenance
    from vitkit.checkpoints.timm.names import EVA_NAMES, relpos_module

    if heads is None:
        return True
    hub = {"architecture": name}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if name in EVA_NAMES:
                cfg, _ = eva_hub_config_provenance(hub, sd, name)
            elif relpos_module(name):
                cfg, _ = relpos_config_provenance(sd, hub, name)
            else:
                cfg, _ = timm_hub_config_provenance(hub, sd, name)
    except VitkitError:
        return True
    return cfg.num_heads == heads


def _patch_grid(model: Any) -> tuple[tuple[int, int], dict[str, Any]]:
    """(the stride of one token in pixels, extra arguments for a 2x2 grid)."""
    if hasattr(model, "embeds"):  # naflexvit: any image size; a 2x2 learned position grid
        p = model.embeds.patch_size
        extra = {}
        if getattr(model.embeds, "pos_embed_grid_size", None) is not None:
            extra["pos_embed_grid_size"] = (GRID, GRID)
        return (p[0], p[1]), extra
    pe = model.patch_embed
    grid = pe.grid_size if hasattr(pe, "grid_size") else pe.feat_size
    img = pe.img_size
    return (img[0] // grid[0], img[1] // grid[1]), {}


def _depth_args(timm: Any, name: str, depth: int) -> dict[str, Any]:
    """Arguments for ``name`` at ``depth`` beyond ``depth``: a per-block ``num_kv_heads``
    (Sapiens2) keeps the first block's and a middle block's, so a small copy keeps both kinds."""
    try:
        with torch.device("meta"):
            timm.create_model(name, depth=1)
        return {}
    except AssertionError as e:
        if "num_kv_heads" not in str(e):
            raise
    with torch.device("meta"):
        full = timm.create_model(name)
    kv = [getattr(b.attn, "num_kv_heads", None) for b in full.blocks]
    picks = [kv[0], kv[len(kv) // 2]] + [kv[0]] * max(depth - 2, 0)
    return {"num_kv_heads": tuple(picks[:depth])}


def small_timm_args(timm: Any, name: str) -> dict[str, Any]:
    """timm.create_model keyword arguments for a small copy of ``name``: depth 2, a 2x2 grid,
    10 classes, and a narrower width (32 per head) where the entry's is above NATIVE_WIDTH.
    Private keys (not timm arguments): ``_heads_hint_ok`` (:func:`heads_hint_ok` at the native
    width), ``_heads`` (timm's heads), ``_width`` (the native width), ``_scaled`` (whether the
    width was scaled down)."""
    with torch.device("meta"):
        probe = timm.create_model(name, depth=1, **_depth_args(timm, name, 1))
    width = probe.embed_dim
    heads = heads_of(probe)
    stride, extra = _patch_grid(probe)
    args: dict[str, Any] = {
        "_heads_hint_ok": heads_hint_ok(name, heads, probe.state_dict()),
        "_heads": heads,
        "_width": width,
        "_scaled": False,
        "depth": 2,
        "img_size": (GRID * stride[0], GRID * stride[1]),
        "num_classes": NUM_CLASSES,
        **extra,
        **_depth_args(timm, name, 2),
    }
    if width > NATIVE_WIDTH and heads:
        scaled = {**args, "embed_dim": 32 * heads, "num_heads": heads, "_scaled": True}
        try:  # a stem whose output width is fixed (vit_base_mci_224) keeps the native width
            with torch.device("meta"):
                timm.create_model(name, **timm_kwargs(scaled))
            args = scaled
        except Exception:  # noqa: BLE001, S110
            pass
    return args


def timm_kwargs(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k[0] != "_"}


def native_heads_check(timm: Any, name: str) -> dict[str, Any]:
    """What vitkit's config inference makes of the heads of a bare state dict of ``name`` at its
    native width (the entry at depth 1 on the meta device, its state dict's shapes as meta
    tensors, or zeros where meta fails and they are small), with no hint.

    ``{"timm": H, "vitkit": H' | None, "warned": bool, "result": ...}``; result is ``ok``
    (H' == H), ``warned`` (H' != H, an AssumptionWarning naming num_heads), ``silent`` (H' != H,
    unsaid), ``refused: <reason>`` or ``unknown: <why>``."""
    try:
        with torch.device("meta"):
            model = timm.create_model(name, depth=1, **_depth_args(timm, name, 1))
        heads = heads_of(model)
        shapes = {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}
    except Exception as e:  # noqa: BLE001
        return {"result": f"unknown: {first_line(e)}"}
    out: dict[str, Any] = {"timm": heads, "width": getattr(model, "embed_dim", None)}
    del model
    said: list[str] = []
    cfg = None
    for device in ("meta", "zeros"):
        if device == "zeros" and sum(s.numel() for s, _ in shapes.values()) > ZEROS_LIMIT:
            out["result"] = "unknown: meta tensors fail and zeros would be too large"
            return out
        make = torch.zeros if device == "zeros" else partial(torch.empty, device="meta")
        sd = {k: make(s, dtype=d) for k, (s, d) in shapes.items()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # (read_checkpoint says the provenance's assumptions as warnings)
                cfg, prov = timm_config_provenance(sd, source=name)
                prov.warn(name)
            except VitkitError as e:
                out["result"] = f"refused: {str(e).strip().splitlines()[0]}"
                return out
            except Exception as e:  # noqa: BLE001 - meta tensors: try zeros
                if device == "zeros":
                    out["result"] = f"unknown: {first_line(e)}"
                    return out
                continue
        said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
        break
    assert cfg is not None
    out["vitkit"] = cfg.num_heads
    out["warned"] = any("num_heads" in s for s in said)
    if heads is None or cfg.num_heads == heads:
        out["result"] = "ok"
    else:
        out["result"] = "warned" if out["warned"] else "silent"
    return out


# ---------------------------------------------------------------------------------------------
# Hugging Face classes

_HF_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_HF_IMAGE = dict(image_size=32, patch_size=8)
_REG4 = {"num_register_tokens": 4}
HF_CLASSES: dict[str, dict[str, Any]] = {
    # class: config overrides beyond _HF_TINY + _HF_IMAGE (the config class is the class's own)
    "ViTModel": {},
    "ViTForImageClassification": {},
    "DeiTModel": {},
    "DeiTForImageClassification": {},
    "DeiTForImageClassificationWithTeacher": {},
    "Dinov2Model": {},
    "Dinov2ForImageClassification": {},
    "Dinov2WithRegistersModel": _REG4,
    "Dinov2WithRegistersForImageClassification": _REG4,
    "ViTMAEModel": {"mask_ratio": 0.0},
    "ViTMAEForPreTraining": {"mask_ratio": 0.0},
    "CLIPVisionModel": {},
    "CLIPVisionModelWithProjection": {"projection_dim": 16},
    "SiglipVisionModel": {},
    "DINOv3ViTModel": _REG4,
    "Siglip2VisionModel": {"image_size": None, "num_patches": 16},
    # BEiT's two layouts: pre-trained (a shared bias, E_pos), fine-tuned (a bias per layer)
    "BeitModel": {
        "use_shared_relative_position_bias": True,
        "use_absolute_position_embeddings": True,
    },
    "BeitForImageClassification": {"use_relative_position_bias": True},
    # ViT-family image encoders vitkit does not implement: refused, never silent
    "Data2VecVisionModel": {},
    "IJepaModel": {},
    "ViTMSNModel": {},
    "ViTMSNForImageClassification": {},
    "Aimv2VisionModel": {},
    "AltCLIPVisionModel": {},
    "ChineseCLIPVisionModel": {},
    "MetaClip2VisionModel": {},
    "MLCDVisionModel": {},
    "BlipVisionModel": {},
    "GitVisionModel": {},
    "OwlViTVisionModel": {},
    "Owlv2VisionModel": {},
    "XCLIPVisionModel": {"num_frames": 2},  # a video tower: the batch is 2 frames
    "VitDetModel": {"image_size": 32, "pretrain_image_size": 32},
    "YolosModel": {"image_size": [32, 32], "num_detection_tokens": 2},
}
IMPLEMENTED = set(list(HF_CLASSES)[:18])  # the classes vitkit reads; the rest must be refused


def build_hf(transformers: Any, cls_name: str, seed: int) -> Any:
    """A tiny random-weight float64 ``cls_name``."""
    cls = getattr(transformers, cls_name)
    conf_kw = {**_HF_TINY, **_HF_IMAGE, **HF_CLASSES[cls_name]}
    conf_kw = {k: v for k, v in conf_kw.items() if v is not None}
    if "Classification" in cls_name:
        conf_kw["num_labels"] = 5
    config = cls.config_class(**conf_kw)
    torch.manual_seed(seed)
    return randomise(cls(config).double(), seed)


def hf_reference_output(model: Any, cls_name: str, x: torch.Tensor) -> torch.Tensor:
    """What the vitkit model's output is compared with: logits for classifiers, else the
    pooled output (``pooler_output`` / ``image_embeds``), else the final-normalised tokens."""
    kw: dict[str, Any] = {}
    if cls_name.startswith("ViTMAE"):  # keep the tokens in order: noise = position
        n = model.config.image_size // model.config.patch_size
        kw["noise"] = torch.arange(n * n, dtype=x.dtype).expand(x.shape[0], -1)
    if cls_name == "ViTMAEForPreTraining":  # the encoder (the decoder is not a ViT's output)
        model = model.vit
    if cls_name == "Siglip2VisionModel":  # NaFlex: pre-patchified pixels + a mask
        p = model.config.patch_size
        b, c, h, w = x.shape
        patches = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        kw["pixel_attention_mask"] = torch.ones(b, (h // p) * (w // p), dtype=torch.long)
        kw["spatial_shapes"] = torch.tensor([[h // p, w // p]] * b)
        x = patches.reshape(b, (h // p) * (w // p), p * p * c)
    out = model(pixel_values=x, **kw)
    for field in ("logits", "image_embeds", "pooler_output", "last_hidden_state"):
        value = getattr(out, field, None)
        if value is not None:
            return value[0] if isinstance(value, tuple) else value
    raise RuntimeError(f"{cls_name}: no output to compare")
