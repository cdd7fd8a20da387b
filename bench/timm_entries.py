"""Write ``src/vitkit/checkpoints/timm/entries.json`` from the installed timm.

For every registered entry vitkit reads (``vitkit.checkpoints.timm.names``): the layout facts of
the state dict timm builds for it (``vitkit.checkpoints.arch.layout_facts``, the model built on
the meta device, so no memory and no weights) and its default ``pretrained_cfg`` (the input and
its preprocessing). Run: ``python bench/timm_entries.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from references import import_reference  # noqa: E402

from vitkit.checkpoints.arch import layout_facts
from vitkit.checkpoints.timm.names import EVA_NAMES, TIMM_VERSION, VIT_NAMES

_PRE = ("input_size", "mean", "std", "crop_pct", "crop_mode", "interpolation")
OUT = Path(__file__).resolve().parents[1] / "src/vitkit/checkpoints/timm/entries.json"


def main() -> int:
    timm = import_reference("timm")
    if timm.__version__ != TIMM_VERSION:
        print(f"timm {timm.__version__} installed; the tables are for {TIMM_VERSION}")
        return 1
    out: dict[str, dict[str, object]] = {}
    for name in sorted(VIT_NAMES | EVA_NAMES):
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        pcfg = dict(getattr(model, "pretrained_cfg", {}) or {})
        out[name] = {
            "layout": layout_facts(shapes, list(pcfg.get("input_size", [3]))[1:] or None),
            "pretrained_cfg": {k: pcfg[k] for k in _PRE if pcfg.get(k) is not None},
        }
    OUT.write_text(json.dumps({"timm": TIMM_VERSION, "entries": out}, sort_keys=True) + "\n")
    print(f"{len(out)} entries -> {OUT.relative_to(OUT.parents[4])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
