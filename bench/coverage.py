"""Which ViT checkpoints people have load into vitkit exactly, say what they assumed, or are
refused: a coverage table ("no silent wrong numbers").

For every model registered in timm's ``vision_transformer``, ``deit``,
``vision_transformer_hybrid``, ``eva``, ``naflexvit``, ``beit`` and ``vision_transformer_relpos``
modules, a small copy of the same architecture (:mod:`coverage_models`: timm's own entry point
with depth 2, a 2x2 patch grid and 10 classes; widths above 384 scaled down to 32 per head,
keeping the heads and every other switch) gets random weights and is written two ways:

- ``hub``: timm's own ``save_for_hf`` folder (``config.json`` naming the ``architecture`` with
  the ``model_args`` timm records, + ``model.safetensors``), read as that folder;
- ``bare``: the state dict alone (``safetensors.torch.save_file``, ``model.safetensors`` in an
  otherwise empty folder), read as that file, with ``num_heads`` (timm's) passed only where the
  small copy's width was scaled down. A bare row also carries the native-width heads check
  (:func:`coverage_models.native_heads_check`): a wrong head count at the entry's own width
  with no AssumptionWarning naming num_heads makes the row ``silent``.

vitkit reads it (``read_checkpoint`` + strict load into a float64 model, and ``vitkit.load`` in
float32), with every warning recorded, and both models run the same images. The Hugging Face
ViT-family classes are built tiny and written as a ``save_pretrained`` folder (hub) or their
state dict alone (bare). Each row is one of:

- ``exact``: max |logits difference| <= 1e-8 x max |logits| in float64 and <= 1e-4 in float32
  (warnings allowed, and recorded);
- ``warned``: loads, differs, and at least one ``AssumptionWarning`` was said (recorded);
- ``silent``: loads, differs, nothing said: the worst bug;
- ``refused``: a one-line ``VitkitError`` (the reason is recorded);
- ``crashed``: any other exception (a bug: it should have been a one-line refusal);
- ``harness``: the reference model could not be built or written here (not vitkit's doing).

    python bench/coverage.py                       # both modes; writes bench/results/coverage.*
    python bench/coverage.py --only deit --no-hf   # a subset, printed, nothing written
    python bench/coverage.py --mode bare --only eva02_tiny

Runs in float64 on one thread; nothing is cached or downloaded.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the torchvision-op shim for importing timm
sys.path.insert(0, str(ROOT / "bench"))

import coverage_features  # noqa: E402
import coverage_models as cm  # noqa: E402
import coverage_report as report  # noqa: E402
from references import import_reference  # noqa: E402

import vitkit  # noqa: E402
from vitkit.checkpoints import read_checkpoint  # noqa: E402
from vitkit.checkpoints.native.safetensors_io import load_state_dict_strict  # noqa: E402
from vitkit.errors import AssumptionWarning, VitkitError  # noqa: E402
from vitkit.models.vit import build_model  # noqa: E402

MODES = ("hub", "bare")
OUTCOMES = ("exact", "warned", "silent", "refused", "crashed", "harness")
EXACT_F64 = 1e-8  # relative to max |logits|
OK_F32 = 1e-4
WEIGHTS = "model.safetensors"
timm_names = cm.timm_names  # (the names the tests and the report use)


def compare(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """(max |difference|, the same relative to max |ref|)."""
    diff = (ref - got).abs().max().item()
    return diff, diff / max(ref.abs().max().item(), 1e-300)


def images(size: tuple[int, int], channels: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, channels, *size, generator=g, dtype=torch.float64).to(dtype)


def _scrub(text: str, path: Path) -> str:
    """``text`` without the temporary path (a file's, or its folder's)."""
    for p in (path, path.parent) if path.is_file() else (path,):
        text = re.sub(re.escape(str(p)) + r"\S*?: ", "", text)
        text = text.replace(str(p), "the file" if p.is_file() else "the folder")
    return text


def vitkit_side(
    path: Path,
    x64: torch.Tensor,
    x32: torch.Tensor,
    tokens: bool = False,
    read_kw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """vitkit's logits of a checkpoint (with ``tokens``: its final-normalised tokens, what a
    headless encoder class returns), float64 (read_checkpoint + strict load) and float32
    (vitkit.load), and the AssumptionWarnings said on the way (``warnings``, one line each, in
    order, without repeats); a refusal or crash is returned as such (with its warnings)."""
    read_kw = read_kw or {}
    out: dict[str, Any]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ckpt = read_checkpoint(path, **read_kw)
            model = build_model(ckpt.model_config).double().eval()
            load_state_dict_strict(model, ckpt.state_dict, source=str(path))
            model32 = vitkit.load(path, **read_kw)
            with torch.no_grad():
                if tokens:
                    out64, out32 = model.forward_features(x64), model32.forward_features(x32)
                else:
                    out64, out32 = model(x64), model32(x32)
            out = {"out64": out64, "out32": out32, "config": ckpt.model_config, "model": model}
        except VitkitError as e:  # the reason without the temporary path
            out = {"status": "refused", "reason": _scrub(str(e).strip().splitlines()[0], path)}
        except Exception as e:  # noqa: BLE001 - every other exception is a bug to list
            out = {
                "status": "crashed",
                "reason": _scrub(cm.first_line(e), path),
                "where": traceback.extract_tb(e.__traceback__)[-1].name,
            }
    said: list[str] = []
    for w in caught:
        if issubclass(w.category, AssumptionWarning):
            lines = str(w.message).strip().splitlines()  # one line, or a block: a summary line
            for line in [x.strip() for x in lines[1:]] or lines[:1]:  # and a line a setting
                line = _scrub(line, path)
                if line not in said:
                    said.append(line)
    out["warnings"] = said
    return out


def classify(rel64: float, rel32: float, said: list[str]) -> str:
    """exact, else warned (something was said) or silent (nothing was)."""
    if rel64 <= EXACT_F64 and rel32 <= OK_F32:  # (NaN is not <=: never exact)
        return "exact"
    return "warned" if said else "silent"


def score(ref64: torch.Tensor, ref32: torch.Tensor, got: dict[str, Any]) -> dict[str, Any]:
    """A row from the reference outputs and :func:`vitkit_side`'s answer."""
    said = got["warnings"]
    if "out64" not in got:
        return got
    if got["out64"].shape != ref64.shape:
        return {
            "status": "warned" if said else "silent",
            "reason": f"output shape {tuple(got['out64'].shape)} vs {tuple(ref64.shape)}",
            "warnings": said,
        }
    abs64, rel64 = compare(ref64, got["out64"])
    abs32, rel32 = compare(ref32, got["out32"].to(ref32.dtype))
    cfg = got["config"]
    return {
        "status": classify(rel64, rel32, said),
        "max_abs_f64": abs64,
        "rel_f64": rel64,
        "max_abs_f32": abs32,
        "rel_f32": rel32,
        "heads": getattr(cfg, "num_heads", None),
        "switches": {k: str(v) for k, v in cfg.family_switches.items()},
        "warnings": said,
    }


