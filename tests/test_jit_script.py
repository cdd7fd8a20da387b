"""torch.jit.script of a model vitkit loads (vitkit.models.scriptable): a timm folder's ViT and
DINOv2 (registers, layer scale) equal to the eager model and to timm's scripted model on the same
weights, a transformers DINOv2 folder equal to its eager model, every covered switch (both CPU
attention kernels, another input size, training mode's stochastic depth), torch.jit.save / load,
the parameters shared with the eager model; the families it does not cover refused in one
line."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from references import import_reference, perturbed

import vitkit
from vitkit.errors import VitkitError

SMALL = dict(width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32, patch_size=8)


def _load(folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the assumed preprocessing: not this test's)
        return vitkit.load(folder, **kw)


def _timm_folder(tmp_path, name, **kw):
    """timm's model (random weights, moved off their initialisation) and its folder."""
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    ref = perturbed(timm.create_model(name, **kw))
    save_for_hf(ref, str(tmp_path / name))
    return ref, tmp_path / name


def _max_diff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def _saved_and_loaded(scripted, tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(scripted, str(path))
    return torch.jit.load(str(path))


@pytest.mark.parametrize(
    ("name", "kw", "size"),
    [
        ("vit_tiny_patch16_224", dict(depth=3, num_classes=10), 224),
        ("vit_tiny_patch16_224", dict(depth=2, num_classes=4, global_pool="avg"), 224),
        ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=56, num_classes=0), 56),
    ],
)
def test_a_timm_folder_scripts_equal_to_eager_and_to_timm(tmp_path, name, kw, size):
    ref, folder = _timm_folder(tmp_path, name, **kw)
    ours = _load(folder)
    scripted = torch.jit.script(ours)
    theirs = torch.jit.script(ref)  # timm scripts its VisionTransformer
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        eager, got, want = ours(x), scripted(x), theirs(x)
        assert _max_diff(got, eager) <= 1e-6
        assert _max_diff(got, want) <= 1e-5 * max(1.0, float(want.abs().max()))
        again = _saved_and_loaded(scripted, tmp_path)
        assert _max_diff(again(x), got) == 0
        features = scripted.forward_features(x)  # timm's methods, scripted as timm's are
        assert _max_diff(features, theirs.forward_features(x)) <= 1e-5 * float(features.abs().max())
        pre = scripted.forward_head(features, pre_logits=True)
        assert _max_diff(pre, ours.forward_head(ours.forward_features(x), pre_logits=True)) <= 1e-6


def test_a_transformers_dinov2_folder_scripts_as_model_x(tmp_path):
    transformers = import_reference("transformers")
    torch.manual_seed(0)
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=56, patch_size=14, num_register_tokens=2,
    )  # fmt: skip
    perturbed(transformers.Dinov2WithRegistersModel(config)).save_pretrained(tmp_path / "dino")
    ours = _load(tmp_path / "dino")
    scripted = torch.jit.script(ours)
    again = _saved_and_loaded(scripted, tmp_path)
    for side in (56, 98):  # its own size and another (E_pos resampled by Dinov2's kernel)
        x = torch.randn(2, 3, side, side)
        with torch.no_grad():
            eager = ours(x)  # model(x): vitkit's answer (the pooled features), as scripted
            assert _max_diff(scripted(x), eager) <= 1e-6
            assert _max_diff(again(x), eager) <= 1e-6
            tokens = ours(pixel_values=x).last_hidden_state  # transformers' call, eager
            assert _max_diff(scripted.forward_features(x), tokens) <= 1e-6


SWITCHES = [
    dict(gelu="tanh"),  # the paper's
    dict(pool="gap", fc_norm=True, gelu="none"),
    dict(num_reg_tokens=2, layer_scale_init=1e-5, pos_embed_prefix=False),
    dict(dist_token=True, pos_resample="bicubic-antialias"),
    dict(pool="map", class_token=False, pos_resample="zoom"),
    dict(mlp="swiglu", qk_norm=True, norm="rmsnorm", pos_resample="bilinear"),
    dict(gelu="quick", norm_pre=True, patch_bias=False, representation_size=16),
    dict(block="post", k_bias=False),
    dict(kv_heads=(1, 1), pool="avgmax", class_token=False),
    dict(pool="max", final_norm=False),
    dict(num_classes=0),
]


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(s))
def test_every_covered_switch_scripts_to_the_eager_numbers(tmp_path, switches):
    model = perturbed(vitkit.create_model("vit_s16", **{**SMALL, "num_classes": 3, **switches}))
    scripted = torch.jit.script(model)
    for batch, side in ((32, 32), (2, 48)):  # 64 rows of 17 tokens: plain matmuls; 2: fused
        x = torch.randn(batch, 3, side, 24 if side == 48 else side)
        with torch.no_grad():
            assert _max_diff(scripted(x), model(x)) <= 1e-6
        got, want = scripted(x), model(x)  # gradients on: training's kernel choice
        assert _max_diff(got, want) <= 1e-6
    again = _saved_and_loaded(scripted, tmp_path)
    with torch.no_grad():
        assert _max_diff(again(x), model(x)) <= 1e-6


