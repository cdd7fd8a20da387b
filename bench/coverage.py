"""Which ViT checkpoints people have load into vitkit exactly: a coverage table.

For every model registered in timm's ``vision_transformer.py``, ``deit.py`` and
``vision_transformer_hybrid.py``, a small copy of the same architecture (timm's own entry point
with depth 2, a 2x2 patch grid and 10 classes; widths above 384 scaled down to 32 per head,
keeping the heads, the MLP ratio and every other switch of the entry) gets random weights and is
written by timm's own ``save_for_hf`` as a timm hub folder (``config.json`` naming the
``architecture``, with the ``model_args`` timm records, + ``model.safetensors``). vitkit then
reads the folder (``read_checkpoint``, the path of ``vitkit.load``) and both models run the same
images: float64 (``read_checkpoint`` + strict load into a float64 model) and float32
(``vitkit.load`` itself). The Hugging Face classes of the family (ViT, DeiT, DINOv2, ViTMAE,
CLIP, SigLIP) are built tiny, saved with ``save_pretrained`` and read the same way.

Each name is one of:

- ``exact``: max |logits difference| <= 1e-8 x max |logits| in float64;
- ``differs``: loads, but the logits differ by more (a numerical mismatch: a bug or an
  unexpressed setting);
- ``refused``: vitkit refused it with a one-line ``VitkitError`` (the reason is recorded);
- ``crashed``: vitkit raised anything else (a bug: it should have been a one-line refusal);
- ``harness``: the reference model could not be built here (not vitkit's doing).

    python bench/coverage.py                    # writes bench/results/coverage.{md,json}
    python bench/coverage.py --only deit --no-hf   # a subset, printed, nothing written

Runs in float64 on one thread; nothing is cached or downloaded. About 5 minutes on one core.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the torchvision-op shim for importing timm

from references import import_reference  # noqa: E402

import vitkit  # noqa: E402
from vitkit.checkpoints import read_checkpoint  # noqa: E402
from vitkit.checkpoints.io import load_state_dict_strict  # noqa: E402
from vitkit.checkpoints.timm import HEADS_BY_WIDTH, _name_settings  # noqa: E402
from vitkit.errors import VitkitError  # noqa: E402
from vitkit.model import build_model  # noqa: E402

TIMM_MODULES = ("vision_transformer", "deit", "vision_transformer_hybrid")
EXACT_F64 = 1e-8  # relative to max |logits|
OK_F32 = 1e-4
NATIVE_WIDTH = 384  # widths up to this are kept; wider models get 32 per head
GRID = 2  # patches per side
NUM_CLASSES = 10


def timm_names(timm: Any) -> list[tuple[str, str]]:
    """(timm module, model name) of every model registered in the three modules."""
    return [(m, n) for m in TIMM_MODULES for n in timm.list_models(module=m)]


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved by N(0, 0.05): no zero bias, layer scale or head left to hide a
    mismatch."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    return model.eval()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def heads_hint_ok(name: str, width: int, heads: int | None) -> bool:
    """Whether a hub folder of ``name`` at its native width, without ``num_heads`` in its
    ``model_args`` (as timm's Hub folders are), gets timm's number of heads from vitkit."""
    hint = _name_settings(name).get("num_heads", HEADS_BY_WIDTH.get(width))
    return heads is None or hint == heads


def small_timm_args(timm: Any, name: str) -> dict[str, Any]:
    """timm.create_model keyword arguments for a small copy of ``name``: depth 2, a 2x2 grid,
    10 classes, and a narrower width (32 per head) where the entry's is above NATIVE_WIDTH.
    ``_heads_hint_ok``: :func:`heads_hint_ok` at the native width (not a timm argument)."""
    with torch.device("meta"):
        probe = timm.create_model(name, depth=1)
    width = probe.embed_dim
    block = probe.blocks[0]  # the heads: of its attention, one branch's, or the block's own
    attn = block.attns[0].attn if hasattr(block, "attns") else getattr(block, "attn", block)
    heads = getattr(attn, "num_heads", None)
    pe = probe.patch_embed
    grid = pe.grid_size if hasattr(pe, "grid_size") else pe.feat_size
    img = pe.img_size
    stride = (img[0] // grid[0], img[1] // grid[1])
    args: dict[str, Any] = {
        "_heads_hint_ok": heads_hint_ok(name, width, heads),
        "depth": 2,
        "img_size": (GRID * stride[0], GRID * stride[1]),
        "num_classes": NUM_CLASSES,
    }
    if width > NATIVE_WIDTH and heads:
        scaled = {**args, "embed_dim": 32 * heads, "num_heads": heads}
        try:  # a stem whose output width is fixed (vit_base_mci_224) keeps the native width
            with torch.device("meta"):
                timm.create_model(name, **{k: v for k, v in scaled.items() if k[0] != "_"})
            args = scaled
        except Exception:  # noqa: BLE001, S110
            pass
    return args


def compare(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """(max |difference|, the same relative to max |ref|)."""
    diff = (ref - got).abs().max().item()
    return diff, diff / max(ref.abs().max().item(), 1e-300)


def _images(cfg_size: tuple[int, int], channels: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, channels, *cfg_size, generator=g, dtype=torch.float64).to(dtype)


def vitkit_side(
    folder: Path, x64: torch.Tensor, x32: torch.Tensor, tokens: bool = False
) -> dict[str, Any]:
    """vitkit's logits of a folder (with ``tokens``: its final-normalised tokens, what a
    headless encoder class returns), float64 (read_checkpoint + strict load) and float32
    (vitkit.load); a refusal or crash is returned as such."""
    try:
        ckpt = read_checkpoint(folder)
        model = build_model(ckpt.model_config).double().eval()
        load_state_dict_strict(model, ckpt.state_dict, source=str(folder))
        model32 = vitkit.load(folder)
        with torch.no_grad():
            if tokens:
                out64, out32 = model.forward_features(x64), model32.forward_features(x32)
            else:
                out64, out32 = model(x64), model32(x32)
    except VitkitError as e:  # the reason without the temporary folder's name
        reason = re.sub(re.escape(str(folder)) + r"\S*?: ", "", str(e).strip().splitlines()[0])
        return {"status": "refused", "reason": reason.replace(str(folder), "the folder")}
    except Exception as e:  # noqa: BLE001 - every other exception is a bug to list
        return {
            "status": "crashed",
            "reason": _first_line(e),
            "where": traceback.extract_tb(e.__traceback__)[-1].name,
        }
    return {"out64": out64, "out32": out32, "config": ckpt.model_config}


def _score(ref64: torch.Tensor, ref32: torch.Tensor, got: dict[str, Any]) -> dict[str, Any]:
    if "out64" not in got:
        return got
    if got["out64"].shape != ref64.shape:
        return {
            "status": "differs",
            "reason": f"output shape {tuple(got['out64'].shape)} vs {tuple(ref64.shape)}",
        }
    abs64, rel64 = compare(ref64, got["out64"])
    abs32, rel32 = compare(ref32, got["out32"].to(ref32.dtype))
    status = "exact" if rel64 <= EXACT_F64 and rel32 <= OK_F32 else "differs"
    return {
        "status": status,
        "max_abs_f64": abs64,
        "rel_f64": rel64,
        "max_abs_f32": abs32,
        "rel_f32": rel32,
        "switches": {k: str(v) for k, v in got["config"].family_switches.items()},
    }


def check_timm(timm: Any, name: str, work: Path, seed: int = 0) -> dict[str, Any]:
    """One timm name: build small, write a hub folder with timm's writer, read with vitkit."""
    from timm.models._hub import save_for_hf

    try:
        args = small_timm_args(timm, name)
        hint_ok = args.pop("_heads_hint_ok")
        torch.manual_seed(seed)
        model = randomise(timm.create_model(name, **args).double(), seed)
        folder = work / name
        save_for_hf(model, str(folder), safe_serialization=True)
        x64 = _images(args["img_size"], 3, torch.float64)
        with torch.no_grad():
            ref64 = model(x64)
            ref32 = copy.deepcopy(model).float()(x64.float())
    except Exception as e:  # noqa: BLE001 - the reference itself failed: not vitkit's doing
        return {"status": "harness", "reason": _first_line(e)}
    got = vitkit_side(folder, x64, x64.float(), tokens=ref64.ndim == 3)
    out = {
        "args": {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()},
        "heads_hint_ok": hint_ok,
    }
    out.update(_score(ref64, ref32, got))
    return out


