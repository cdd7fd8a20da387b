"""Early stopping (the Trainer's ``early_stop``) and the training-loss convergence diagnostic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vitkit.checkpoints import load_checkpoint
from vitkit.errors import VitkitError
from vitkit.train.convergence import EarlyStopping, train_loss_convergence
from vitkit.train.trainer import TrainConfig, Trainer

STEPS_PER_EPOCH = 5  # 320 training images (the validation slice is held out before)
TINY = {"width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}


def config(out: Path, **changes: object) -> TrainConfig:
    base = {
        "data": "digits",
        "model": "Ti/2",
        "model_overrides": TINY,
        "epochs": 1,
        "batch_size": 64,
        "lr": 3e-3,
        "augment": "none",
        "precision": "fp32",
        "progress": False,
        "out_dir": str(out),
        "log_every": 1,
        "train_size": 320,
        "val_size": 64,
    }
    base.update(changes)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_early_stopping_state() -> None:
    es = EarlyStopping(patience=2)
    assert es.update(1.0, 1) and es.best_epoch == 1
    assert not es.update(1.0, 2) and not es.stopped  # equal is no improvement
    assert es.update(0.5, 3) and es.bad_evals == 0
    assert not es.update(float("nan"), 4)
    assert not es.update(0.7, 5) and es.stopped and es.best_epoch == 3
    again = EarlyStopping(patience=2)
    again.load_state_dict(json.loads(json.dumps(es.state_dict())))
    assert again == es


def test_a_run_that_cannot_improve_stops_after_its_patience(tmp_path: Path) -> None:
    """lr 0: the weights never change, so the validation loss after epoch 1 is never beaten;
    with patience 2 the run stops after epoch 3 of 10, and evaluates epoch 1's weights."""
    cfg = config(tmp_path / "run", lr=0.0, weight_decay=0.0, epochs=10, early_stop=2)
    report = Trainer(cfg).fit()
    assert report["early_stopped"] is True
    assert (report["stopped_epoch"], report["best_epoch"]) == (3, 1)
    assert report["epochs"] == 3 and report["steps"] == 3 * STEPS_PER_EPOCH
    assert report["early_stop"] == {"metric": "val_loss", "patience": 2}
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["best_epoch"] == 1 and saved["best_val_loss"] == pytest.approx(
        report["best_val_loss"]
    )
    records = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    evals = [r for r in records if "val_loss" in r]
    assert [r["epoch"] for r in evals] == [1, 2, 3]
    assert [r.get("best", False) for r in evals] == [True, False, False]
    assert evals[-1]["early_stopped"] is True
    best, last = load_checkpoint(tmp_path / "run" / "best"), load_checkpoint(tmp_path / "run")
    assert best.model_config == last.model_config
    assert all(torch.equal(best.state_dict[k], v) for k, v in last.state_dict.items())  # lr 0


def test_the_test_accuracy_is_the_best_checkpoints(tmp_path: Path) -> None:
    """A run that improves then is cut by patience: its test metrics are the best weights'."""
    cfg = config(tmp_path / "run", lr=3e-2, epochs=4, early_stop=1)
    report = Trainer(cfg).fit()
    best = load_checkpoint(tmp_path / "run" / "best").state_dict
    last = load_checkpoint(tmp_path / "run").state_dict
    trainer = Trainer(config(tmp_path / "other", epochs=1))
    trainer.model.load_state_dict(best)
    assert trainer.evaluate(trainer.test_set).top1 == pytest.approx(report["test_top1"])
    if report["best_epoch"] != report["stopped_epoch"]:  # otherwise the two are the same weights
        assert any(not torch.equal(v, last[k]) for k, v in best.items())


def test_early_stopping_survives_a_resume(tmp_path: Path) -> None:
    """Killed after epoch 2 of an lr-0 run, resumed: it still stops after epoch 3."""
    out = tmp_path / "run"
    cfg2 = config(out, lr=0.0, weight_decay=0.0, epochs=10, early_stop=2)

    class Killed(Exception):
        pass

    def kill(trainer: Trainer, record: dict) -> None:
        if record["epoch"] == 2:
            raise Killed

    with pytest.raises(Killed):
        Trainer(cfg2).fit(on_epoch_end=kill)
    report = Trainer(TrainConfig(**{**cfg2.to_dict(), "resume": True, "betas": cfg2.betas})).fit()
    assert (report["stopped_epoch"], report["best_epoch"], report["early_stopped"]) == (3, 1, True)


def test_early_stop_needs_a_validation_split(tmp_path: Path) -> None:
    with pytest.raises(VitkitError, match="needs val_size > 0"):
        config(tmp_path, val_size=0, early_stop=3)
    with pytest.raises(VitkitError, match="at least 1"):
        config(tmp_path, early_stop=0)


def test_convergence_diagnostic() -> None:
    flat = [{"step": s, "train_loss": 1.0} for s in range(1, 101)]
    assert train_loss_convergence(flat)["rel_change_last_20pct"] == pytest.approx(0.0)
    falling = [{"step": s, "train_loss": 100.0 / s} for s in range(1, 101)]
    change = train_loss_convergence(falling)["rel_change_last_20pct"]
    assert -0.2 < change < -0.05  # 1/s: the last 10 % sit ~10 % below the 10 % before
    assert train_loss_convergence([])["rel_change_last_20pct"] is None
    assert train_loss_convergence([{"step": 5, "val_loss": 1.0}])["steps"] == 0


def test_every_report_has_the_convergence_diagnostic(tmp_path: Path) -> None:
    report = Trainer(config(tmp_path / "run", max_steps=8, epochs=2)).fit()
    conv = report["convergence"]
    assert conv["steps"] == 8 and conv["rel_change_last_20pct"] is not None
    assert "early_stopped" not in report  # off by default: the report is as before