def _jsonable(args: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}


def _state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A state dict save_file takes: every tensor its own contiguous copy (no shared storage)."""
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# timm


def build_timm(timm: Any, name: str, seed: int = 0) -> dict[str, Any]:
    """The small reference copy of ``name``: ``{"model", "args", "x64", "ref64", "ref32"}``, or
    a ``harness`` row where it cannot be built or run."""
    try:
        args = cm.small_timm_args(timm, name)
        torch.manual_seed(seed)
        model = cm.randomise(timm.create_model(name, **cm.timm_kwargs(args)).double(), seed)
        x64 = images(args["img_size"], 3, torch.float64)
        with torch.no_grad():
            ref64 = model(x64)
            ref32 = copy.deepcopy(model).float()(x64.float())
    except Exception as e:  # noqa: BLE001 - the reference itself failed: not vitkit's doing
        return {"status": "harness", "reason": cm.first_line(e)}
    return {"model": model, "args": args, "x64": x64, "ref64": ref64, "ref32": ref32}


def check_timm(
    timm: Any,
    name: str,
    work: Path,
    mode: str = "hub",
    seed: int = 0,
    ref: dict[str, Any] | None = None,
    features: bool = True,
) -> dict[str, Any]:
    """One timm name in one mode: build small (or take ``ref`` from :func:`build_timm`), write
    it (hub: ``save_for_hf``; bare: the state dict alone), read it with vitkit, score it; in
    hub mode with ``features`` also the features column (:mod:`coverage_features`)."""
    from timm.models._hub import save_for_hf

    ref = ref if ref is not None else build_timm(timm, name, seed)
    if "model" not in ref:
        return dict(ref)
    args = ref["args"]
    folder = work / f"{name}-{mode}"
    read_kw: dict[str, Any] = {}
    try:
        if mode == "hub":
            save_for_hf(ref["model"], str(folder), safe_serialization=True)
            path = folder
        else:
            folder.mkdir(parents=True)
            path = folder / WEIGHTS
            save_file(_state_dict(ref["model"]), str(path))
            if args["_scaled"]:  # the width table cannot apply to an artificial width
                read_kw["num_heads"] = args["_heads"]
    except Exception as e:  # noqa: BLE001
        return {"status": "harness", "reason": f"writing: {cm.first_line(e)}"}
    got = vitkit_side(path, ref["x64"], ref["x64"].float(), ref["ref64"].ndim == 3, read_kw)
    out: dict[str, Any] = {
        "args": _jsonable(cm.timm_kwargs(args)),
        "timm_heads": args["_heads"],
        "native_width": args["_width"],
        "scaled": args["_scaled"],
    }
    if mode == "hub":
        out["heads_hint_ok"] = args["_heads_hint_ok"]
    if read_kw:
        out["read_kw"] = read_kw
    out.update(score(ref["ref64"], ref["ref32"], got))
    if mode == "hub" and features:  # (the same weights either way: one mode is enough)
        if "model" in got and out["status"] == "exact":
            kw = cm.timm_kwargs(args)
            out["features"] = coverage_features.check(
                timm, name, kw, ref["model"], got["model"], ref["x64"]
            )
        else:  # (no features where the logits are not exact)
            why = "the checkpoint is refused" if out["status"] == "refused" else out["status"]
            out["features"] = {"status": "refused" if why != out["status"] else "differ"}
            out["features"]["reason"] = why
    if mode == "bare":
        native = cm.native_heads_check(timm, name)
        out["heads_native"] = native
        if native["result"] == "silent" and out["status"] in ("exact", "warned"):
            out["small_status"] = out["status"]
            out["status"] = "silent"
            out["reason"] = (
                f"at its native width {native['width']} vitkit infers {native['vitkit']} heads, "
                f"timm has {native['timm']}, nothing said"
            )
    return out


# ---------------------------------------------------------------------------------------------
# Hugging Face


def build_hf(transformers: Any, cls_name: str, seed: int = 0) -> dict[str, Any]:
    """The tiny reference ``cls_name``: ``{"model", "x64", "ref64", "ref32"}`` or harness."""
    try:
        model = cm.build_hf(transformers, cls_name, seed)
        x64 = images((32, 32), getattr(model.config, "num_channels", 3), torch.float64)
        with torch.no_grad():
            ref64 = cm.hf_reference_output(model, cls_name, x64)
            ref32 = cm.hf_reference_output(copy.deepcopy(model).float(), cls_name, x64.float())
    except Exception as e:  # noqa: BLE001
        return {"status": "harness", "reason": cm.first_line(e)}
    return {"model": model, "x64": x64, "ref64": ref64, "ref32": ref32}


def check_hf(
    transformers: Any,
    cls_name: str,
    work: Path,
    mode: str = "hub",
    seed: int = 0,
    ref: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One Hugging Face class in one mode (hub: ``save_pretrained``; bare: the state dict)."""
    ref = ref if ref is not None else build_hf(transformers, cls_name, seed)
    implemented = cls_name in cm.IMPLEMENTED
    if "model" not in ref:
        return {**ref, "implemented": implemented}
    folder = work / f"{cls_name}-{mode}"
    try:
        if mode == "hub":
            ref["model"].save_pretrained(folder, safe_serialization=True)
            path = folder
        else:
            folder.mkdir(parents=True)
            path = folder / WEIGHTS
            save_file(_state_dict(ref["model"]), str(path))
    except Exception as e:  # noqa: BLE001
        return {"status": "harness", "reason": f"writing: {cm.first_line(e)}"}
    got = vitkit_side(path, ref["x64"], ref["x64"].float(), tokens=ref["ref64"].ndim == 3)
    if "out64" in got and got["out64"].ndim != ref["ref64"].ndim:  # tokens vs pooled
        row = {
            "status": "warned" if got["warnings"] else "silent",
            "reason": "vitkit's output is not the class's main output",
            "warnings": got["warnings"],
        }
    else:
        row = score(ref["ref64"], ref["ref32"], got)
    return {**row, "implemented": implemented}


