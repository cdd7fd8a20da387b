"""A timm user's calls on a model vitkit loads, equal to timm's: prune_intermediate_layers with
prune_head (every token out, as timm's reset_classifier(0, "")), the pretrained_cfg's types and
architecture for a timm folder and a registered name (torch.jit.script: test_jit_script.py)."""

from __future__ import annotations

import warnings

import torch
from references import import_reference, perturbed

import vitkit
import vitkit.checkpoints

NAME = "vit_tiny_patch16_224"


def _folder(tmp_path):
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    ref = perturbed(timm.create_model(NAME, depth=3, num_classes=10))
    save_for_hf(ref, str(tmp_path / "timm"))
    return ref, tmp_path / "timm"


def test_prune_head_returns_every_token_as_timm(tmp_path):
    ref, folder = _folder(tmp_path)
    ours = vitkit.load(folder)
    x = torch.randn(2, 3, 224, 224)
    assert ref.prune_intermediate_layers([1], prune_norm=True, prune_head=True) == [1]
    assert ours.prune_intermediate_layers([1], prune_norm=True, prune_head=True) == [1]
    with torch.no_grad():
        want, got = ref(x), ours(x)
    assert got.shape == want.shape == (2, 197, 192)
    assert (got - want).abs().max() <= 1e-5 * float(want.abs().max())
    assert ours.global_pool == ref.global_pool == ""
    vitkit.save_checkpoint(tmp_path / "pruned", ours)  # as itself, and as a timm folder
    ckpt = vitkit.checkpoints.read_checkpoint(tmp_path / "pruned")
    vitkit.checkpoints.write_checkpoint(ckpt, tmp_path / "pruned-timm", "timm")
    timm = import_reference("timm")
    for again in (
        vitkit.load(tmp_path / "pruned"),
        vitkit.load(tmp_path / "pruned-timm"),
        timm.create_model(f"local-dir:{tmp_path / 'pruned-timm'}", pretrained=True),
    ):
        with torch.no_grad():
            assert (again.eval()(x) - want).abs().max() <= 1e-5 * float(want.abs().max())
    ours.reset_classifier(5, "token")  # (a head again: the class token's)
    assert ours(x).shape == (2, 5)


def test_pretrained_cfg_types_as_timm(tmp_path):
    timm = import_reference("timm")
    ref, folder = _folder(tmp_path)
    theirs = timm.create_model(f"local-dir:{folder}").pretrained_cfg
    ours = vitkit.load(folder).pretrained_cfg
    for key in ("architecture", "input_size", "mean", "std", "crop_pct", "interpolation",
                "num_classes", "first_conv", "classifier"):  # fmt: skip
        assert ours[key] == theirs[key] and type(ours[key]) is type(theirs[key]), key
    bare = tmp_path / "bare.pth"
    torch.save(ref.state_dict(), bare)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        named = vitkit.load(bare, arch=NAME).pretrained_cfg
    registered = timm.create_model(NAME).pretrained_cfg
    for key in ("architecture", "input_size", "mean", "std"):
        assert named[key] == registered[key] and type(named[key]) is type(registered[key]), key


def test_reset_classifier_unpooled_as_timm():
    timm = import_reference("timm")
    ref = perturbed(timm.create_model(NAME, depth=1, num_classes=3))
    ours = vitkit.create_model(NAME, depth=1, num_classes=3)
    ours.load_state_dict(ref.state_dict())
    ref.reset_classifier(0, "")
    ours.reset_classifier(0, "")  # timm's unpooled head: every token
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        want, got = ref(x), ours.eval()(x)
    assert got.shape == want.shape == (1, 197, 192)
    assert (got - want).abs().max() <= 1e-5 * float(want.abs().max())
