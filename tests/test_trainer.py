"""The Trainer through its Python API on tiny data (the CLI tests cover the command line)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from vitkit.checkpoints import load_model
from vitkit.train.compile import cpu_compiler
from vitkit.train.trainer import TrainConfig, Trainer

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def config(out: Path, **changes: object) -> TrainConfig:
    base = {
        "data": "digits",
        "model": "Ti/2",
        "model_overrides": TINY,
        "epochs": 1,
        "batch_size": 32,
        "lr": 3e-3,
        "augment": "none",
        "precision": "fp32",
        "progress": False,
        "out_dir": str(out),
        "log_every": 1,
    }
    base.update(changes)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_gradient_accumulation_equals_the_large_batch(tmp_path: Path) -> None:
    """Two micro-batches of 16 accumulate to the same update as one batch of 32.

    SGD, because Adam divides by the gradient's own magnitude and so blows rounding noise in
    gradients that are zero in exact arithmetic (the key bias) up to full-size updates."""
    whole = Trainer(config(tmp_path / "a", max_steps=6, optimizer="sgd", lr=0.1))
    whole.fit()
    accum = Trainer(config(tmp_path / "b", max_steps=6, optimizer="sgd", lr=0.1, accum_steps=2))
    accum.fit()
    assert accum.step == whole.step == 6
    for (name, a), b in zip(whole.model.state_dict().items(), accum.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    changed = load_model(tmp_path / "a")[0].state_dict()["head.weight"]
    assert changed.abs().sum() > 0  # the head starts at zero: training really moved it


def test_learning_rate_follows_the_schedule(tmp_path: Path) -> None:
    trainer = Trainer(config(tmp_path / "r", epochs=2, warmup_steps=3, schedule="linear"))
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").open()]
    logged = {r["step"]: r["lr"] for r in records if "lr" in r}
    assert len(logged) == trainer.total_steps
    for step, lr in logged.items():  # the lr of update `step` (1-based) is schedule(step - 1)
        assert lr == pytest.approx(trainer.lr_at(step - 1))
    assert logged[1] == pytest.approx(3e-3 / 3) and logged[3] == pytest.approx(3e-3)
    assert logged[trainer.total_steps] < logged[4] < logged[3]


def test_no_validation_split_and_max_steps(tmp_path: Path) -> None:
    trainer = Trainer(config(tmp_path / "v", val_size=0, max_steps=4, epochs=5))
    assert trainer.val_set is None and trainer.total_steps == 4
    report = trainer.fit()
    assert report["steps"] == 4 and "test_top1" in report
    records = [json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").open()]
    assert not any("val_top1" in r for r in records)


def test_weight_decay_skips_embeddings_and_norms(tmp_path: Path) -> None:
    """The trainer's AdamW decays weight matrices only (not norms, biases, pos_embed, cls)."""
    trainer = Trainer(config(tmp_path / "g", weight_decay=0.3))
    decayed = {id(p) for p in trainer.optimizer.param_groups[0]["params"]}
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.3
    assert trainer.optimizer.param_groups[1]["weight_decay"] == 0.0
    for name, p in trainer.model.named_parameters():
        expect = p.ndim >= 2 and name not in ("pos_embed", "cls_token")
        assert (id(p) in decayed) == expect, name


def test_a_second_run_into_the_same_directory_is_refused(tmp_path: Path) -> None:
    from vitkit.errors import VitkitError

    Trainer(config(tmp_path / "d", max_steps=2)).fit()
    with pytest.raises(VitkitError, match="--resume"):
        Trainer(config(tmp_path / "d", max_steps=2)).fit()


@pytest.mark.skipif(cpu_compiler() is None, reason="torch.compile on the CPU needs a C++ compiler")
def test_compiled_training_follows_eager_training(tmp_path: Path) -> None:
    """`compile` changes how the step runs, not what it computes: the same losses and weights
    as eager training (to fused-kernel rounding), and a checkpoint with the model's own names."""
    kw = {"max_steps": 4, "optimizer": "sgd", "lr": 0.1}
    eager = Trainer(config(tmp_path / "eager", **kw))
    eager.fit()
    compiled = Trainer(config(tmp_path / "compiled", compile="default", **kw))
    assert compiled.forward_model is not compiled.model  # really compiled
    compiled.fit()
    losses = []
    for run in ("eager", "compiled"):
        records = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
        losses.append([r["train_loss"] for r in records if "train_loss" in r])
    assert len(losses[0]) == 4
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    for (name, a), b in zip(
        eager.model.state_dict().items(), load_model(tmp_path / "compiled")[0].state_dict().values()
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_compile_mode_is_checked(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="compile must be one of"):
        config(tmp_path, compile="fastest")


def test_divergence_stops_at_once_and_keeps_the_last_finite_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN loss stops the run with one line naming the step (no NaN update, no NaN
    checkpoint); ``vitkit eval`` of NaN weights says so instead of reporting an accuracy."""
    from vitkit.checkpoints import save_checkpoint
    from vitkit.cli import main
    from vitkit.errors import VitkitError

    trainer = Trainer(config(tmp_path / "d", lr=1e6, max_steps=20, ckpt_every=1))
    with pytest.raises(VitkitError, match=r"diverged at step \d+: the loss is nan \(last finite"):
        trainer.fit()
    assert trainer.step < 20
    saved = sorted((tmp_path / "d" / "checkpoints").glob("step_*"))
    assert saved and not (tmp_path / "d" / "report.json").exists()
    for ckpt in saved:
        for name, t in load_model(ckpt)[0].state_dict().items():
            assert torch.isfinite(t).all(), f"{ckpt.name}: {name}"

    model, ckpt = load_model(saved[-1])
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    save_checkpoint(tmp_path / "nan", model, preprocess=ckpt.preprocess, meta=ckpt.meta)
    assert main(["eval", "--from", str(tmp_path / "nan")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "NaN or infinite" in err and "head.weight" in err


def test_epoch_records_carry_training_wall_time_that_a_resume_goes_on_from(
    tmp_path: Path,
) -> None:
    """``elapsed_s`` (accuracy against wall time, docs/experiments.md) grows epoch by epoch, and
    a resumed run adds to the last record's instead of starting again at 0."""
    Trainer(config(tmp_path / "t", epochs=2, max_steps=None)).fit()
    records = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").open()]
    first = [r["elapsed_s"] for r in records if "val_top1" in r]
    assert len(first) == 2 and 0 < first[0] < first[1]
    import shutil

    from vitkit.checkpoints import LATEST

    run = tmp_path / "killed"  # as if killed after the first epoch's checkpoint
    shutil.copytree(tmp_path / "t", run)
    epoch1 = sorted((run / "checkpoints").glob("step_*"))[0].name
    (run / "checkpoints" / LATEST).write_text(epoch1 + "\n")
    text = (run / "metrics.jsonl").read_text()  # an hour in before the kill, say
    (run / "metrics.jsonl").write_text(
        text.replace(f'"elapsed_s": {first[0]}', '"elapsed_s": 3600.0')
    )
    start = time.perf_counter()
    Trainer(config(run, epochs=2, max_steps=None, resume=True)).fit()
    resumed_wall = time.perf_counter() - start
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    after = [r["elapsed_s"] for r in records if "val_top1" in r]
    # the resumed epoch's training time goes on from the hour: more than it, by no more than
    # the resumed run's own wall time (measured here, so the bound holds on a loaded host)
    assert len(after) == 2 and after[0] == 3600.0 and 3600.0 < after[1] <= 3600.0 + resumed_wall
