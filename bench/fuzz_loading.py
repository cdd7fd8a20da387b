"""A loading fuzzer: checkpoints trained with settings other than the registered entries', read by
vitkit, each load classified ("no silent wrong numbers").

bench/coverage.py builds every *registered* timm entry with its default settings; people train
with others. Each draw here is a random, seeded set of timm ``VisionTransformer`` settings
(global_pool, fc_norm, heads (any divisor of the width), class token, registers,
no_embed_class, a non-square input, the patch, pre_norm, qkv_bias, qk_norm, layer scale,
mlp_ratio, the activation, the LayerNorm eps), or of timm's ``Eva`` (the EVA-02 layout vitkit
reads bare), or of a Hugging Face config (ViT, DINOv2, CLIP vision, SigLIP vision). The model is
built tiny with random weights (every parameter moved, nothing left zero), in float64, and
written every way people hand it on (a timm draw the first three, a Hugging Face draw the last):

- ``bare-safetensors`` / ``bare-pth``: the state dict alone (``safetensors`` / ``torch.save``);
- ``timm-folder``: ``timm.models._hub.save_for_hf`` (``config.json`` with the ``model_args``);
- ``hf-folder``: ``save_pretrained``.

vitkit reads each (``read_checkpoint`` + a strict load into a float64 model), every warning
recorded, and runs the draw's fixed input; the output is compared with the reference's own:

- ``exact``: max |difference| <= 1e-9 x max |reference| (warnings allowed);
- ``warned``: it differs, and ``AssumptionWarning`` s name every compared setting whose value
  differs from the draw's (or, where none of them differs, something other than the
  preprocessing was said);
- ``refused``: a one-line ``VitkitError``;
- ``silent``: it differs and no warning names what differs: the bug this hunts;
- ``crashed``: any other exception (a bug too: it should have been a refusal);
- ``harness``: the reference could not be built or written (not vitkit's doing).

    python bench/fuzz_loading.py --draws 2000 --seconds 600   # writes bench/results/fuzz_loading.*
    python bench/fuzz_loading.py --draws 20 --no-write         # printed only

Runs in float64 on one thread; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the torchvision-op shim for importing timm

from references import import_reference  # noqa: E402

from vitkit.checkpoints import read_checkpoint  # noqa: E402
from vitkit.checkpoints.native.safetensors_io import load_state_dict_strict  # noqa: E402
from vitkit.errors import AssumptionWarning, VitkitError  # noqa: E402
from vitkit.models.vit import build_model  # noqa: E402

CLASSES = ("exact", "warned", "refused", "silent", "crashed", "harness")
SOURCES = ("bare-safetensors", "bare-pth", "timm-folder", "hf-folder")
EXACT = 1e-9  # max |difference| relative to max |reference logits|
NUM_CLASSES = 7
_TIMM_POOLS = {"token": "token", "avg": "gap", "avgmax": "avgmax", "max": "max", "map": "map"}
_TIMM_GELU = {"gelu": "none", "gelu_tanh": "tanh", "quick_gelu": "quick"}
# the settings compared with vitkit's config (a difference names the field a warning must name)
COMPARED = (
    "num_heads",
    "layer_norm_eps",
    "gelu",
    "pool",
    "fc_norm",
    "image_size",
    "num_reg_tokens",
    "pos_embed_prefix",
    "has_class_token",
    "norm_pre",
    "block",
)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _divisors(n: int, least_dim: int = 8) -> list[int]:
    return [h for h in range(1, n // least_dim + 1) if n % h == 0]


# ---------------------------------------------------------------------------------------------
# draws


def draw_timm(rng: random.Random) -> dict[str, Any]:
    """One random set of timm ``VisionTransformer`` settings (tiny: depth 1-2, a few patches).
    ``_eps``: the LayerNorm epsilon (a ``norm_layer`` timm cannot write to a folder)."""
    width = rng.choice([192, 384, 384, 64])
    table = {192: 3, 384: 6, 64: 2}[width]
    heads = table if rng.random() < 0.4 else rng.choice(_divisors(width))
    patch = rng.choice([4, 8, (4, 8)])
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    gh, gw = rng.choice([(2, 2), (3, 3), (2, 3), (4, 1), (3, 4), (4, 4), (1, 2)])
    class_token = rng.random() < 0.7
    pools = (["token"] * 2 if class_token else []) + ["avg", "avgmax", "max", "map", ""]
    pool = rng.choice(pools)
    args: dict[str, Any] = {
        "img_size": [gh * ph, gw * pw],
        "patch_size": [ph, pw],
        "num_classes": 0 if pool == "" else NUM_CLASSES,
        "embed_dim": width,
        "depth": rng.choice([1, 2]),
        "num_heads": heads,
        "mlp_ratio": rng.choice([4.0, 2.0, 1.0, 1.5]),
        "qkv_bias": rng.random() < 0.8,
        "qk_norm": rng.random() < 0.2,
        "class_token": class_token,
        "global_pool": pool,
        "fc_norm": rng.choice([None, None, True, False]),
        "reg_tokens": rng.choice([0, 0, 0, 1, 4]),
        "no_embed_class": rng.random() < 0.25,
        "pre_norm": rng.random() < 0.25,
        "init_values": rng.choice([None, None, 1e-5, 0.1]),
        "act_layer": rng.choice(["gelu", "gelu", "gelu_tanh", "quick_gelu"]),
        "_eps": rng.choice([1e-6, 1e-6, 1e-5]),
    }
    return args


def draw_eva(rng: random.Random) -> dict[str, Any]:
    """One random set of timm ``Eva`` settings in the layouts vitkit reads bare (EVA-02: q / v
    biases, SwiGLU, RoPE; EVA: a GELU MLP), built from ``eva02_tiny_patch14_224``."""
    width = rng.choice([192, 384])
    swiglu = rng.random() < 0.7
    patch, grid = rng.choice([8, 14]), rng.choice([2, 3])
    pool = rng.choice(["avg", "token"])
    return {
        "_arch": "eva02_tiny_patch14_224",
        "img_size": grid * patch,
        "patch_size": patch,
        "num_classes": NUM_CLASSES,
        "embed_dim": width,
        "depth": rng.choice([1, 2]),
        "num_heads": {192: 3, 384: 6}[width]
        if rng.random() < 0.4
        else rng.choice(_divisors(width, 16)),
        "mlp_ratio": 4 * 2 / 3 if swiglu else rng.choice([4.0, 2.0]),
        "swiglu_mlp": swiglu,
        "use_rot_pos_emb": rng.random() < 0.8,
        "global_pool": pool,
        "_eps": 1e-6,
    }


def eva_expected(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "num_heads": args["num_heads"],
        "pool": _TIMM_POOLS[args["global_pool"]],
        "image_size": (args["img_size"], args["img_size"]),
    }


def timm_expected(args: dict[str, Any]) -> dict[str, Any]:
    """The draw's values of :data:`COMPARED`, in vitkit's terms."""
    if "_arch" in args:
        return eva_expected(args)
    pool = args["global_pool"]
    fc_norm = pool in ("avg", "avgmax", "max") if args["fc_norm"] is None else args["fc_norm"]
    out = {
        "num_heads": args["num_heads"],
        "layer_norm_eps": args["_eps"],
        "gelu": _TIMM_GELU[args["act_layer"]],
        "fc_norm": fc_norm,
        "image_size": tuple(args["img_size"]),
        "num_reg_tokens": args["reg_tokens"],
        "pos_embed_prefix": not args["no_embed_class"],
        "has_class_token": args["class_token"],
        "norm_pre": args["pre_norm"],
        "block": "pre",
    }
    if pool:
        out["pool"] = _TIMM_POOLS[pool]
    if not (args["class_token"] or args["reg_tokens"]):  # no prefix: no prefix rows either way
        del out["pos_embed_prefix"]
    return out


def build_timm_model(timm: Any, args: dict[str, Any], seed: int) -> torch.nn.Module:
    kw = {k: v for k, v in args.items() if not k.startswith("_")}
    if "_arch" in args:
        torch.manual_seed(seed)
        return perturb(timm.create_model(args["_arch"], pretrained=False, **kw).double(), seed)
    if args["_eps"] != 1e-6:
        kw["norm_layer"] = partial(torch.nn.LayerNorm, eps=args["_eps"])
    torch.manual_seed(seed)  # (through create_model: the folder records the model_args)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, **kw)
    return perturb(model.double(), seed)


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved by N(0, 0.1): nothing zero or one left to hide a mismatch."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    return model.eval()


def draw_hf(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One Hugging Face class and random config keywords (tiny)."""
    cls = rng.choice(
        ["ViTForImageClassification", "ViTModel", "Dinov2Model", "Dinov2ForImageClassification",
         "CLIPVisionModel", "SiglipVisionModel"]
    )  # fmt: skip
    width = rng.choice([32, 48, 64])
    patch = rng.choice([4, 8])
    kw: dict[str, Any] = {
        "hidden_size": width,
        "num_hidden_layers": rng.choice([1, 2]),
        "num_attention_heads": rng.choice(_divisors(width)),
        "intermediate_size": width * rng.choice([1, 2, 4]),
        "image_size": patch * rng.choice([2, 3, 4]),
        "patch_size": patch,
        "layer_norm_eps": rng.choice([1e-6, 1e-5, 1e-12]),
        "hidden_act": rng.choice(["gelu", "gelu_pytorch_tanh", "quick_gelu", "gelu_new"]),
    }
    if cls.startswith("ViT"):
        kw["qkv_bias"] = rng.random() < 0.8
    if cls.startswith("Dinov2"):
        kw["layerscale_value"] = rng.choice([1.0, 1e-5])
        kw["use_swiglu_ffn"] = rng.random() < 0.3
        kw["qkv_bias"] = rng.random() < 0.8
        kw["mlp_ratio"] = rng.choice([1, 2, 4])
    if cls.endswith("ForImageClassification"):
        kw["num_labels"] = NUM_CLASSES
    return cls, kw


