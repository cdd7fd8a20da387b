"""A model runs on images of another size: its position embeddings are interpolated in 2-D on
the fly with the function ``vitkit convert --image-size`` uses, so running there equals
converting first; at its own size the model takes the path it always took."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.analysis import explain, input_config, mean_attention_distance, patch_map
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig

TOL = 1e-4  # running at a size vs converting to it (measured: 0, the same float32 table)


def random_model(name: str = "Ti/4", seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny model with every parameter moved off its init (zero heads would hide mistakes)."""
    base = dict(image_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64)
    torch.manual_seed(seed)
    return perturbed(vitkit.create_model(name, **{**base, "num_classes": 5, **kw}), seed)


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def pixels(size: tuple[int, int], n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed))


ARCHS = {
    "token": dict(),
    "gap, non-square patches": dict(pool="gap", patch_size=(4, 2)),
    "hybrid": dict(name="r_vit_ti16", image_size=32, patch_size=2, resnet_width_factor=0.25),
}


@pytest.mark.parametrize(
    ("arch", "mode", "size"),
    [
        ("token", None, (32, 32)),  # twice the size, the model's default interpolation
        ("token", "bicubic", (32, 32)),
        ("token", "zoom", (24, 32)),  # a non-square grid from a square one
        ("token", "bicubic", (8, 12)),  # smaller
        ("gap, non-square patches", "bilinear", (32, 24)),
        ("hybrid", None, (64, 64)),
    ],
)
def test_another_size_equals_converting_first(tmp_path, arch, mode, size):
    model = random_model(**ARCHS[arch])
    assert model.resample == "bicubic"  # the default, as `vitkit convert --resample`
    if mode is not None:
        model.resample = mode
    save_checkpoint(tmp_path / "ckpt", model)
    converted = vitkit.load(tmp_path / "ckpt", image_size=size, resample=mode or "bicubic")
    assert converted.cfg.image_size == size and converted.cfg.grid_size != model.cfg.grid_size
    x = pixels(size)
    with torch.no_grad():
        got, want = model(x), converted(x)
    assert (got - want).abs().max().item() <= TOL
    # The table really is resampled: the model's own table would not even fit.
    assert model.pos_embed_for(converted.cfg.grid_size).shape == converted.pos_embed.shape


