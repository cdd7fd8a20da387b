"""Issue 28's conv-stem probe: mnist-best with the early convolutions of Xiao et al. (2021,
"Early Convolutions Help Transformers See Better") in place of the hybrid's ResNet root.

The root (a 7x7 stride-2 conv, GroupNorm, ReLU, 3x3 stride-2 max-pool) becomes two 3x3 stride-2
convs, each with BatchNorm and ReLU (1 -> 32 -> 64 channels, 28 -> 14 -> 7 px); the patch
embedding (patch 1, 64 -> 96) is their closing 1x1 conv. 479,914 parameters against 459,562,
the same step time within 1 % (bf16, 2 threads). The stem is not a vitkit model option: this
script swaps it into the model the trainer and the checkpoint loader build (a run's checkpoint
holds its weights; the config says ``resnet_width_factor=1.0``, which only this script reads as
"conv stem"), so the runs, their val splits and the paired comparison are vitkit's own.

    python bench/mnist_convstem.py train --seed 1 --threads 1 --out-dir DIR   # vitkit train args
    python bench/mnist_convstem.py probes BASE:PROBE [...] --out OUT          # mnist_probes.py
    python bench/mnist_convstem.py ensemble BASE:PROBE [...]   # the two runs' val, averaged
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import vitkit.models.vit  # noqa: E402
import vitkit.train.run  # noqa: E402
from vitkit.engines.allocator import keep_freed_memory  # noqa: E402

BENCH = Path(__file__).resolve().parent
CHANNELS = (32, 64)


class ConvStem(nn.Sequential):
    """3x3 stride-2 conv (no bias), BatchNorm, ReLU per entry of ``channels`` (He init)."""

    def __init__(self, cin: int, channels: tuple[int, ...]) -> None:
        layers: list[nn.Module] = []
        for c in channels:
            layers += [nn.Conv2d(cin, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
            cin = c
        super().__init__(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")


_build = vitkit.models.vit.build_model


def build_model(cfg: Any) -> nn.Module:
    """vitkit's model, with the conv stem when the config is the probe's (root only, x1)."""
    model = _build(cfg)
    if getattr(cfg, "resnet_layers", None) == () and cfg.resnet_width_factor == 1.0:
        assert cfg.patch_in_chans == CHANNELS[-1]
        model.patch_embed.stem = ConvStem(cfg.in_chans, CHANNELS)
    return model


def ensemble(pairs: list[str]) -> None:
    """Val errors of each run and of the mean of their probabilities, plain and nine views."""
    sys.path.insert(0, str(BENCH))
    from mnist_tta import SETS, model_inputs, views

    nine = SETS["+ rotations and zooms (9)"]

    def probs(run: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model, _, ds, batches = model_inputs(run, "val")
        plain, tta = [], []
        with torch.inference_mode():
            for x in batches:
                vs = [model(v).float().softmax(-1) for k, v in views(x).items() if k in nine]
                plain.append(vs[0])  # "id" comes first
                tta.append(torch.stack(vs).mean(0))
        return torch.cat(plain), torch.cat(tta), torch.as_tensor(ds.labels)

    for pair in pairs:
        base, probe = pair.split(":")
        (pa, ta, y), (pb, tb, y2) = probs(base), probs(probe)
        assert torch.equal(y, y2), "the two runs hold out different val images"

        def errors(p: torch.Tensor, y: torch.Tensor = y) -> int:
            return int((p.argmax(-1) != y).sum())

        print(
            f"{probe}: val errors of {len(y)}: plain base {errors(pa)}, probe {errors(pb)}, "
            f"both {int(((pa.argmax(-1) != y) & (pb.argmax(-1) != y)).sum())}, ensemble "
            f"{errors(pa + pb)}; nine views base {errors(ta)}, probe {errors(tb)}, "
            f"ensemble {errors(ta + tb)}"
        )


def install() -> None:
    """Every model vitkit builds from here on is built by :func:`build_model`."""
    vitkit.models.vit.build_model = build_model  # the checkpoint loader imports it at call time
    vitkit.train.run.build_model = build_model  # the trainer imported it by name


def main() -> None:
    install()
    what, args = sys.argv[1], sys.argv[2:]
    if what == "train":
        keep_freed_memory()
        from vitkit.cli import main as vitkit_main

        sys.exit(
            vitkit_main(["train", "--recipe", "mnist-best", "-o", "resnet_width_factor=1.0", *args])
        )
    if what == "probes":
        sys.argv = ["mnist_probes.py", *args]
        sys.path.insert(0, str(BENCH))
        runpy.run_path(str(BENCH / "mnist_probes.py"), run_name="__main__")
    elif what == "ensemble":
        ensemble(args)
    else:
        sys.exit(f"mnist_convstem.py: unknown command {what!r} (train, probes, ensemble)")


if __name__ == "__main__":
    main()
