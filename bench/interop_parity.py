"""Parity of vitkit's checkpoint readers against the references, at realistic sizes.

For each source: the max absolute logit difference between vitkit (loading the source's
weights) and the reference implementation, fp32, on the same random inputs. Official: the
fixtures produced by vit_jax (tests/fixtures/vit_jax). timm / transformers: live models built at
the S/16 and B/16 shapes (224 px) with every parameter randomised, saved in their own formats.

    python bench/interop_parity.py          # writes bench/results/interop_parity.{json,md}
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the torchvision-op shim for importing timm

from references import import_reference  # noqa: E402

import vitkit  # noqa: E402
from vitkit.checkpoints import read_checkpoint, write_checkpoint  # noqa: E402
from vitkit.checkpoints.timm import vision_transformer as timm_conv  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "vit_jax"


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model.eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for name in ("vit_token_p4", "hybrid_r1"):
        x = torch.from_numpy(np.load(FIX / f"{name}_input_nhwc.npy")).permute(0, 3, 1, 2)
        ref = np.load(FIX / f"{name}_logits.npy")
        with torch.no_grad():
            got = vitkit.load(FIX / f"{name}.npz")(x).numpy()
        rows.append(("official JAX (vit_jax)", name, float(np.abs(got - ref).max())))

    timm = import_reference("timm")
    transformers = import_reference("transformers")
    x = torch.randn(4, 3, 224, 224)
    tmp = Path(tempfile.mkdtemp())
    for size in ("S/16", "B/16"):
        for pool in ("token", "gap"):
            cfg = vitkit.model_config(size, pool=pool, gelu="none", num_classes=1000)
            ref = randomise(
                timm.create_model("vit_base_patch16_224", **timm_conv.timm_model_args(cfg)), 1
            )
            save_file(ref.state_dict(), tmp / "t.safetensors")
            model = vitkit.load(tmp / "t.safetensors")
            with torch.no_grad():
                rows.append(("timm 1.x", f"{size} {pool}", diff(model(x), ref(x))))
        hc = transformers.ViTConfig(
            **{
                "hidden_size": cfg.width,
                "num_hidden_layers": cfg.depth,
                "num_attention_heads": cfg.num_heads,
                "intermediate_size": cfg.mlp_dim,
                "num_labels": 1000,
            }
        )
        ref = randomise(transformers.ViTForImageClassification(hc), 2)
        ref.save_pretrained(tmp / "hf")
        model = vitkit.load(tmp / "hf")
        with torch.no_grad():
            rows.append(("transformers 5.x", f"{size} classifier", diff(model(x), ref(x).logits)))
        ref = randomise(transformers.ViTModel(hc), 3)
        ref.save_pretrained(tmp / "hfm")
        model = vitkit.load(tmp / "hfm")
        with torch.no_grad():
            rows.append(
                (
                    "transformers 5.x",
                    f"{size} pooler = pre-logits",
                    diff(model(x), ref(x).pooler_output),
                )
            )

    # Round trips on a randomised B/16 with a tanh pre-logits layer (npz) and without (timm, hf).
    trips = []
    for to, kw, dst in (
        ("npz", {"representation_size": 768}, "m.npz"),
        ("timm", {}, "timm"),
        ("hf", {}, "hf2"),
    ):
        m = randomise(vitkit.create_model("B/16", **kw), 4)
        from vitkit.checkpoints import Checkpoint
        from vitkit.registry.model_config import PreprocessConfig

        ck = Checkpoint(tmp, m.cfg, PreprocessConfig.for_model(m.cfg), dict(m.state_dict()))
        write_checkpoint(ck, tmp / dst, to)
        back = read_checkpoint(tmp / dst)
        exact = back.model_config == m.cfg and all(
            torch.equal(back.state_dict[k], v) for k, v in m.state_dict().items()
        )
        trips.append((f"vitkit -> {to} -> vitkit", exact))

    out = {
        "parity": [dict(source=s, model=n, max_abs_logit_diff=d) for s, n, d in rows],
        "round_trips": [dict(path=p, bitwise_equal=e) for p, e in trips],
        "versions": {
            "torch": torch.__version__,
            "timm": timm.__version__,
            "transformers": transformers.__version__,
        },
    }
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "interop_parity.json").write_text(json.dumps(out, indent=1))
    lines = ["| source | model | max abs logit diff (fp32) |", "| --- | --- | ---: |"]
    lines += [f"| {s} | {n} | {d:.2e} |" for s, n, d in rows]
    lines += ["", "| round trip (B/16, random weights) | bitwise equal |", "| --- | --- |"]
    lines += [f"| {p} | {'yes' if e else 'NO'} |" for p, e in trips]
    (res / "interop_parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