# ---------------------------------------------------------------------------------------------


def _say(name: str, rows: dict[str, dict[str, Any]]) -> None:
    parts = []
    for mode, r in rows.items():
        detail = r.get("rel_f64", r.get("reason", ""))
        detail = f"{detail:.1e}" if isinstance(detail, float) else str(detail)[:70]
        said = f" [{len(r.get('warnings', []))} said]" if r.get("warnings") else ""
        parts.append(f"{mode} {r['status']:8s} {detail}{said}")
    print(f"{name:48s} " + " | ".join(parts), flush=True)


def run(
    modes: tuple[str, ...], only: str = "", hf: bool = True, timm_only: bool = False
) -> dict[str, Any]:
    """Every timm name and Hugging Face class (containing ``only``) in each mode:
    ``{"timm": {mode: {name: row}}, "hf": {mode: {class: row}}, "modules": {name: module}}``."""
    timm = import_reference("timm")
    transformers = import_reference("transformers")
    transformers.utils.logging.disable_progress_bar()  # (save_pretrained's "Writing model shards")
    res: dict[str, Any] = {
        "timm": {m: {} for m in modes},
        "hf": {m: {} for m in modes},
        "modules": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for module, name in timm_names(timm):
            if only and only not in name:
                continue
            res["modules"][name] = module
            with tempfile.TemporaryDirectory(dir=tmp) as work:  # one model on disk at a time
                ref = build_timm(timm, name)
                for mode in modes:
                    res["timm"][mode][name] = check_timm(timm, name, Path(work), mode, ref=ref)
            _say(name, {m: res["timm"][m][name] for m in modes})
        for cls_name in cm.HF_CLASSES if hf and not timm_only else ():
            if only and only not in cls_name:
                continue
            with tempfile.TemporaryDirectory(dir=tmp) as work:
                ref = build_hf(transformers, cls_name)
                for mode in modes:
                    res["hf"][mode][cls_name] = check_hf(
                        transformers, cls_name, Path(work), mode, ref=ref
                    )
            _say(cls_name, {m: res["hf"][m][cls_name] for m in modes})
    res["meta"] = {
        "timm": timm.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("hub", "bare", "both"), default="both")
    ap.add_argument("--only", default="", help="names containing this; prints only")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face classes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    modes = MODES if args.mode == "both" else (args.mode,)
    start = time.perf_counter()
    res = run(modes, args.only, hf=not args.no_hf)
    res["meta"]["seconds"] = time.perf_counter() - start
    res["meta"]["modes"] = list(modes)
    print(report.headline(res))
    print(f"{res['meta']['seconds']:.0f} s")
    if args.only or args.no_hf or len(modes) < len(MODES):
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coverage.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "coverage.md").write_text(report.markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