# ---------------------------------------------------------------------------------------------
# reading and classifying


def said_fields(lines: list[str]) -> set[str]:
    """The settings the AssumptionWarning lines name (``FIELD=VALUE assumed``); the line on the
    patch grid (``image_size``) says whether the prefix tokens have position rows too."""
    each = [one for line in lines for one in line.splitlines()]  # (a block: a line a setting)
    out = {m[1] for line in each for m in [re.search(r"(\w+)=\S.*? assumed", line)] if m}
    return out | ({"pos_embed_prefix"} if "image_size" in out else set())


def vitkit_read(
    path: Path, x: torch.Tensor, tokens: bool, expected: dict[str, Any] | None = None
) -> dict[str, Any]:
    """vitkit's float64 output of ``path`` on ``x`` (``tokens``: the final-normalised tokens,
    or, where the file says timm's ``global_pool=""``, the model's every token), the warnings
    said, and the compared settings whose values differ from ``expected``."""
    out: dict[str, Any]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ckpt = read_checkpoint(path)
            model = build_model(ckpt.model_config).double().eval()
            load_state_dict_strict(model, ckpt.state_dict, source=str(path))
            with torch.no_grad():
                unpooled = getattr(ckpt.model_config, "pool", None) == "none"  # timm's ''
                y = model.forward_features(x) if tokens and not unpooled else model(x)
            cfg = ckpt.model_config
            differs = {
                k: [getattr(cfg, k, None), v]
                for k, v in (expected or {}).items()
                if getattr(cfg, k, None) != v
            }
            out = {"y": y, "differs": differs}
        except VitkitError as e:
            out = {"status": "refused", "reason": str(e).strip().splitlines()[0]}
        except Exception as e:  # noqa: BLE001 - every other exception is a bug to list
            where = traceback.extract_tb(e.__traceback__)[-1].name
            out = {"status": "crashed", "reason": f"{first_line(e)} (in {where})"}
    said = []
    for w in caught:  # (one block: a summary line, then an indented line a setting)
        lines = str(w.message).strip().splitlines()
        fields = [f"{path}: {s.strip()}" for s in lines[1:] if s.startswith("  ")] or lines[:1]
        for line in fields if issubclass(w.category, AssumptionWarning) else []:
            if line not in said:
                said.append(line)
    out["warnings"] = [line.replace(str(path), "FILE") for line in said]
    if "reason" in out:
        out["reason"] = out["reason"].replace(str(path), "FILE")
    return out


