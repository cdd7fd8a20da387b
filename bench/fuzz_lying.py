"""The loading fuzzer's lying folders and timm's non-square preprocessing.

- ``lying-timm-folder``: a random plain timm ``VisionTransformer`` (bench/fuzz_loading.py's
  draws, tiny) saved with ``save_for_hf``, whose ``config.json`` then names another registered
  entry vitkit reads, with its ``model_args`` kept, dropped, or thinned to the sizes; or keeps its
  name and says ``global_pool`` / ``fc_norm`` / ``class_token`` otherwise than the weights. The
  truth is timm's: ``create_model(NAME, **model_args)`` loading the weights strictly. Where timm
  loads them, vitkit must give its output (``exact``), say what differs (``warned``) or refuse;
  where timm refuses them, vitkit must refuse, or give the output of the model the weights were
  trained as (``exact``: nothing was made up). Anything else is ``silent``.
- ``timm-preprocess``: a random non-square (or square) input size, crop_pct, crop mode and
  interpolation in a timm folder's ``pretrained_cfg`` and a random image size: vitkit's eval
  transform against timm's own ``create_transform`` (``exact``: every value equal), else
  ``silent``; a refusal is ``refused``.

    python bench/fuzz_lying.py --draws 2000   # writes bench/results/fuzz_lying.*

Runs in float64 on one thread; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_loading as fl  # noqa: E402
from PIL import Image  # noqa: E402

from vitkit.checkpoints.arch import entries  # noqa: E402
from vitkit.checkpoints.timm.vision_transformer import timm_hub_preprocess  # noqa: E402
from vitkit.data.images import eval_transform  # noqa: E402
from vitkit.errors import VitkitError  # noqa: E402
from vitkit.registry.model_config import ViTConfig  # noqa: E402

SOURCES = ("lying-timm-folder", "timm-preprocess")
_SIZES = ("embed_dim", "depth", "num_heads", "patch_size", "img_size", "mlp_ratio", "num_classes")


def _lie(rng: random.Random, args: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str]:
    """(architecture, model_args or None for none, what the lie is)."""
    margs = {k: v for k, v in args.items() if not k.startswith("_")}
    if rng.random() < 0.25:  # the true name, a model_args field the weights disprove
        field = rng.choice(["global_pool", "fc_norm", "class_token"])
        value = {
            "global_pool": rng.choice(["avg", "token", "map", "avgmax"]),
            "fc_norm": not margs.get("fc_norm"),
            "class_token": not margs["class_token"],
        }[field]
        return "vit_base_patch16_224", {**margs, field: value}, f"model_args {field}={value!r}"
    name = rng.choice(sorted(entries()))
    how = rng.choice(["kept", "sizes", "none"])
    kept = {"kept": margs, "sizes": {k: margs[k] for k in _SIZES if k in margs}, "none": None}
    return name, kept[how], f"named {name}, model_args {how}"


def _timm_truth(timm: Any, name: str, margs: dict[str, Any] | None, sd: dict, x: torch.Tensor):
    """timm's output for the lying folder, or None where timm refuses the weights."""
    layout = entries()[name]["layout"]
    shown = {"width": sd["patch_embed.proj.weight"].shape[0]}
    if margs is None and layout["width"] != shown["width"]:
        return None  # (timm would build the full-size entry only to refuse its shapes)
    try:
        model = timm.create_model(name, pretrained=False, **(margs or {})).double()
        model.load_state_dict(sd, strict=True)
        with torch.no_grad():
            return model.eval()(x)
    except Exception:  # noqa: BLE001 - timm refuses (missing / unexpected keys, shapes, args)
        return None


def check_lying(timm: Any, rng: random.Random, work: Path, seed: int) -> dict[str, Any]:
    from timm.models._hub import save_for_hf

    args = {**fl.draw_timm(rng), "_eps": 1e-6}
    try:
        model = fl.build_timm_model(timm, args, seed)
        size = args["img_size"]
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(seed)).double()
        with torch.no_grad():
            trained = model(x)
        save_for_hf(model, str(work), safe_serialization=True)
    except Exception as e:  # noqa: BLE001 - the reference itself failed
        return {"status": "harness", "reason": fl.first_line(e)}
    name, margs, lie = _lie(rng, args)
    hub = json.loads((work / "config.json").read_text())
    hub["architecture"] = name
    if margs is None:
        hub.pop("model_args", None)
    else:
        hub["model_args"] = margs
    (work / "config.json").write_text(json.dumps(hub))
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    truth = _timm_truth(timm, name, margs, sd, x)
    want = trained if truth is None else truth  # (tokens where the reference returns tokens)
    got = fl.vitkit_read(work, x, want.ndim == 3)
    row = {"lie": lie, "timm": "loads" if truth is not None else "refuses"}
    if "y" not in got:
        return {**row, **got}
    # where timm refuses, only the output of the weights' own model is not made up
    return {**row, **fl.classify(want, got)}