def test_the_models_own_size_takes_the_unchanged_path_bit_for_bit():
    model = random_model()
    assert model.pos_embed_for(model.cfg.grid_size) is model.pos_embed  # the parameter itself
    x = pixels((16, 16))
    with torch.no_grad():  # Eq. 1 written out, as the model computed it before other sizes
        patches = model.patch_embed.proj(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([model.cls_token.expand(2, -1, -1), patches], dim=1) + model.pos_embed
        want = model.forward_head(model.encode(tokens))
        assert torch.equal(model(x), want)


@pytest.mark.parametrize(
    ("arch", "size", "needles"),
    [
        ("token", (18, 16), ("18x16", "height 18", "patch height 4", "16x16")),
        ("gap, non-square patches", (16, 15), ("width 15", "patch width 2")),
        ("token", (16, 0), ("width 0", "positive multiple")),
        ("hybrid", (32, 36), ("width 36", "patch width 2 x the ResNet stride 4", "32x32")),
    ],
)
def test_a_size_the_patches_do_not_tile_is_one_line(arch, size, needles):
    model = random_model(**ARCHS[arch])
    for run in (model, lambda x: explain(model, x)):
        with pytest.raises(VitkitError) as err:
            run(pixels(size, n=1))
        msg = str(err.value)
        assert "\n" not in msg and all(n in msg for n in needles), msg


def test_patch_embeddings_without_their_grid_are_refused():
    model = random_model()
    patches = model.patch_embed(pixels((32, 32)))
    with pytest.raises(VitkitError, match="64 patch embeddings do not fill a 4x4 grid"):
        model.embed_patches(patches)
    assert model.embed_patches(patches, (8, 8)).shape == (2, 65, 32)


def test_the_analysis_follows_the_input_grid(tmp_path):
    model = random_model()
    save_checkpoint(tmp_path / "ckpt", model)
    converted = vitkit.load(tmp_path / "ckpt", image_size=(24, 32))
    x = pixels((24, 32))
    with torch.no_grad():
        out = model.forward_with_attentions(x)
    assert [h.shape[1] for h in out.hidden_states] == [1 + 6 * 8] * 3
    found, want = explain(model, x), explain(converted, x)
    assert found.layer_maps.shape == (2, 2, 2, 6, 8) and found.rollout.shape == (2, 6, 8)
    assert (found.rollout_maps - want.rollout_maps).abs().max() <= 1e-6
    cfg = input_config(model, x)  # the grid, tokens and patch pixels of the input's size
    assert cfg == converted.cfg and patch_map(out.attentions[0], cfg).shape == (2, 2, 6, 8)
    distance = mean_attention_distance(model, x)
    assert (distance - mean_attention_distance(converted, x)).abs().max() <= 1e-4


def test_a_bit_resnet_runs_at_another_size():
    """No position embeddings: the same weights, convolved over a larger image."""
    model = vitkit.create_model("bit_r26x1", image_size=16, layers=(1, 1), width_factor=0.25)
    model = perturbed(model)
    other = vitkit.create_model(model.cfg.replace(image_size=(32, 24))).eval()
    other.load_state_dict(model.state_dict())
    x = pixels((32, 24))
    with torch.no_grad():
        assert torch.equal(model(x), other(x))


def test_predict_and_explain_still_resize_to_the_checkpoints_size(tmp_path, capsys):
    model = random_model()
    pre = PreprocessConfig.for_model(model.cfg)  # 16x16, bilinear, no crop
    save_checkpoint(tmp_path / "ckpt", model, preprocess=pre)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8))
    image.save(tmp_path / "big.png")  # 48 px: the model would run on it at a 12x12 grid
    small = np.array(image.resize((16, 16), Image.Resampling.BILINEAR))
    x = torch.from_numpy(small).permute(2, 0, 1)[None].float() / 127.5 - 1
    raw = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float() / 127.5 - 1
    with torch.no_grad():
        want, at_48 = model(x).softmax(-1)[0], model(raw).softmax(-1)[0]
    assert (want - at_48).abs().max() > 1e-3  # resizing matters, so the test can tell
    ckpt, img = str(tmp_path / "ckpt"), str(tmp_path / "big.png")
    assert main(["predict", img, "--from", ckpt, "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top_k"]
    assert [t["prob"] for t in top] == pytest.approx(
        want.sort(descending=True)[0].tolist(), abs=1e-5
    )
    out_dir = tmp_path / "maps"
    assert main(["explain", img, "--from", ckpt, "--json", "--out", str(out_dir)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [t["index"] for t in record["top_k"]] == [t["index"] for t in top]
    assert [t["prob"] for t in record["top_k"]] == pytest.approx([t["prob"] for t in top])
    assert Path(record["rollout_png"]).is_file() and Path(record["layers_png"]).is_file()


def test_another_size_equals_hugging_face_interpolate_pos_encoding(tmp_path):
    """Hugging Face's ``ViTModel(..., interpolate_pos_encoding=True)``: bicubic, the same."""
    from references import import_reference

    transformers = import_reference("transformers")
    hf_cfg = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
    )
    ref = perturbed(transformers.ViTModel(hf_cfg, add_pooling_layer=False))
    ref.save_pretrained(tmp_path / "hf")
    model, _ = vitkit.load_model(tmp_path / "hf")
    x = pixels((32, 24))
    with torch.no_grad():
        want = ref(x, interpolate_pos_encoding=True).last_hidden_state
        assert (model.forward_features(x) - want).abs().max().item() <= 1e-5  # measured: 0
