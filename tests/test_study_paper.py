"""The paper-finding studies (``vitkit study inside | selfsup | resolution``): their measures on
inputs whose answer is known, their summaries on hand-made runs, and each study's --smoke end to
end through the CLI, twice (the second call must train nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitkit import create_model
from vitkit.analysis import position_embedding_similarity, row_column_structure
from vitkit.cli import main
from vitkit.studies.common import RunResult
from vitkit.studies.inside import depth_spearman, head_shares
from vitkit.studies.measures import json_ready, percent, ranks, spearman
from vitkit.studies.resolution import summarize_resolution
from vitkit.studies.runs import loss_change, weights_of
from vitkit.studies.selfsup import summarize_selfsup


def grid_distances(g: int) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
    p = torch.stack([ys.reshape(-1), xs.reshape(-1)], 1).double()
    return torch.cdist(p, p)


# ----- measures -------------------------------------------------------------------------------


def test_row_column_structure_of_a_row_plus_column_table_through_a_model():
    # Each patch's embedding is [one-hot(row), one-hot(column)]: two patches in the same row or
    # column have cosine 1/2, all others 0, whatever their distance.
    g = 4
    model = create_model(
        "Ti/4", image_size=4 * g, num_classes=2, width=2 * g, depth=1, num_heads=2, mlp_dim=8
    )
    rows = F.one_hot(torch.arange(g).repeat_interleave(g), g).float()
    cols = F.one_hot(torch.arange(g).repeat(g), g).float()
    with torch.no_grad():
        model.pos_embed[0, 1:] = torch.cat([rows, cols], dim=1)
    stats = row_column_structure(position_embedding_similarity(model))
    assert stats.same_row == pytest.approx(0.5)
    assert stats.same_column == pytest.approx(0.5)
    assert stats.other == pytest.approx(0.0, abs=1e-7)
    assert stats.line_excess == pytest.approx(0.5)
    assert stats.line_excess_at_distance == pytest.approx(0.5)


@pytest.mark.parametrize("decay", [lambda d: torch.exp(-d), lambda d: 1 - d / d.max()])
def test_locality_alone_is_not_row_column_structure(decay):
    # A similarity that depends only on distance: same-row/column pairs are closer on average,
    # so the raw excess is positive, but at equal distance there is (almost) none.
    g = 8
    stats = row_column_structure(decay(grid_distances(g)).reshape(g, g, g, g))
    assert stats.line_excess > 0.09
    assert abs(stats.line_excess_at_distance) < 0.003


def test_row_column_structure_refuses_a_single_row():
    from vitkit.errors import VitkitError

    with pytest.raises(VitkitError, match="1 x 4 grid"):
        row_column_structure(torch.zeros(1, 4, 1, 4))


def test_spearman_on_known_inputs():
    assert ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    assert spearman([1, 2, 3, 4, 5], [10, 20, 30, 40, 50]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4, 5], [0.9, 0.5, 0.4, 0.2, 0.1]) == pytest.approx(-1.0)
    # With a tie, by hand: ranks y = 1, 2, 3.5, 5, 3.5; cov 8, var 10 and 9.5.
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert math.isnan(spearman([1, 2, 3], [4, 4, 4]))


def test_json_ready_and_percent():
    assert json_ready({"a": [1.0, math.nan, (math.inf, 2)], "b": "x"}) == {
        "a": [1.0, None, [None, 2]],
        "b": "x",
    }
    assert percent(0.1234) == "12.3 %" and percent(-0.01, signed=True) == "-1.0 %"
    assert percent(math.nan) == "n/a"


def test_head_shares_and_depth_correlation():
    shares = head_shares([1.0, 5.0, 10.0, 20.0], uniform=20.0)
    assert shares == {
        "global_share": 0.5,  # 10 and 20 are >= 10
        "local_share": 0.25,  # 1 is < 5
        "min_relative": 0.05,
        "max_relative": 1.0,
    }
    growing = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert depth_spearman(growing) == pytest.approx(spearman([0, 0, 1, 1, 2, 2], range(6)))
    assert depth_spearman(growing.flip(0)) < 0


def test_a_run_is_read_back_at_the_weights_its_accuracy_is_of(tmp_path):
    assert weights_of(tmp_path) == tmp_path  # no early stopping: the last checkpoint
    (tmp_path / "best").mkdir()
    assert weights_of(tmp_path) == tmp_path / "best"
    converged = result("m", 0, 0.5, convergence={"rel_change_last_20pct": -0.002})
    assert loss_change(converged) == -0.002
    assert math.isnan(loss_change(result("m", 0, 0.5, convergence={"rel_change_last_20pct": None})))


# ----- summaries on hand-made runs ------------------------------------------------------------


def result(model: str, seed: int, top1: float, **info) -> RunResult:
    return RunResult(model, model, "g", seed, top1, 1, 0.0, 10, 1, 0.0, "/nowhere", False, info)


def test_selfsup_gains_are_paired_by_seed():
    runs = [
        result("scratch", 0, 0.50, start="scratch", fraction=0.1),
        result("scratch", 1, 0.70, start="scratch", fraction=0.1),
        result("mpp", 0, 0.60, start="mpp", fraction=0.1),
        result("mpp", 1, 0.75, start="mpp", fraction=0.1),
    ]
    summary = summarize_selfsup(runs)
    gain = summary["verdict_inputs"]["gain_over_scratch"]["mpp"]["0.1"]
    assert gain["mean"] == pytest.approx(0.075)  # (0.10 + 0.05) / 2
    assert gain["std"] == pytest.approx(math.sqrt(2 * 0.025**2))
    assert gain["wins"] == 2 and gain["seeds"] == 2
    top1 = summary["verdict_inputs"]["top1"]["scratch@0.1"]
    assert top1["mean"] == pytest.approx(0.6) and top1["std"] == pytest.approx(math.sqrt(0.02))


def test_resolution_rank_correlation_per_seed_and_of_means():
    runs, probes = [], []
    # Fine-tuned (low res): a < b < c at seed 0, a < c < b at seed 1; probes: a < b < c.
    for seed, accs in ((0, (0.5, 0.6, 0.7)), (1, (0.5, 0.8, 0.7))):
        for m, acc in zip("abc", accs):
            runs.append(result(m, seed, acc, arm="low", resolution=8))
            runs.append(result(m, seed, acc + 0.1, arm="high", resolution=16))
            probe = {"5": {"mean": float("abc".index(m))}}
            probes.append({"model": m, "seed": seed, "shots": probe})
    v = summarize_resolution(runs, probes)["verdict_inputs"]
    rank = v["spearman_probe_vs_finetune"]["5"]
    assert rank["per_seed"] == pytest.approx([1.0, 0.5])
    # Means: a 0.5, b 0.7, c 0.7 (a tie): ranks 1, 2.5, 2.5 against 1, 2, 3.
    assert rank["of_means"] == pytest.approx(1.5 / math.sqrt(3))
    assert v["seed_pairs_where_high_wins"] == 6 and v["models_where_high_wins_on_mean"] == 3
    assert (v["low_res"], v["high_res"]) == (8, 16)


def test_resolution_a_gain_of_float_noise_is_a_tie_not_a_win():
    """Measured (w32-d2, 359 test images): 343, 341, 339 right at 28 px, 340, 340, 343 at 56 px. The
    paired differences sum to 3.7e-17, which was counted as 'high resolution wins'."""
    low = (0.9554317548746518, 0.9498607242339833, 0.9442896935933147)
    high = (0.947075208913649, 0.947075208913649, 0.9554317548746518)
    runs = [result("m", s, a, arm="low", resolution=28) for s, a in enumerate(low)]
    runs += [result("m", s, a, arm="high", resolution=56) for s, a in enumerate(high)]
    probes = [{"model": "m", "seed": s, "shots": {"5": {"mean": 0.5}}} for s in range(3)]
    v = summarize_resolution(runs, probes)["verdict_inputs"]
    assert 0 < v["high_minus_low"]["m"]["mean"] < 1e-15  # the noise is there ...
    assert v["models_where_high_wins_on_mean"] == 0  # ... and no longer a win
    assert v["models_where_high_ties_on_mean"] == 1
    assert v["seed_pairs_where_high_wins"] == 1  # seed 2 only


# ----- the studies end to end -----------------------------------------------------------------


def run_cli(args: list[str], capsys) -> dict:
    assert main(args) == 0, capsys.readouterr().err
    out = Path(args[args.index("--out-dir") + 1])
    text = (out / "results.json").read_text()
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in results.json"))


def mtimes(root: Path, name: str) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob(name)}


@pytest.mark.slow
def test_study_inside_smoke_end_to_end_and_reused(tmp_path, capsys):
    out = tmp_path / "inside"
    args = ["study", "inside", "--smoke", "--seeds", "2", "--threads", "1", "--out-dir", str(out)]
    body = run_cli(args, capsys)
    assert body["trained_runs"] == 2 and len(body["measured"]) == 2
    v = body["verdict_inputs"]
    assert v["seeds"] == 2
    assert v["uniform_distance_px"] == pytest.approx(8.0, abs=0.1)  # 4 x 4 patches at 16 px
    assert v["global_threshold_px"] == pytest.approx(v["uniform_distance_px"] / 2)
    assert 0.0 <= v["lowest_layer_global_share"]["mean"] <= 1.0
    assert len(body["layers"]) == 2  # the smoke model's depth
    md = (out / "inside.md").read_text()
    assert "Reading: Lowest layer:" in md and "same row/column minus other" in md
    for name in ("attention_distance.png", "position_similarity.png", "filters.png"):
        assert (out / name).stat().st_size > 5_000
    before = {**mtimes(out, "report.json"), **mtimes(out, "inside.json")}
    assert len(before) == 4
    body = run_cli(args, capsys)  # a second call reads every run and measurement back
    assert body["trained_runs"] == 0
    assert {**mtimes(out, "report.json"), **mtimes(out, "inside.json")} == before
    assert "(done before)" in capsys.readouterr().err


@pytest.mark.slow
def test_study_selfsup_smoke_end_to_end_and_reused(tmp_path, capsys):
    out = tmp_path / "selfsup"
    args = ["study", "selfsup", "--smoke", "--seeds", "1", "--fractions", "0.1,1"]
    args += ["--starts", "mpp", "--threads", "1", "--out-dir", str(out)]
    body = run_cli(args, capsys)
    assert body["trained_runs"] == 5  # one MPP pre-training, 2 starts x 2 fractions
    assert {(r["start"], r["fraction"]) for r in body["runs"]} == {
        (s, f) for s in ("scratch", "mpp") for f in (0.1, 1.0)
    }
    pre = out / "runs" / "mpp" / "pretrain" / "seed0"
    ft = json.loads(
        (out / "runs" / "mpp" / "labels0.1" / "seed0" / "train_config.json").read_text()
    )
    assert ft["init_from"] == str(pre) and ft["train_size"] == 0.1
    assert json.loads((pre / "report.json").read_text())["objective"] == "mpp"
    for name in ("report.html", "curves.png", "preview.png"):  # no per-run plots in a study
        assert not list(out.rglob(name)), name
    assert "mpp" in body["verdict_inputs"]["gain_over_scratch"]
    assert "Reading: Gain over scratch" in (out / "selfsup.md").read_text()
    assert (out / "selfsup.png").stat().st_size > 5_000
    assert (out / "finetune_loss.png").stat().st_size > 5_000
    before = mtimes(out, "report.json")
    assert run_cli(args, capsys)["trained_runs"] == 0
    assert mtimes(out, "report.json") == before


@pytest.mark.parametrize(
    "argv, message",
    [
        (["selfsup", "--train-size", "0.5"], "sets --train-size per run"),
        (["resolution", "--image-size", "32"], "sets --image-size per run"),
        (["selfsup", "--starts", "mpp,byol"], "--starts: expected some of supervised, mpp"),
        (["inside", "--models", "Ti/4,Ti/4[depth=2]"], "trains one model, got 2"),
        (["inside", "--models", "bit_r26x1[label=bit]"], "bit is not a Vision Transformer"),
        (["selfsup", "--fractions", "0.1,1.5"], "expected fractions in (0, 1]"),
    ],
)
def test_study_options_a_study_sets_itself_are_refused(argv, message, tmp_path, capsys):
    args = ["study", argv[0], "--smoke", *argv[1:], "--out-dir", str(tmp_path / "out")]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_study_selfsup_refuses_a_fraction_smaller_than_a_batch(tmp_path, capsys):
    args = ["study", "selfsup", "--smoke", "--fractions", "0.01", "--out-dir", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "fewer than one batch of 32" in err and not list(tmp_path.rglob("report.json"))


@pytest.mark.slow
def test_study_resolution_smoke_end_to_end_and_reused(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["study", "resolution", "--smoke", "--seeds", "1", "--shots", "2,5"]
    args += ["--threads", "1", "--out-dir", str(out)]
    body = run_cli(args, capsys)
    assert body["trained_runs"] == 6  # 2 models: pre-training + 2 resolutions each
    v = body["verdict_inputs"]
    assert (v["low_res"], v["high_res"]) == (8, 16)  # digits at its own size, then twice
    assert v["models"] == ["small", "large"] and v["headline_shots"] == 5
    assert set(v["spearman_probe_vs_finetune"]) == {"2", "5"}
    high = json.loads((out / "runs" / "large" / "res16" / "seed0" / "report.json").read_text())
    assert high["model_config"]["image_size"] == [16, 16]  # a 4 x 4 grid from the 2 x 2 one
    assert "Reading: Fine-tuning at 16 px" in (out / "resolution.md").read_text()
    assert (out / "resolution.png").stat().st_size > 5_000
    before = {**mtimes(out, "report.json"), **mtimes(out, "fewshot.json")}
    assert run_cli(args, capsys)["trained_runs"] == 0
    assert {**mtimes(out, "report.json"), **mtimes(out, "fewshot.json")} == before