def classify(ref: torch.Tensor, got: dict[str, Any]) -> dict[str, Any]:
    """A row: exact / warned / silent from the outputs, the differences and the warnings."""
    if "y" not in got:
        return {k: v for k, v in got.items() if k != "y"}
    y, said, differs = got.pop("y"), got["warnings"], got["differs"]
    if y.shape != ref.shape:
        rel = float("inf")
    else:
        rel = (y - ref).abs().max().item() / max(ref.abs().max().item(), 1e-300)
    row = {**got, "rel": rel}
    if rel <= EXACT:
        row["status"] = "exact"
    elif differs:
        row["status"] = "warned" if set(differs) <= said_fields(said) else "silent"
    else:
        row["status"] = "warned" if said_fields(said) - {"mean"} else "silent"
    return row


def check_timm(timm: Any, args: dict[str, Any], work: Path, seed: int) -> dict[str, dict]:
    """One timm draw written three ways, each read and classified."""
    from timm.models._hub import save_for_hf

    try:
        model = build_timm_model(timm, args, seed)
        g = torch.Generator().manual_seed(seed)
        size = args["img_size"]
        size = (size, size) if isinstance(size, int) else size
        x = torch.randn(2, 3, *size, generator=g, dtype=torch.float64)
        with torch.no_grad():
            ref = model(x)
    except Exception as e:  # noqa: BLE001 - the reference itself failed: not vitkit's doing
        return {s: {"status": "harness", "reason": first_line(e)} for s in SOURCES[:3]}
    tokens = ref.ndim == 3
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    expected = timm_expected(args)
    rows: dict[str, dict] = {}
    for source in SOURCES[:3]:
        folder = work / f"{seed}-{source}"
        folder.mkdir(parents=True)
        try:
            if source == "bare-safetensors":
                path = folder / "model.safetensors"
                save_file(sd, str(path))
            elif source == "bare-pth":
                path = folder / "model.pth"
                torch.save(sd, path)
            else:
                if args["_eps"] != 1e-6:  # a norm_layer with its own eps: not in model_args
                    rows[source] = {"status": "harness", "reason": "eps is not in model_args"}
                    continue
                save_for_hf(model, str(folder), safe_serialization=True)
                path = folder
        except Exception as e:  # noqa: BLE001
            rows[source] = {"status": "harness", "reason": f"writing: {first_line(e)}"}
            continue
        rows[source] = classify(ref, vitkit_read(path, x, tokens, expected))
    return rows


