"""Attention rollout, attention distance, position-embedding similarity, embedding-filter PCA,
their figures, the HTML report, and the `explain` / `analyze` commands end to end."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.analysis import (
    AnalysisData,
    Figure,
    Section,
    Table,
    analyze_model,
    attention_distance,
    attention_rollout,
    attention_weights,
    box_mass,
    embedding_filter_pca,
    explain,
    mean_attention_distance,
    patch_distances,
    patch_map,
    plot_attention_distance,
    plot_embedding_filters,
    plot_layer_maps,
    plot_position_similarity,
    plot_rollout,
    plot_rollout_examples,
    position_embedding_similarity,
    render_html,
    rollout_by_layer,
    sample_dataset,
    similarity_by_distance,
    write_html,
)
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.data import make_shapes
from vitkit.errors import VitkitError
from vitkit.models.vit import create_model
from vitkit.registry.model_config import PreprocessConfig


def tiny(pool: str = "token", image_size=(16, 24), patch=4, in_chans=3, **kw):
    torch.manual_seed(0)
    cfg = dict(width=32, depth=3, num_heads=2, mlp_dim=64, num_classes=5, pool=pool)
    cfg.update(kw)
    return create_model(f"Ti/{patch}", image_size=image_size, in_chans=in_chans, **cfg).eval()


def random_attention(b=2, heads=3, t=7, layers=4, seed=0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, heads, t, t, generator=g).mul(3).softmax(-1) for _ in range(layers)]


def assert_png(path: Path, min_side: int = 100) -> None:
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert min(im.size) >= min_side
        pixels = np.asarray(im.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 10  # something is drawn


# ---------------------------------------------------------------------------------------------
# rollout


def test_rollout_rows_are_distributions() -> None:
    for rolled in rollout_by_layer(random_attention()):
        assert (rolled >= 0).all()
        torch.testing.assert_close(rolled.sum(-1), torch.ones(2, 7))


def test_identity_attention_gives_identity_rollout() -> None:
    eye = torch.eye(9).expand(2, 4, 9, 9)
    for residual in (True, False):
        for fusion in ("mean", "max", "min"):
            r = attention_rollout([eye] * 5, residual=residual, head_fusion=fusion)
            torch.testing.assert_close(r, torch.eye(9).expand(2, 9, 9))


def test_rollout_is_the_product_from_first_to_last_layer() -> None:
    attn = random_attention(b=1, heads=2, t=5, layers=3)
    a_hat = []
    for a in attn:
        m = a[0].double().mean(0).numpy() + np.eye(5)
        a_hat.append(m / m.sum(-1, keepdims=True))
    expected = a_hat[2] @ a_hat[1] @ a_hat[0]  # the last layer on the left
    got = attention_rollout(attn)[0].double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    wrong_order = a_hat[0] @ a_hat[1] @ a_hat[2]
    assert not np.allclose(got, wrong_order, atol=1e-3)  # the check can tell the order apart


def test_rollout_of_uniform_attention_has_closed_form() -> None:
    # Zero query/key weights make every attention row uniform: Â = (U + I) / 2, and since U is
    # idempotent, Â^L = I / 2^L + (1 - 1 / 2^L) U.
    model = tiny(depth=3)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * 32].zero_()
            block.attn.qkv.bias.zero_()
    attentions, _ = attention_weights(model, torch.randn(2, 3, 16, 24))
    t = model.cfg.seq_len
    expected = torch.eye(t) / 8 + (1 - 1 / 8) * torch.full((t, t), 1 / t)
    torch.testing.assert_close(attention_rollout(attentions)[0], expected, atol=1e-5, rtol=0)


def test_patch_map_reads_the_class_token_row_or_the_mean_row_on_a_non_square_grid() -> None:
    cfg = tiny().cfg  # 4 x 6 grid, class token
    t = cfg.seq_len
    m = torch.zeros(1, t, t)
    m[0, 0, 0] = 0.5  # the class token's self-attention is not a patch: dropped, renormalised
    m[0, 0, 1 + 9] = 0.5  # patch 9 = row 1, column 3 (row-major)
    expected = torch.zeros(1, 4, 6)
    expected[0, 1, 3] = 1.0
    torch.testing.assert_close(patch_map(m, cfg), expected)

    gap = tiny(pool="gap").cfg
    n = gap.seq_len
    m = torch.zeros(1, n, n)
    m[0, :, 5] = 1.0  # every query attends to patch 5 ...
    m[0, 0, 5], m[0, 0, 7] = 0.0, 1.0  # ... except query 0, which attends to patch 7
    got = patch_map(m, gap)
    assert got[0, 0, 5] == pytest.approx((n - 1) / n) and got[0, 1, 1] == pytest.approx(1 / n)
    with pytest.raises(VitkitError, match="tokens"):
        patch_map(torch.zeros(1, 5, 5), cfg)


def test_explain_on_cls_and_gap_models_with_non_square_grids() -> None:
    for pool in ("token", "gap"):
        model = tiny(pool=pool)
        x = torch.randn(3, 3, 16, 24)
        found = explain(model, x, batch_size=2)
        assert found.layer_maps.shape == (3, 3, 2, 4, 6)
        assert found.rollout_maps.shape == (3, 3, 4, 6)
        torch.testing.assert_close(found.rollout.sum((-2, -1)), torch.ones(3))
        torch.testing.assert_close(found.layer_maps.sum((-2, -1)), torch.ones(3, 3, 2))
        attentions, logits = attention_weights(model, x)
        torch.testing.assert_close(
            found.rollout, patch_map(attention_rollout(attentions), model.cfg)
        )
        torch.testing.assert_close(found.logits, model(x), atol=1e-5, rtol=1e-5)


def test_attention_weights_leave_a_training_model_in_training_mode() -> None:
    model = tiny(dropout=0.5, attn_dropout=0.5).train()
    x = torch.randn(2, 3, 16, 24)
    a, _ = attention_weights(model, x)
    b, _ = attention_weights(model, x)
    assert model.training
    torch.testing.assert_close(a[0], b[0])  # no dropout while analysing


# ---------------------------------------------------------------------------------------------
# object boxes


def test_box_mass_is_exact_rectangle_overlap() -> None:
    cfg = tiny(image_size=(16, 16)).cfg  # 4 x 4 patches of 4 px
    uniform = torch.full((1, 4, 4), 1 / 16)
    box = torch.tensor([[2.0, 0.0, 10.0, 6.0]])  # 8 x 6 px of 16 x 16
    inside, share = box_mass(uniform, box, cfg)
    assert share.item() == pytest.approx(48 / 256)
    assert inside.item() == pytest.approx(48 / 256)  # a map blind to the object: ratio 1
    peaked = torch.zeros(1, 4, 4)
    peaked[0, 0, 1] = 1.0  # patch x 4..8, y 0..4: fully inside the box
    assert box_mass(peaked, box, cfg)[0].item() == pytest.approx(1.0)
    peaked = torch.zeros(1, 4, 4)
    peaked[0, 0, 0] = 1.0  # patch x 0..4 overlaps the box on x 2..4: half of it
    assert box_mass(peaked, box, cfg)[0].item() == pytest.approx(0.5)
    outside = torch.zeros(1, 4, 4)
    outside[0, 3, 3] = 1.0
    assert box_mass(outside, box, cfg)[0].item() == 0.0


# ---------------------------------------------------------------------------------------------
# attention distance


def test_patch_distances_use_pixels_of_non_square_patches() -> None:
    cfg = create_model(
        "Ti/4", image_size=(8, 16), patch_size=(2, 4), width=32, depth=1, num_heads=2
    ).cfg
    d = patch_distances(cfg)  # grid 4 x 4
    assert d.shape == (16, 16)
    assert d[0, 1] == pytest.approx(4.0)  # one column right: patch width
    assert d[0, 4] == pytest.approx(2.0)  # one row down: patch height
    assert d[0, 5] == pytest.approx(np.hypot(2, 4))


def test_attention_distance_of_known_patterns() -> None:
    cfg = tiny(image_size=(16, 16)).cfg  # 16 patches + class token, patch 4
    t, n = cfg.seq_len, cfg.num_patches
    local = torch.eye(t).expand(1, 2, t, t)
    assert attention_distance([local], cfg).abs().max() == 0
    far = torch.zeros(1, 2, t, t)
    far[..., 1:, 16] = 1.0  # every patch looks at the bottom-right patch
    dist = patch_distances(cfg)
    torch.testing.assert_close(
        attention_distance([far], cfg)[0, 0], dist[:, 15].mean().float().expand(2)
    )
    # Mass on the class token is ignored: the remaining weights are renormalised.
    half = far.clone()
    half[..., 1:, 0] = 1.0
    torch.testing.assert_close(attention_distance([half], cfg), attention_distance([far], cfg))
    uniform = torch.full((1, 1, t, t), 1 / t)
    expected = dist.mean().float()
    torch.testing.assert_close(attention_distance([uniform], cfg)[0, 0, 0], expected)
    assert n == 16


def test_mean_attention_distance_does_not_depend_on_batching() -> None:
    model = tiny(pool="gap")
    x = torch.randn(5, 3, 16, 24)
    a = mean_attention_distance(model, x, batch_size=2)
    b = mean_attention_distance(model, x, batch_size=64)
    assert a.shape == (3, 2)
    torch.testing.assert_close(a, b)
    assert (a > 0).all() and (a < np.hypot(16, 24)).all()


# ---------------------------------------------------------------------------------------------
# position embeddings and filters


def test_position_similarity_leaves_out_the_class_token_and_finds_smooth_layouts() -> None:
    model = tiny(image_size=(20, 28))  # 5 x 7 grid
    gh, gw = model.cfg.grid_size
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    freqs = torch.arange(1, 9) * 0.35
    smooth = torch.cat(
        [
            torch.cos(ys[..., None] * freqs),
            torch.sin(ys[..., None] * freqs),
            torch.cos(xs[..., None] * freqs),
            torch.sin(xs[..., None] * freqs),
        ],
        dim=-1,
    ).reshape(gh * gw, 32)
    with torch.no_grad():
        model.pos_embed[0, 0] = 100.0  # the class token: must not leak into the figure
        model.pos_embed[0, 1:] = smooth
    sim = position_embedding_similarity(model)
    assert sim.shape == (gh, gw, gh, gw)
    torch.testing.assert_close(sim.reshape(gh * gw, -1).diagonal(), torch.ones(gh * gw))
    stats = similarity_by_distance(sim)
    assert stats.adjacent > stats.same_row_or_column > stats.far
    assert stats.far_distance == 3.5
    # The stats are the means over the right pairs: check one by brute force.
    s = sim.reshape(gh * gw, gh * gw)
    adj = [
        s[i, j]
        for i in range(gh * gw)
        for j in range(gh * gw)
        if abs(i // gw - j // gw) + abs(i % gw - j % gw) == 1
    ]
    assert stats.adjacent == pytest.approx(float(torch.stack(adj).mean()), abs=1e-6)
    with torch.no_grad():
        model.pos_embed[0, 1:] = torch.eye(gh * gw, 32)  # orthogonal: no layout at all
    flat = similarity_by_distance(position_embedding_similarity(model))
    assert flat.adjacent == pytest.approx(0.0, abs=1e-6) and flat.far == pytest.approx(0, abs=1e-6)


def test_embedding_filter_pca_matches_scikit_learn() -> None:
    from sklearn.decomposition import PCA

    model = tiny(width=48)
    weight = model.patch_embed.proj.weight.detach()
    pca = embedding_filter_pca(model, k=6)
    ref = PCA(n_components=6).fit(weight.reshape(48, -1).double().numpy())
    got = pca.components.reshape(6, -1).double().numpy()
    for g, r in zip(got, ref.components_):
        assert abs(abs(float(g @ r)) - 1) < 1e-5  # the same direction up to sign
        assert g[np.abs(g).argmax()] > 0  # sign fixed: largest entry positive
    np.testing.assert_allclose(pca.explained_variance_ratio, ref.explained_variance_ratio_, 1e-4)


def test_embedding_filter_pca_stops_at_the_filters_rank() -> None:
    model = tiny(width=32, in_chans=1)
    u, v = torch.randn(16), torch.randn(16)
    coeffs = torch.randn(32, 2)
    with torch.no_grad():
        model.patch_embed.proj.weight.copy_((coeffs @ torch.stack([u, v])).reshape(32, 1, 4, 4))
    pca = embedding_filter_pca(model, k=28)
    assert pca.components.shape == (2, 1, 4, 4)
    assert float(pca.explained_variance_ratio.sum()) == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():
        model.patch_embed.proj.weight.fill_(0.3)
    with pytest.raises(VitkitError, match="all the same"):
        embedding_filter_pca(model)


# ---------------------------------------------------------------------------------------------
# figures and report


def test_every_figure_is_a_drawn_png(tmp_path: Path) -> None:
    for in_chans in (3, 1):
        model = tiny(in_chans=in_chans)
        x = torch.randn(2, in_chans, 16, 24)
        found = explain(model, x)
        pixels = (x * 0.5 + 0.5).clamp(0, 1)
        d = tmp_path / str(in_chans)
        paths = [
            plot_embedding_filters(embedding_filter_pca(model), d / "f.png"),
            plot_position_similarity(position_embedding_similarity(model), d / "p.png"),
            plot_attention_distance(mean_attention_distance(model, x), d / "a.png", uniform=9.0),
            plot_rollout(pixels[0], found.rollout[0], d / "r.png", title="t"),
            plot_layer_maps(
                found.layer_maps[0], found.rollout_maps[0], d / "l.png", image=pixels[0]
            ),
            plot_rollout_examples(
                pixels,
                found.rollout,
                d / "e.png",
                captions=["a", "b"],
                boxes=torch.tensor([[1.0, 1, 8, 8], [0, 0, 24, 16]]),
            ),
        ]
        for p in paths:
            assert_png(p)
        assert sorted(q.name for q in d.iterdir()) == sorted(p.name for p in paths)  # no temps


def test_html_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    model = tiny()
    png = plot_position_similarity(position_embedding_similarity(model), tmp_path / "p.png")
    sections = [
        Section("A <b>section</b>", ["x < y & z", Table(["k", "v"], [["a", 1.5], ["b", 12345]])]),
        Section("Figures", [Figure(png, "a caption")]),
    ]
    page = render_html("Title & more", sections)
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "x &lt; y &amp; z" in page and "A &lt;b&gt;section&lt;/b&gt;" in page
    assert "12,345" in page and "1.5" in page
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert len(srcs) == 1 and srcs[0].startswith("data:image/png;base64,")
    assert base64.b64decode(srcs[0].split(",", 1)[1]) == png.read_bytes()
    out = write_html(tmp_path / "r" / "report.html", "T", sections)
    assert out.read_text().startswith("<!DOCTYPE html>")
    (tmp_path / "fake.png").write_text("not a png")
    with pytest.raises(VitkitError, match="fake.png: not a PNG"):
        render_html("T", [Section("s", [Figure(tmp_path / "fake.png")])])


def test_analyze_model_with_and_without_images(tmp_path: Path) -> None:
    model = tiny(image_size=(32, 32))
    shapes = make_shapes("test", n=24)
    data = sample_dataset(shapes, 12, PreprocessConfig.for_model(model.cfg))
    result = analyze_model(model, tmp_path / "a", data, num_examples=4)
    assert set(result.files) == {
        "filters",
        "position_similarity",
        "attention_distance",
        "rollout_examples",
        "numbers",
    }
    for key, path in result.files.items():
        if key != "numbers":
            assert_png(path)
    numbers = json.loads(result.files["numbers"].read_text())
    assert numbers["attention_distance"]["images"] == 12
    assert len(numbers["attention_distance"]["per_layer_mean"]) == 3
    box = numbers["rollout_in_box"]
    assert 0 < box["mass_inside_box"] < 1 and 0 < box["box_area_share"] < 1
    assert box["ratio"] == pytest.approx(box["mass_inside_box"] / box["box_area_share"])
    titles = [s.title for s in result.sections]
    assert "Mean attention distance" in titles and "Attention rollout" in titles

    bare = analyze_model(tiny(pool="gap"), tmp_path / "b")
    assert set(bare.files) == {"filters", "position_similarity", "numbers"}
    assert "attention_distance" not in json.loads(bare.files["numbers"].read_text())


def test_sample_dataset_spreads_over_the_data_and_rescales_boxes() -> None:
    shapes = make_shapes("test", n=60)
    pre = PreprocessConfig(image_size=(48, 64), channels=3)
    data = sample_dataset(shapes, 6, pre)
    assert data.images.shape == (6, 3, 48, 64)
    assert data.labels.tolist() == shapes.labels[[0, 12, 24, 35, 47, 59]].tolist()
    expected = shapes.boxes[[0, 12, 24, 35, 47, 59]] * torch.tensor([2.0, 1.5, 2.0, 1.5])
    torch.testing.assert_close(data.boxes, expected)
    assert float(data.pixels.min()) >= 0 and float(data.pixels.max()) <= 1
    with pytest.raises(VitkitError, match="at least 1"):
        sample_dataset(shapes, 0, pre)


def test_rollout_mass_test_can_tell_an_object_from_noise(tmp_path: Path) -> None:
    # A map that is the object's box itself must score box-share^-1; a uniform one exactly 1.
    model = tiny(image_size=(32, 32))
    cfg = model.cfg
    shapes = make_shapes("test", n=16)
    maps = torch.zeros(16, *cfg.grid_size)
    for i, (x0, y0, x1, y1) in enumerate(shapes.boxes.tolist()):
        maps[i, int(y0 // 4) : int(-(-y1 // 4)), int(x0 // 4) : int(-(-x1 // 4))] = 1
    maps /= maps.sum((-2, -1), keepdim=True)
    inside, share = box_mass(maps, shapes.boxes, cfg)
    assert (inside / share).mean() > 2  # the measurement rewards looking at the object
    uniform = torch.full_like(maps, 1 / cfg.num_patches)
    inside, share = box_mass(uniform, shapes.boxes, cfg)
    torch.testing.assert_close(inside, share)


# ---------------------------------------------------------------------------------------------
# the commands, end to end


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seconds-long training run on shapes (boxes), which also writes the run report."""
    out = tmp_path_factory.mktemp("analysis") / "shapes"
    args = ["train", "--data", "shapes", "--smoke", "--precision", "fp32", "--max-steps", "8"]
    assert main([*args, "--out-dir", str(out)]) == 0
    return out


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_train_writes_a_self_contained_html_report(shapes_run: Path) -> None:
    page = (shapes_run / "report.html").read_text()
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    # curves, confusion matrix, filters, position similarity, attention distance, rollout
    assert len(images) == 6
    for b64 in images:
        assert base64.b64decode(b64).startswith(b"\x89PNG")
    for title in (
        "Training",
        "Embedding filters",
        "Position embedding similarity",
        "Mean attention distance",
        "Attention rollout",
    ):
        assert f">{title}</h2>" in page
    numbers = json.loads((shapes_run / "analysis" / "analysis.json").read_text())
    assert numbers["attention_distance"]["images"] == 128
    assert numbers["rollout_in_box"]["images"] == 128