# ---------------------------------------------------------------------------------------------
# Hugging Face classes of the family

_HF_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
HF_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    # class: (config class, config overrides beyond _HF_TINY)
    "ViTModel": ("ViTConfig", {}),
    "ViTForImageClassification": ("ViTConfig", {}),
    "DeiTModel": ("DeiTConfig", {}),
    "DeiTForImageClassification": ("DeiTConfig", {}),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", {}),
    "Dinov2Model": ("Dinov2Config", {}),
    "Dinov2ForImageClassification": ("Dinov2Config", {}),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", {"num_register_tokens": 4}),
    "Dinov2WithRegistersForImageClassification": (
        "Dinov2WithRegistersConfig",
        {"num_register_tokens": 4},
    ),
    "ViTMAEModel": ("ViTMAEConfig", {"mask_ratio": 0.0}),
    "ViTMAEForPreTraining": ("ViTMAEConfig", {"mask_ratio": 0.0}),
    "CLIPVisionModel": ("CLIPVisionConfig", {}),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", {"projection_dim": 16}),
    "SiglipVisionModel": ("SiglipVisionConfig", {}),
}


def hf_reference_output(model: Any, cls_name: str, x: torch.Tensor) -> torch.Tensor:
    """What the vitkit model's output is compared with: logits for classifiers, else the
    pooled output (``pooler_output`` / ``image_embeds``), else the final-normalised tokens."""
    kw: dict[str, Any] = {}
    if cls_name.startswith("ViTMAE"):  # keep the tokens in order: noise = position
        n = model.config.image_size // model.config.patch_size
        kw["noise"] = torch.arange(n * n, dtype=x.dtype).expand(x.shape[0], -1)
    if cls_name == "ViTMAEForPreTraining":  # the encoder (the decoder is not a ViT's output)
        model = model.vit
    out = model(pixel_values=x, **kw)
    for field in ("logits", "image_embeds", "pooler_output", "last_hidden_state"):
        value = getattr(out, field, None)
        if value is not None:
            return value
    raise RuntimeError(f"{cls_name}: no output to compare")