def test_training_mode_draws_as_eager_and_shares_the_parameters():
    model = perturbed(vitkit.create_model("vit_s16", **SMALL, num_classes=3, drop_path=0.5))
    model.train()
    scripted = torch.jit.script(model)
    eager, shared = dict(model.named_parameters()), dict(scripted.named_parameters())
    assert eager.keys() == shared.keys()
    assert all(shared[k] is p for k, p in eager.items())  # one set of weights
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(1)
    want = model(x)
    torch.manual_seed(1)
    got = scripted(x)
    assert _max_diff(got, want) <= 1e-6  # the same stochastic-depth draws
    got.sum().backward()
    assert model.head.weight.grad is not None  # the scripted forward trains the eager weights
    torch.manual_seed(2)
    assert _max_diff(model.eval()(x), torch.jit.script(model)(x)) <= 1e-6


def test_a_model_on_onednn_scripts_and_keeps_its_onednn_layers():
    """What predict and ``vitkit.engines.runner`` run (Linear layers and the MLP's GELU on
    oneDNN) scripts to the same numbers; the eager model keeps its layers and weights."""
    from vitkit.engines.onednn import OneDNNLinear, OneDNNMlp, onednn_linears

    model = perturbed(vitkit.create_model("vit_s16", **SMALL, num_classes=3)).eval()
    if not onednn_linears(model):
        pytest.skip("this PyTorch build has no oneDNN linear kernel")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        scripted = torch.jit.script(model)
        assert _max_diff(scripted(x), want) <= 1e-5
    kinds = [type(m) for m in model.modules()]
    assert OneDNNMlp in kinds and OneDNNLinear in kinds
    assert type(model.blocks[0].mlp.fc1) is OneDNNLinear  # not swapped by the preparation
    shared = dict(scripted.named_parameters())
    assert all(shared[k] is p for k, p in model.named_parameters())


def test_a_pruned_model_scripts_as_pruned():
    model = perturbed(vitkit.create_model("vit_s16", **SMALL, num_classes=3))
    model.prune_intermediate_layers([0], prune_norm=True, prune_head=True)
    scripted = torch.jit.script(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert scripted(x).shape == (2, 17, 32)  # every token, as timm's
        assert _max_diff(scripted(x), model(x)) <= 1e-6


def test_a_size_the_patches_do_not_tile_is_refused_by_the_scripted_model():
    scripted = torch.jit.script(vitkit.create_model("vit_s16", **SMALL, num_classes=3).eval())
    with pytest.raises(Exception, match="input images are 30x32: not positive multiples of 8x8"):
        scripted(torch.randn(1, 3, 30, 32))


@pytest.mark.parametrize(
    ("name", "kw", "family"),
    [
        ("vit_small_patch16_rope_mixed_224", dict(depth=1, image_size=32), "rotary position"),
        ("vit_s16", dict(SMALL, naflex=True, pos_embed_prefix=False, pool="gap"), "NaFlex"),
        ("vit_s16", dict(SMALL, parallel=2), "parallel blocks"),
        ("vit_s16", dict(SMALL, rel_pos="bias", abs_pos_embed=False), "relative position"),
        ("vit_s16", dict(SMALL, features_only=True, out_indices=(1,)), "a features-only model"),
        ("bit_r50x1", dict(layers=(1, 1, 1), image_size=32), "BiT's ResNet"),
    ],
)
def test_an_uncovered_family_is_refused_in_one_line(name, kw, family):
    model = vitkit.create_model(name, num_classes=3, **kw).eval()
    with pytest.raises(VitkitError, match=rf"{family}.*torch.jit.trace.*torch.export") as err:
        torch.jit.script(model)
    assert "\n" not in str(err.value)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():  # the alternative the line names runs it
        traced, eager = torch.jit.trace(model, x)(x), model(x)
    for got, want in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (traced, eager))):
        assert _max_diff(got, want) == 0


def test_a_saved_scripted_model_runs_without_vitkit(tmp_path):
    """What the switching page says: torch.jit.load runs the file with PyTorch alone."""
    model = perturbed(vitkit.create_model("vit_s16", **SMALL, num_classes=3))
    torch.jit.script(model).save(str(tmp_path / "vit.pt"))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.save({"x": x, "y": model(x)}, tmp_path / "io.pt")
    code = (
        "import sys, torch; m = torch.jit.load(sys.argv[1]); io = torch.load(sys.argv[2]); "
        "assert (m(io['x']) - io['y']).abs().max() <= 1e-6; "
        "assert not [n for n in sys.modules if n.startswith('vitkit')], 'vitkit imported'"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # (no vitkit on the path)
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "vit.pt"), str(tmp_path / "io.pt")],
        check=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