def check_hf(transformers: Any, cls_name: str, kw: dict[str, Any], work: Path, seed: int) -> dict:
    """One Hugging Face draw written with ``save_pretrained``, read and classified."""
    try:
        cls = getattr(transformers, cls_name)
        torch.manual_seed(seed)
        model = perturb(cls(cls.config_class(**kw)).double(), seed)
        g = torch.Generator().manual_seed(seed)
        size = kw["image_size"]
        x = torch.randn(2, 3, size, size, generator=g, dtype=torch.float64)
        with torch.no_grad():
            out = model(pixel_values=x)
        ref = out.logits if hasattr(out, "logits") else out.pooler_output
        if ref is None:
            ref = out.last_hidden_state
        folder = work / f"{seed}-hf"
        model.save_pretrained(folder, safe_serialization=True)
    except Exception as e:  # noqa: BLE001
        return {"status": "harness", "reason": first_line(e)}
    return classify(ref, vitkit_read(folder, x, tokens=ref.ndim == 3))


# ---------------------------------------------------------------------------------------------


def run(
    draws: int, seconds: float, seed: int = 0, hf_every: int = 4, eva_every: int = 4
) -> dict[str, Any]:
    """``draws`` draws (or as many as fit in ``seconds``): every ``hf_every``-th a Hugging Face
    draw, one in ``eva_every`` a timm Eva, the others timm's ``VisionTransformer``.
    ``{"rows": [...], "counts": {source: {class: n}}, ...}``."""
    timm = import_reference("timm")
    transformers = import_reference("transformers")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(draws):
            if time.perf_counter() - start > seconds:
                break
            work = Path(tmp) / str(i)
            if hf_every and i % hf_every == hf_every - 1:
                cls_name, kw = draw_hf(rng)
                row = check_hf(transformers, cls_name, kw, work, seed * 100_003 + i)
                rows.append({"draw": i, "kind": cls_name, "args": kw, "hf-folder": row})
            else:
                eva = eva_every and i % eva_every == eva_every - 2
                args = draw_eva(rng) if eva else draw_timm(rng)
                got = check_timm(timm, args, work, seed * 100_003 + i)
                kind = "timm Eva" if eva else "timm VisionTransformer"
                rows.append({"draw": i, "kind": kind, "args": args, **got})
            shutil.rmtree(work, ignore_errors=True)  # a draw's files: thousands fill a disk
    return summarise(rows, time.perf_counter() - start, seed)