def check_hf(transformers: Any, cls_name: str, work: Path, seed: int = 0) -> dict[str, Any]:
    config_cls, extra = HF_CLASSES[cls_name]
    try:
        conf_kw = {**_HF_TINY, "image_size": 32, "patch_size": 8, **extra}
        if "Classification" in cls_name:
            conf_kw["num_labels"] = 5
        config = getattr(transformers, config_cls)(**conf_kw)
        torch.manual_seed(seed)
        model = randomise(getattr(transformers, cls_name)(config).double(), seed)
        folder = work / cls_name
        model.save_pretrained(folder, safe_serialization=True)
        x64 = _images((32, 32), config.num_channels, torch.float64)
        with torch.no_grad():
            ref64 = hf_reference_output(model, cls_name, x64)
            model32 = copy.deepcopy(model).float()
            ref32 = hf_reference_output(model32, cls_name, x64.float())
    except Exception as e:  # noqa: BLE001
        return {"status": "harness", "reason": _first_line(e)}
    got = vitkit_side(folder, x64, x64.float(), tokens=ref64.ndim == 3)
    if "out64" in got and got["out64"].ndim != ref64.ndim:  # tokens vs pooled
        return {"status": "differs", "reason": "vitkit's output is not the class's main output"}
    return _score(ref64, ref32, got)


# ---------------------------------------------------------------------------------------------
# Report


def summary(results: dict[str, dict[str, Any]]) -> str:
    counts = collections.Counter(r["status"] for r in results.values())
    parts = [f"{counts['exact']} of {len(results)} exact"]
    for status in ("differs", "refused", "crashed", "harness"):
        if counts[status]:
            parts.append(f"{counts[status]} {status}")
    return ", ".join(parts)