def test_analyze_command(shapes_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "an"
    code, stdout, _ = run_cli(
        ["analyze", "--from", str(shapes_run), "--num-images", "20", "--out", str(out)], capsys
    )
    assert code == 0
    assert "rollout mass inside the object box" in stdout and "ratio" in stdout
    assert "mean attention distance (px) by layer" in stdout
    for name in (
        "embedding_filters.png",
        "position_similarity.png",
        "attention_distance.png",
        "rollout_examples.png",
    ):
        assert_png(out / name)
    numbers = json.loads((out / "analysis.json").read_text())
    assert numbers["attention_distance"]["images"] == 20
    page = (out / "report.html").read_text()
    assert ">Training</h2>" in page  # the run's curves travel with the checkpoint's report


def test_analyze_without_data_and_with_other_data(tmp_path: Path, capsys) -> None:
    model = tiny(image_size=(16, 16))
    ckpt = save_checkpoint(tmp_path / "bare", model)  # names no dataset (like a converted one)
    code, stdout, err = run_cli(["analyze", "--from", str(ckpt)], capsys)
    assert code == 0 and "no dataset" in err
    assert (tmp_path / "bare_analysis" / "report.html").is_file()
    assert not (tmp_path / "bare_analysis" / "attention_distance.png").exists()
    assert "position embeddings, mean cosine" in stdout
    # Other classes than the head's: attention is still analysed, accuracy is not claimed.
    out = tmp_path / "other"
    args = ["analyze", "--from", str(ckpt), "--data", "shapes", "--num-images", "8"]
    code, stdout, err = run_cli([*args, "--out", str(out)], capsys)
    assert code == 0 and "6 classes" in err and "head has 5" in err and "no accuracy" in err
    numbers = json.loads((out / "analysis.json").read_text())
    assert "sample_top1" not in numbers and numbers["rollout_in_box"]["images"] == 8
    code, _, err = run_cli(["analyze", "--from", str(tmp_path / "nope")], capsys)
    assert code == 2 and "nope" in err and "\n" not in err.strip()


def test_explain_command(shapes_run: Path, tmp_path: Path, capsys) -> None:
    shapes = make_shapes("test", n=2)
    paths = []
    for i in range(2):
        p = tmp_path / ("a" if i == 0 else "b") / "img.png"  # the same stem twice
        p.parent.mkdir()
        Image.fromarray(shapes.images[i].permute(1, 2, 0).numpy()).save(p)
        paths.append(str(p))
    out = tmp_path / "ex"
    code, stdout, _ = run_cli(
        ["explain", *paths, "--from", str(shapes_run), "--out", str(out), "--top-k", "2"], capsys
    )
    assert code == 0
    assert len(re.findall(r"%", stdout)) == 4  # two predictions per image
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "img_1_layers.png",
        "img_1_rollout.png",
        "img_2_layers.png",
        "img_2_rollout.png",
    ]
    for name in names:
        assert_png(out / name)
    code, stdout, _ = run_cli(
        ["explain", paths[0], "--from", str(shapes_run), "--out", str(out), "--json"], capsys
    )
    record = json.loads(stdout)
    assert len(record["top_k"]) == 5 and Path(record["rollout_png"]).is_file()
    assert abs(sum(p["prob"] for p in record["top_k"]) - 1) < 0.2  # 5 of 6 classes
    code, _, err = run_cli(["explain", str(tmp_path / "missing.png"), "--from", "x"], capsys)
    assert code == 2 and "missing.png: no such image file" in err