def summarise(rows: list[dict[str, Any]], seconds: float, seed: int) -> dict[str, Any]:
    counts = {s: dict.fromkeys(CLASSES, 0) for s in SOURCES}
    examples: dict[str, list[dict[str, Any]]] = {c: [] for c in CLASSES if c != "exact"}
    for r in rows:
        for s in SOURCES:
            if s in r:
                c = r[s]["status"]
                counts[s][c] += 1
                if c != "exact" and len(examples[c]) < 5:
                    examples[c].append({"draw": r["draw"], "kind": r["kind"], "source": s,
                                        "args": r["args"], **r[s]})  # fmt: skip
    total = dict.fromkeys(CLASSES, 0)
    for per in counts.values():
        for c, n in per.items():
            total[c] += n
    reasons: dict[str, int] = {}  # why loads were refused (or not written), numbers as N
    for r in rows:
        for s in SOURCES:
            if s in r and r[s]["status"] in ("refused", "harness"):
                why = f"{s}: {re.sub(r'[0-9]+', 'N', r[s].get('reason', ''))[:160]}"
                reasons[why] = reasons.get(why, 0) + 1
    top = dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:12])
    return {"draws": len(rows), "seconds": round(seconds, 1), "seed": seed, "counts": counts,
            "total": total, "machine": machine(), "reasons": top, "examples": examples,
            "rows": rows}  # fmt: skip


def machine() -> str:
    """The CPU and the versions the reference and vitkit ran with."""
    import platform

    import vitkit

    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    names = [x for x in (info.read_text() if info.exists() else "").splitlines()]
    cpu = next((x.split(":", 1)[1].strip() for x in names if x.startswith("model name")), cpu)
    timm = sys.modules.get("timm")
    transformers = sys.modules.get("transformers")
    return (
        f"{cpu}; torch {torch.__version__}, timm {getattr(timm, '__version__', '?')}, "
        f"transformers {getattr(transformers, '__version__', '?')}, vitkit {vitkit.__version__}"
    )


def markdown(result: dict[str, Any], command: str) -> str:
    lines = [
        "# Loading fuzzer: checkpoints with random training settings",
        "",
        f"`{command}`: {result['draws']} draws (seed {result['seed']}) in "
        f"{result['seconds']:.0f} s. Each timm draw is written three ways, each Hugging Face draw "
        "once; a load is exact (<= 1e-9 relative in float64), warned (an AssumptionWarning names "
        "what differs), refused (one-line error), silent (differs, unsaid), crashed, or harness "
        "(the reference could not be written). See bench/fuzz_loading.py.",
        "",
        f"Machine: {result['machine']}.",
        "",
        "| source | " + " | ".join(CLASSES) + " |",
        "| --- |" + " --- |" * len(CLASSES),
    ]
    for s, per in result["counts"].items():
        lines.append(f"| {s} | " + " | ".join(str(per[c]) for c in CLASSES) + " |")
    lines.append("| all | " + " | ".join(str(result["total"][c]) for c in CLASSES) + " |")
    lines += ["", "## Why loads were refused (or not written)", ""]
    lines += [f"- {n} x {why}" for why, n in result["reasons"].items()]
    for c, exs in result["examples"].items():
        if not exs:
            continue
        lines += ["", f"## First {c} loads", ""]
        for e in exs:
            args = {k: v for k, v in e["args"].items()}
            what = e.get("reason") or "; ".join(e.get("warnings", [])[:3])
            differs = f" differs: {e['differs']}" if e.get("differs") else ""
            lines.append(f"- draw {e['draw']} {e['kind']} ({e['source']}) `{args}`:{differs} "
                         f"{what}".rstrip())  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=600.0, help="stop drawing after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "fuzz_loading"))
    a = p.parse_args(argv)
    result = run(a.draws, a.seconds, a.seed)
    command = "python bench/fuzz_loading.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(result, command.strip())
    print(text)
    if not a.no_write:
        out = Path(a.out)
        slim = {k: v for k, v in result.items() if k != "rows"}
        out.with_suffix(".json").write_text(json.dumps(slim, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
