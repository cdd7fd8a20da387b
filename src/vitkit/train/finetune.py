"""Fine-tuning as the paper does it, including its learning-rate selection.

"We fine-tune ... and choose the learning rate from {0.001, 0.003, 0.01, 0.03} on a held-out
slice of the training set" (Sec. 4.1 and Appendix B.1.1: 2 % of the training data held out, 10 %
for small datasets). :func:`lr_sweep` trains one run per learning rate with that slice held out,
picks the best by held-out top-1, and then (by default) trains again with the chosen learning
rate on the whole training set; the test set is only used for the final run's report.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.checkpoints import atomic_write_text
from vitkit.errors import VitkitError
from vitkit.train.trainer import TrainConfig, Trainer


def lr_sweep(
    cfg: TrainConfig,
    lrs: Sequence[float],
    *,
    holdout: int | float = 0.1,
    retrain: bool = True,
) -> dict[str, Any]:
    """Run the sweep under ``cfg.out_dir`` (``lr_<value>/`` per learning rate, ``final/``) and
    write ``sweep.json``; returns it."""
    if not lrs:
        raise VitkitError("the learning-rate sweep needs at least one learning rate")
    if cfg.init_from is None:
        raise VitkitError("a fine-tuning sweep starts from a checkpoint (init_from)")
    root = Path(cfg.out_dir)
    runs: list[dict[str, Any]] = []
    for lr in lrs:
        run_cfg = dataclasses.replace(
            cfg, lr=lr, val_size=holdout, out_dir=str(root / f"lr_{lr:g}")
        )
        report = Trainer(run_cfg).fit()
        val = _final_val_top1(Path(run_cfg.out_dir))
        runs.append({"lr": lr, "val_top1": val, "out_dir": run_cfg.out_dir, "report": report})
    best = max(runs, key=lambda r: (r["val_top1"], -r["lr"]))
    result: dict[str, Any] = {
        "lrs": list(lrs),
        "holdout": holdout,
        "runs": [{k: v for k, v in r.items() if k != "report"} for r in runs],
        "chosen_lr": best["lr"],
    }
    if retrain:
        final_cfg = dataclasses.replace(cfg, lr=best["lr"], val_size=0, out_dir=str(root / "final"))
        final = Trainer(final_cfg).fit()
        result["final"] = {"out_dir": final_cfg.out_dir, "report": final}
    else:
        result["final"] = {"out_dir": best["out_dir"], "report": best["report"]}
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "sweep.json", json.dumps(result, indent=1))
    return result


def _final_val_top1(run_dir: Path) -> float:
    """The held-out top-1 after the last epoch, from the run's metrics.jsonl."""
    last = None
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "val_top1" in rec:
            last = rec["val_top1"]
    if last is None:
        raise VitkitError(f"{run_dir}: no held-out evaluation was recorded")
    return float(last)