def check_preprocess(timm: Any, rng: random.Random) -> dict[str, Any]:
    from timm.data import create_transform, resolve_data_config

    h, w = rng.randint(8, 64), rng.randint(8, 64)
    if rng.random() < 0.2:
        w = h
    pcfg = {
        "input_size": [3, h, w],
        "crop_pct": rng.choice([0.875, 0.9, 0.95, 1.0, 0, round(rng.uniform(0.3, 1.0), 4)]),
        "crop_mode": rng.choice(["center", "center", "squash"]),
        "interpolation": rng.choice(["bilinear", "bicubic", "nearest"]),
    }
    iw, ih = rng.randint(1, 200), rng.randint(1, 200)
    img = Image.frombytes("RGB", (iw, ih), rng.randbytes(iw * ih * 3))
    row: dict[str, Any] = {"pretrained_cfg": pcfg, "image": [iw, ih]}
    want = create_transform(**resolve_data_config({}, pretrained_cfg=dict(pcfg)))(img)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (crop_pct 0: said, as timm reads it)
            pre = timm_hub_preprocess(
                {"pretrained_cfg": pcfg}, ViTConfig(image_size=(h, w), patch_size=4)
            )
            got = eval_transform(pre)(img).double() / 255
    except VitkitError as e:
        return {**row, "status": "refused", "reason": str(e).splitlines()[0]}
    mean = torch.tensor(pre.mean, dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor(pre.std, dtype=torch.float64).view(3, 1, 1)
    diff = (
        ((got - mean) / std - want.double()).abs().max().item() if got.shape == want.shape else 1.0
    )
    return {**row, "status": "exact" if diff <= 1e-5 else "silent", "diff": diff}


def run(draws: int, seconds: float, seed: int) -> dict[str, Any]:
    timm = fl.import_reference("timm")
    torch.set_num_threads(1)
    rng = random.Random(seed)
    counts = {s: dict.fromkeys(fl.CLASSES, 0) for s in SOURCES}
    examples: list[dict[str, Any]] = []
    start = time.perf_counter()
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(draws):
            if time.perf_counter() - start > seconds:
                break
            work = Path(tmp) / str(i)
            work.mkdir()
            rows = {
                "lying-timm-folder": check_lying(timm, rng, work, seed * 100_003 + i),
                "timm-preprocess": check_preprocess(timm, rng),
            }
            shutil.rmtree(work, ignore_errors=True)
            n += 1
            for s, r in rows.items():
                counts[s][r["status"]] += 1
                if r["status"] in ("silent", "crashed") and len(examples) < 20:
                    examples.append(
                        {"draw": i, "source": s, **{k: v for k, v in r.items() if k != "y"}}
                    )
    return {"draws": n, "seed": seed, "seconds": round(time.perf_counter() - start, 1),
            "counts": counts, "machine": fl.machine(), "examples": examples}  # fmt: skip


def markdown(result: dict[str, Any], command: str) -> str:
    lines = [
        "# Loading fuzzer: lying timm folders and non-square timm preprocessing",
        "",
        f"`{command}`: {result['draws']} draws (seed {result['seed']}) of each source in "
        f"{result['seconds']:.0f} s. See bench/fuzz_lying.py for what each source draws and how "
        "a load is classified.",
        "",
        f"Machine: {result['machine']}.",
        "",
        "| source | " + " | ".join(fl.CLASSES) + " |",
        "| --- |" + " --- |" * len(fl.CLASSES),
    ]
    for s, per in result["counts"].items():
        lines.append(f"| {s} | " + " | ".join(str(per[c]) for c in fl.CLASSES) + " |")
    if result["examples"]:
        lines += ["", "## Silent or crashed", ""]
        lines += [f"- {json.dumps(e, default=str)[:300]}" for e in result["examples"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=1500.0, help="stop drawing after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--out", default=str(fl.ROOT / "bench" / "results" / "fuzz_lying"))
    a = p.parse_args(argv)
    result = run(a.draws, a.seconds, a.seed)
    command = "python bench/fuzz_lying.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(result, command.strip())
    print(text)
    if not a.no_write:
        out = Path(a.out)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
