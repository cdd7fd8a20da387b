"""Progress off a terminal (a log file, a pipe, CI) is plain lines, one per epoch, not
carriage-return redraws; and a run directory keeps one report.html."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from vitkit.cli import main
from vitkit.data.shards_write import write_dataset_shards
from vitkit.train.trainer import TrainConfig, Trainer

TINY = {"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 16}


def test_off_a_terminal_a_bar_is_one_line_at_the_end() -> None:
    from vitkit.progress import LineProgress, progress

    stream = io.StringIO()
    bar = progress(total=500, desc="epoch 1/3", stream=stream)
    assert isinstance(bar, LineProgress)
    for _ in range(500):
        bar.update(1)
        bar.set_postfix(loss="0.123")
    bar.close()
    bar.close()  # closing twice writes once
    assert stream.getvalue().startswith("epoch 1/3: 500/500, loss=0.123 (")
    assert stream.getvalue().count("\n") == 1 and "\r" not in stream.getvalue()


def test_a_long_bar_also_writes_a_line_every_n_seconds() -> None:
    from vitkit.progress import progress

    stream = io.StringIO()
    items = list(progress(range(3), total=3, desc="eval", stream=stream, every=0.0, leave=False))
    assert items == [0, 1, 2]
    assert stream.getvalue().splitlines() == [f"eval: {i}/3 (0 s)" for i in (1, 2, 3)]


def test_a_logged_run_writes_a_line_per_epoch_and_keeps_one_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    cfg = TrainConfig(
        data="digits", model="Ti/4", model_overrides=TINY, epochs=2, batch_size=256,
        out_dir=str(run),
    )  # fmt: skip
    Trainer(cfg).fit()
    err = capsys.readouterr().err
    assert "\r" not in err and len(err) < 2000  # (a logged run once wrote 150 KB of redraws)
    lines = err.splitlines()
    for epoch in (1, 2):
        assert sum(line.startswith(f"epoch {epoch}/2: 5/5, loss=") for line in lines) == 1, err
    # Each epoch's record is one line for people (the JSON stays in metrics.jsonl): it used to
    # print the raw {"step": ...} record.
    assert not [line for line in lines if line.startswith("{")], err
    ends = [line for line in lines if line.startswith("after epoch ")]
    assert [line.split(":")[0] for line in ends] == ["after epoch 1/2", "after epoch 2/2"], err
    top1 = (
        100
        * [json.loads(r) for r in (run / "metrics.jsonl").open() if "val_top1" in r][-1]["val_top1"]
    )
    assert f"val_top1 {top1:.2f} %" in ends[-1], err
    # One report.html per run; 'vitkit analyze' on the run never replaces what train wrote
    # (RUN/analysis, RUN/report.html) without --overwrite: it moves on to RUN/analysis-2.
    assert [p.relative_to(run) for p in run.rglob("report.html")] == [Path("report.html")]
    before = {p: p.read_bytes() for p in [run / "report.html", *(run / "analysis").iterdir()]}
    assert main(["analyze", "--from", str(run), "--num-images", "16"]) == 0
    assert {p: p.read_bytes() for p in before} == before
    assert (run / "analysis-2" / "report.html").is_file()
    assert str(run / "analysis-2" / "report.html") in capsys.readouterr().out
    assert main(["analyze", "--from", str(run), "--num-images", "16", "--overwrite"]) == 0
    after = (run / "report.html").read_text()
    assert after != before[run / "report.html"].decode() and ">Training</h2>" in after
    assert str(run / "report.html") in capsys.readouterr().out


def test_writing_shards_to_a_log_is_one_line_per_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset_shards("digits", tmp_path / "shards", ["test"], progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith("test shards: 359/359 (")
    assert err.count("\n") == 1


def test_a_run_cut_by_max_steps_counts_the_epochs_it_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The banner said "1 epoch" and the progress line "epoch 1/9: 2/5" for a 9-epoch recipe
    cut at 2 steps: both count the epochs and steps the run does."""
    tiny = [x for k, v in TINY.items() for x in ("-o", f"{k}={v}")]
    argv = ["train", "--data", "digits", "--model", "Ti/4", *tiny, "--batch-size", "256"]
    argv += ["--epochs", "9", "--max-steps", "2", "--out-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("training ") and ", 1 epoch, 2 steps," in line for line in lines)
    assert [line.split(", loss=")[0] for line in lines if line.startswith("epoch ")] == [
        "epoch 1/1: 2/2"
    ]
