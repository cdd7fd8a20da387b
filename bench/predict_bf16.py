"""``vitkit predict --precision bf16`` over image files, whole command, against a timm script.

A B/16 checkpoint (random weights, 1000 classes, the libraries' common erf GELU) and ``--images``
PNG files at 224x224 are written to a temporary folder; the timm script gets the same weights
as a timm checkpoint (``vitkit convert --to timm``). Timed, each as a fresh process, interleaved
over ``--rounds`` rounds (medians):

- ``vitkit predict --from CK IMAGES --precision bf16 --top-k 1`` (the weights in bf16, converted
  once; every image in one forward);
- ``vitkit predict --from DIR IMAGES --top-k 1``, DIR the engine directory ``vitkit export CK DIR
  --precision bf16`` wrote once before the rounds (OpenVINO at its bf16 precision; where
  OpenVINO is installed; the export's own time is reported beside);
- ``vitkit predict --from CK IMAGES --top-k 1`` (fp32, for reference; ``--no-fp32``: off);
- a timm script: ``timm.create_model`` + the timm checkpoint, PIL decode, resize 224, the
  ImageNet normalisation, ``torch.autocast("cpu", torch.bfloat16)`` in batches of 32, top-1.

The host's fp32 and bf16 matmul ceilings are measured in the same run (bench/speed.py's
``matmul_ceiling``; bf16 the best library's, bench/ceilings.py), before and after the commands.

    python bench/predict_bf16.py --images 128 --rounds 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from ceilings import bf16_ceilings  # noqa: E402
from speed import matmul_ceiling  # noqa: E402

import vitkit  # noqa: E402
from vitkit.checkpoints import save_checkpoint  # noqa: E402
from vitkit.hardware import cpu_name  # noqa: E402

TIMM_SCRIPT = """
import sys, torch
from PIL import Image
from safetensors.torch import load_file
sys.path.insert(0, sys.argv[1])
from references import import_reference  # timm with this CPU build's torchvision shim
timm = import_reference("timm")
ck, paths = sys.argv[2], sys.argv[3:]
model = timm.create_model("vit_base_patch16_224", num_classes=1000)
model.load_state_dict(load_file(ck))
model.eval()
mean = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
std = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
    for i in range(0, len(paths), 32):
        imgs = [Image.open(p).convert("RGB").resize((224, 224), Image.BICUBIC)
                for p in paths[i:i+32]]
        x = torch.stack([torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
                         .view(224, 224, 3).permute(2, 0, 1) for im in imgs]).float() / 255
        top = model((x - mean) / std).float().softmax(-1).max(-1)
        for p, v, j in zip(paths[i:i+32], top.values.tolist(), top.indices.tolist()):
            print(f"{p}: {j} {100 * v:.1f}%")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-fp32", dest="fp32", action="store_false")
    ap.add_argument("--out", default=str(ROOT / "bench/results/predict_bf16"))
    args = ap.parse_args()
    cpu = torch.device("cpu")
    ceilings = {"fp32": [matmul_ceiling(torch.float32, cpu)]}
    ceilings["bf16"] = [bf16_ceilings()["bf16"]]
    with tempfile.TemporaryDirectory(prefix="vitkit-predict-bf16-") as tmp:
        d = Path(tmp)
        torch.manual_seed(0)
        cfg = vitkit.model_config("B/16", image_size=224, num_classes=1000, gelu="none")
        model = vitkit.create_model(cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        save_checkpoint(d / "ck", model)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        vk = [sys.executable, "-m", "vitkit"]
        subprocess.run([*vk, "convert", str(d / "ck"), str(d / "timm.safetensors"), "--to",
                        "timm"], check=True, env=env, capture_output=True)  # fmt: skip
        rng = np.random.default_rng(0)
        images = []
        for i in range(args.images):
            path = d / f"img{i:04d}.png"
            Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(path)
            images.append(str(path))
        commands = {
            "vitkit predict --precision bf16": [
                *vk, "predict", "--from", str(d / "ck"), *images, "--top-k", "1",
                "--precision", "bf16",
            ],
            "timm script, bf16 autocast, batch 32": [
                sys.executable, "-c", TIMM_SCRIPT, str(ROOT / "tests"),
                str(d / "timm.safetensors"), *images,
            ],
        }  # fmt: skip
        export_s = None
        if importlib.util.find_spec("openvino") is not None:
            start = time.perf_counter()
            subprocess.run([*vk, "export", str(d / "ck"), str(d / "ov-bf16"), "--precision",
                            "bf16"], check=True, env=env, capture_output=True)  # fmt: skip
            export_s = time.perf_counter() - start
            commands["vitkit predict --from an exported bf16 engine (OpenVINO)"] = [
                *vk, "predict", "--from", str(d / "ov-bf16"), *images, "--top-k", "1",
            ]  # fmt: skip
        if args.fp32:
            commands["vitkit predict (fp32)"] = [
                *vk, "predict", "--from", str(d / "ck"), *images, "--top-k", "1"
            ]  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in commands}
        outputs: dict[str, list[str]] = {}
        for r in range(args.rounds):
            order = list(commands) if r % 2 == 0 else list(reversed(commands))
            for name in order:
                start = time.perf_counter()
                done = subprocess.run(commands[name], env=env, capture_output=True, text=True)
                times[name].append(time.perf_counter() - start)
                if done.returncode != 0:
                    sys.exit(f"{name} failed: {done.stderr[-2000:]}")
                outputs[name] = [ln for ln in done.stdout.splitlines() if ln.startswith(tmp)]
                print(f"round {r}: {name}: {times[name][-1]:.1f} s", flush=True)
        top1 = {k: [ln.split(": ")[1].split()[0] for ln in v] for k, v in outputs.items()}
    ceilings["fp32"].append(matmul_ceiling(torch.float32, cpu))
    ceilings["bf16"].append(bf16_ceilings()["bf16"])
    med = {k: statistics.median(v) for k, v in times.items()}
    timm_key = "timm script, bf16 autocast, batch 32"
    ref = top1["vitkit predict (fp32)"] if args.fp32 else top1[timm_key]
    rows = [
        {
            "command": k,
            "seconds": med[k],
            "times_s": times[k],
            "images_per_s": args.images / med[k],
            "x_timm_bf16": med[timm_key] / med[k],
            "top1_same_as_reference": float(np.mean([a == b for a, b in zip(top1[k], ref)])),
        }
        for k in commands
    ]
    meta = {
        "cpu": cpu_name(),
        "command": "python bench/predict_bf16.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "images": args.images,
        "rounds": args.rounds,
        "ceilings_gflop_s_before_after": {k: [v / 1e9 for v in vs] for k, vs in ceilings.items()},
        "export_bf16_s": export_s,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    c = meta["ceilings_gflop_s_before_after"]
    lines = [
        f"# vitkit predict --precision bf16 against a timm bf16 autocast script ({args.images} "
        "images of B/16, whole command)",
        "",
        f"CPU: {meta['cpu']}. torch {meta['torch']}. Command: `{meta['command']}` "
        f"({args.rounds} rounds, interleaved, median; each a fresh process; random weights and "
        "images). Matmul ceilings measured in the run (before / after): fp32 "
        f"{c['fp32'][0]:.0f} / {c['fp32'][1]:.0f} GFLOP/s, bf16 {c['bf16'][0]:.0f} / "
        f"{c['bf16'][1]:.0f} GFLOP/s.",
        "",
        "| command | seconds | images/s | x timm bf16 script | top-1 as reference |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['command']} | {r['seconds']:.1f} | {r['images_per_s']:.2f} | "
        f"{r['x_timm_bf16']:.2f} | {100 * r['top1_same_as_reference']:.1f} % |"
        for r in rows
    ]
    lines += ["", f"Reference for top-1: {'vitkit predict (fp32)' if args.fp32 else timm_key}."]
    if export_s is not None:
        lines += [
            f"The engine directory was written once before the rounds: `vitkit export CK DIR "
            f"--precision bf16` took {export_s:.1f} s (ONNX export, OpenVINO conversion and its "
            "accuracy check)."
        ]
    lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
