"""timm's keywords on vitkit.load and vitkit.create_model (vitkit.registry.timm_keywords), and
timm's names in create_model: a timm user's script, only the import changed, equals timm at 384
px and 224 x 320 (eval and train mode); what vitkit has no meaning for is refused in one line."""

from __future__ import annotations

import warnings

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file

import vitkit
from vitkit.errors import VitkitError

NAME = "vit_tiny_patch16_224"


@pytest.fixture
def weights(tmp_path):
    """A timm ViT-Ti/16 (2 blocks) at 224 px with a 10-class head, as a bare state dict."""
    timm = import_reference("timm")
    src = perturbed(timm.create_model(NAME, depth=2, num_classes=10))
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    return path


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the assumed preprocessing of a bare file)
        return fn(*args, **kw)


def _close(a, b):
    a, b = a.detach(), b.detach()
    assert a.shape == b.shape
    assert (a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("size", [384, (224, 320)])
def test_a_timm_script_equals_timm(weights, size):
    timm = import_reference("timm")
    kw = dict(
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(weights), num_classes=10),
        img_size=size,
        depth=2,
        drop_path_rate=0.1,
        drop_rate=0.1,
        attn_drop_rate=0.0,
        dynamic_img_size=True,
        num_classes=10,
    )
    ref = timm.create_model(NAME, **kw)
    ours = _quiet(vitkit.create_model, NAME, **kw)
    loaded = _quiet(vitkit.load, weights, img_size=size, drop_path_rate=0.1, drop_rate=0.1,
                    dynamic_img_size=True)  # fmt: skip
    x = torch.randn(2, 3, *((size, size) if isinstance(size, int) else size))
    with torch.no_grad():
        want = ref.eval()(x)
        _close(ours.eval()(x), want)
        _close(loaded(x), want)
    for model in (ref, ours):  # train mode: the same stochastic depth and head dropout draws
        model.train()
    torch.manual_seed(1)
    want = ref(x)
    torch.manual_seed(1)
    _close(ours(x), want)


def test_pooling_and_class_token_build_timms_layout():
    timm = import_reference("timm")
    kw = dict(global_pool="avg", class_token=False, num_classes=7, depth=2)
    ref, ours = timm.create_model(NAME, **kw), vitkit.create_model(NAME, **kw)
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == shapes
    assert ours.global_pool == ref.global_pool == "avg"


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "vit_tiny_patch16_384",
                                  "vit_base_patch32_224.augreg_in21k_ft_in1k"])  # fmt: skip
def test_timm_names_in_create_model(name):
    timm = import_reference("timm")
    count = sum(p.numel() for p in timm.create_model(name.split(".")[0]).parameters())
    assert sum(p.numel() for p in vitkit.create_model(name).parameters()) == count


def test_the_new_head_is_zero_unless_timms_is_asked(weights):
    zero = _quiet(vitkit.load, weights, num_classes=4)
    drawn = _quiet(vitkit.load, weights, num_classes=4, head_init="timm")
    assert not zero.head.weight.any()
    w = drawn.head.weight.detach()
    assert 0.015 < float(w.std()) < 0.025 and abs(float(w.mean())) < 0.005
    assert not drawn.head.bias.any()
    with pytest.raises(VitkitError, match="head_init must be 'zero'"):
        _quiet(vitkit.load, weights, num_classes=4, head_init="random")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(global_pool="mean"), "global_pool 'mean': vitkit pools as"),
        (dict(pos_drop_rate=0.1, proj_drop_rate=0.2), "vitkit's dropout is one rate"),
        (dict(dynamic_img_pad=True), "never pads"),
        (dict(pretrained_cfg_overlay=dict(hf_hub_id="x/y")), "pretrained_cfg_overlay hf_hub_id"),
        (dict(img_size=224, image_size=224), "img_size and image_size are one setting"),
    ],
)
def test_what_vitkit_has_no_meaning_for_is_refused(weights, kw, message):
    with pytest.raises(VitkitError, match=message):
        vitkit.create_model(NAME, **kw)
    with pytest.raises(VitkitError, match=message):
        _quiet(vitkit.load, weights, **kw)


def test_weights_keywords_belong_to_create_model(weights):
    with pytest.raises(VitkitError, match="vitkit never downloads"):
        vitkit.create_model(NAME, pretrained=True)
    with pytest.raises(VitkitError, match="load's path is the weights"):
        _quiet(vitkit.load, weights, checkpoint_path=str(weights))
    ours = _quiet(vitkit.create_model, NAME, checkpoint_path=str(weights))
    assert ours.cfg.num_classes == 10 and ours.cfg.depth == 2