def test_analysis_batches_bound_attention_memory() -> None:
    from vitkit.analysis.attention import ATTENTION_BYTES, safe_batch_size
    from vitkit.registry.model_config import model_config

    big = model_config("L/16", image_size=384)  # 24 layers x 16 heads x 577^2 tokens
    b = safe_batch_size(big, 32)
    assert 1 <= b < 32
    assert b * big.depth * big.num_heads * big.seq_len**2 * 4 <= ATTENTION_BYTES
    assert safe_batch_size(model_config("Ti/4", image_size=28), 32) == 32


def test_help_of_the_analysis_commands(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd, must_mention in [("explain", "--head-fusion"), ("analyze", "--num-images")]:
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert must_mention in out and "default: None" not in out


def test_hybrid_models_measure_in_input_pixels_and_have_no_filter_picture(tmp_path: Path) -> None:
    from vitkit.analysis import token_pixels
    from vitkit.registry.model_config import ViTConfig

    cfg = ViTConfig(
        image_size=(32, 48), patch_size=1, width=32, depth=2, num_heads=2, mlp_dim=64,
        num_classes=3, resnet_layers=(1,), resnet_width_factor=0.25,
    )  # fmt: skip
    model = create_model(cfg).eval()
    assert cfg.grid_size == (8, 12) and token_pixels(cfg) == (4, 4)
    d = patch_distances(cfg)
    assert d[0, 1] == pytest.approx(4.0) and d[0, 12] == pytest.approx(4.0)
    with pytest.raises(VitkitError, match="hybrid"):
        embedding_filter_pca(model)
    x = torch.randn(3, 3, 32, 48)
    data = AnalysisData(
        images=x, pixels=(x * 0.5 + 0.5).clamp(0, 1), boxes=torch.tensor([[0.0, 0, 24, 16]] * 3)
    )
    result = analyze_model(model, tmp_path, data)
    assert "filters" not in result.files and "rollout_examples" in result.files
    box = result.numbers["rollout_in_box"]  # the box is a quarter of the image
    assert box["box_area_share"] == pytest.approx(0.25)


def test_sample_dataset_streams_the_first_images_of_webdataset_shards(tmp_path: Path) -> None:
    from vitkit.data import load_dataset, make_loader
    from vitkit.data.shards_index import write_index
    from vitkit.data.shards_write import write_shards

    digits = load_dataset("digits", "test")
    entries, _ = write_shards(digits, tmp_path, "test", shard_size=100)
    write_index(tmp_path, digits.info, {"test": entries}, digits.info.image_size, "digits")
    shards = load_dataset(tmp_path, "test")
    pre = PreprocessConfig(image_size=(8, 8), channels=1, mean=(0.5,), std=(0.5,))
    data = sample_dataset(shards, 150, pre)
    assert data.images.shape == (150, 1, 8, 8) and data.boxes is None
    first = next(iter(make_loader(shards, 150, shuffle=False, drop_last=False, seed=0)))
    assert data.labels.tolist() == first[1].tolist()


@pytest.mark.parametrize("content", [b"\xff\xfe{bad", b"{bad", b"[1, 2]"])
def test_a_run_report_that_is_not_json_text_is_one_line(tmp_path: Path, content: bytes) -> None:
    """``vitkit analyze`` of a run whose report.json is not UTF-8 JSON (an object) names it."""
    from vitkit.analysis.summary import training_sections

    (tmp_path / "report.json").write_bytes(content)
    with pytest.raises(VitkitError, match="report.json: "):
        training_sections(tmp_path)