def reason_counts(results: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """Refusals grouped by reason (the file path and model-specific numbers taken out)."""

    def key(reason: str) -> str:
        reason = re.sub(r"^\S+ has ", "has ", reason)  # the model's name
        reason = re.sub(r" \([^()]*\.[^()]*\)", "", reason)  # the key that showed it
        if "keys: " in reason:
            reason = reason.split(", ")[0]  # the first key of a list
        return re.sub(r"\b\d+\b", "N", reason)

    c = collections.Counter(key(r["reason"]) for r in results.values() if r["status"] == "refused")
    return c.most_common()


def _row(name: str, r: dict[str, Any]) -> str:
    if r["status"] in ("exact", "differs") and "rel_f64" in r:
        mark = "" if r["status"] == "exact" else " (!)"
        sw = ", ".join(f"{k}={v}" for k, v in r.get("switches", {}).items())
        return (
            f"| {name} | {r['status']}{mark} | {r['max_abs_f64']:.1e} | {r['rel_f64']:.1e} | "
            f"{r['rel_f32']:.1e} | {sw} |"
        )
    return f"| {name} | {r['status']} | | | | {r.get('reason', '')} |"


def markdown(timm_res: dict, hf_res: dict, meta: dict[str, Any]) -> str:
    refused = "; ".join(f"{n} {r}" for r, n in reason_counts(timm_res))
    lines = [
        "# Checkpoint coverage (`python bench/coverage.py`)",
        "",
        f"**timm: {summary(timm_res)}.** **Hugging Face classes: {summary(hf_res)}.**",
        "",
        f"timm refused, by reason: {refused or 'none'}.",
        "",
        f"timm {meta['timm']}, transformers {meta['transformers']}, torch {meta['torch']}; "
        f"float64, {meta['threads']} thread, {meta['seconds']:.0f} s. Each model: depth 2, "
        f"{GRID}x{GRID} patches, {NUM_CLASSES} classes, random weights; widths above "
        f"{NATIVE_WIDTH} scaled to 32 per head (heads, MLP ratio and every switch kept). exact: "
        f"max |Δlogits| ≤ {EXACT_F64:g} x max |logits| in float64 and ≤ {OK_F32:g} relative in "
        "float32; differs (!): loads with other numerics; refused: a one-line VitkitError; "
        "crashed: any other exception (a bug); harness: the reference could not be built.",
        "",
    ]
    for title, res in (("timm", timm_res), ("Hugging Face", hf_res)):
        reasons = reason_counts(res)
        if reasons:
            lines += [f"## {title}: refusals by reason", "", "| count | reason |", "| ---: | --- |"]
            lines += [f"| {n} | {r} |" for r, n in reasons]
            lines.append("")
        crashed = {k: v for k, v in res.items() if v["status"] == "crashed"}
        if crashed:
            lines += [f"## {title}: crashed (bugs)", ""]
            lines += [f"- {k}: {v['reason']} (in `{v.get('where')}`)" for k, v in crashed.items()]
            lines.append("")
    wrong_heads = [
        k
        for k, v in timm_res.items()
        if v.get("heads_hint_ok") is False and v["status"] in ("exact", "differs")
    ]
    if wrong_heads:
        lines += [
            "## timm: heads a Hub folder without model_args would get wrong",
            "",
            "These load above because the small copy's config.json records num_heads; timm's "
            "own Hub folders do not, and vitkit's width table / name hints give other heads: "
            + ", ".join(wrong_heads),
            "",
        ]
    if not wrong_heads:
        lines += [
            "Heads: every model that loads gets timm's number of heads from vitkit's width table "
            "or the name hints also where its config.json has no num_heads (timm's Hub folders).",
            "",
        ]
    for title, res in (("timm models", timm_res), ("Hugging Face classes", hf_res)):
        lines += [
            f"## {title}",
            "",
            "| name | result | max abs f64 | rel f64 | rel f32 | switches / reason |",
            "| --- | --- | ---: | ---: | ---: | --- |",
        ]
        lines += [_row(k, v) for k, v in res.items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="names containing this; prints only")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face classes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    timm = import_reference("timm")
    transformers = import_reference("transformers")
    start = time.perf_counter()
    timm_res: dict[str, dict[str, Any]] = {}
    hf_res: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (_module, name) in enumerate(timm_names(timm)):
            if args.only and args.only not in name:
                continue
            with tempfile.TemporaryDirectory(dir=tmp) as work:  # one model on disk at a time
                timm_res[name] = check_timm(timm, name, Path(work))
            r = timm_res[name]
            print(f"{i:4d} {name:55s} {r['status']:8s} {r.get('rel_f64', r.get('reason', ''))}")
        for cls_name in () if args.no_hf else HF_CLASSES:
            if args.only and args.only not in cls_name:
                continue
            with tempfile.TemporaryDirectory(dir=tmp) as work:
                hf_res[cls_name] = check_hf(transformers, cls_name, Path(work))
            r = hf_res[cls_name]
            print(f"     {cls_name:55s} {r['status']:8s} {r.get('rel_f64', r.get('reason', ''))}")
    meta = {
        "timm": timm.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - start,
    }
    print(f"timm: {summary(timm_res)}; Hugging Face: {summary(hf_res)}; {meta['seconds']:.0f} s")
    if args.only or args.no_hf:
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "timm": timm_res, "hf": hf_res}
    (out / "coverage.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "coverage.md").write_text(markdown(timm_res, hf_res, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
