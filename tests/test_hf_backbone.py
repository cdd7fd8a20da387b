"""Hugging Face's backbone classes (checkpoints/hf/backbone.py): Dinov2Backbone,
Dinov2WithRegistersBackbone and DINOv3ViTBackbone read with their feature settings, their
feature_maps equal to transformers' (float64, random weights, tiny configs), written back as the
same class, and any Dinov2 / DINOv3 checkpoint written as one."""

from __future__ import annotations

import json

import pytest
import torch
from references import import_reference, perturbed

import vitkit
from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.checkpoints.hf.backbone import as_backbone, features_options
from vitkit.errors import VitkitError
from vitkit.models.features import features_model
from vitkit.models.vit import build_model

TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
            image_size=32, patch_size=8)  # fmt: skip


def _hf(cls_name: str, **kw):
    transformers = import_reference("transformers")
    config_cls = {
        "Dinov2Backbone": transformers.Dinov2Config,
        "Dinov2WithRegistersBackbone": transformers.Dinov2WithRegistersConfig,
        "DINOv3ViTBackbone": transformers.DINOv3ViTConfig,
    }[cls_name]
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config_cls(**{**TINY, **kw}))
    return perturbed(model.double()).eval()


def _ours(folder, **options):
    """vitkit's float64 features-only model of a folder, with its backbone settings."""
    ckpt = read_checkpoint(folder)
    model = build_model(ckpt.model_config).double().eval()
    model.load_state_dict(ckpt.state_dict, strict=True)
    features_options(ckpt.meta, options, str(folder))
    return features_model(model, options).eval(), ckpt


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


CASES = [
    ("Dinov2Backbone", dict(out_indices=[1, 3])),
    ("Dinov2Backbone", dict(out_features=["stage2"], apply_layernorm=False)),
    ("Dinov2WithRegistersBackbone", dict(out_indices=[2, 3], num_register_tokens=2)),
    ("DINOv3ViTBackbone", dict(out_indices=[1, 3], num_register_tokens=2)),
    ("DINOv3ViTBackbone", dict(out_indices=[2, 3], apply_layernorm=False)),  # the last normed
    ("DINOv3ViTBackbone", dict(out_indices=[1], reshape_hidden_states=False)),  # token lists
]


@pytest.mark.parametrize(("cls_name", "kw"), CASES)
def test_feature_maps_equal_transformers(tmp_path, cls_name, kw):
    ref = _hf(cls_name, **kw)
    ref.save_pretrained(tmp_path / "hf")
    ours, ckpt = _ours(tmp_path / "hf")
    assert ckpt.meta["backbone"]["class"] == cls_name and ckpt.model_config.num_classes == 0
    # a non-square grid: E_pos resampled with each class's kernel (Dinov2WithRegisters
    # antialiases, PyTorch's a = -0.5 bicubic; Dinov2 does not, a = -0.75)
    x = torch.randn(2, 3, 32, 48, dtype=torch.float64)
    with torch.no_grad():
        want, got = ref(x).feature_maps, ours(x)
    assert len(got) == len(want) == len(ref.out_indices)
    for a, b in zip(got, want):
        assert a.shape == b.shape and _rel(a, b) <= 1e-12
    assert ours.feature_info.channels() == [ref.config.hidden_size] * len(got)
    # written back: the same class, settings and weights; transformers reads it
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    back = type(ref).from_pretrained(tmp_path / "back").double().eval()  # (as ref was built)
    assert back.out_indices == ref.out_indices and back.config.apply_layernorm == (
        ref.config.apply_layernorm
    )
    with torch.no_grad():  # (the registers' converter rounds E_pos once: 9e-16)
        assert all(_rel(a, b) <= 1e-12 for a, b in zip(back(x).feature_maps, want))


def test_float32_load(tmp_path):
    ref = _hf("DINOv3ViTBackbone", out_indices=[2, 3], num_register_tokens=1)
    ref.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf", features_only=True)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = ref.float()(x).feature_maps
        got = model(x)
    assert all(_rel(a, b) <= 1e-5 for a, b in zip(got, want))
    other = vitkit.load(tmp_path / "hf", features_only=True, out_indices=[0])  # one's own choice
    assert other.out_indices == [0] and len(other.model.blocks) == 1


def test_any_dinov3_checkpoint_written_as_a_backbone(tmp_path):
    transformers = import_reference("transformers")
    torch.manual_seed(0)
    model = perturbed(
        transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**TINY, num_register_tokens=2))
    )
    model.save_pretrained(tmp_path / "model")
    ckpt = read_checkpoint(tmp_path / "model")
    assert "backbone" not in ckpt.meta
    write_checkpoint(as_backbone(ckpt, [1, 2, 3]), tmp_path / "bb", "hf")
    bb = transformers.DINOv3ViTBackbone.from_pretrained(tmp_path / "bb").eval()
    written = json.loads((tmp_path / "bb" / "config.json").read_text())
    assert written["architectures"] == ["DINOv3ViTBackbone"] and bb.out_indices == [1, 2, 3]
    ours = vitkit.load(tmp_path / "bb", features_only=True)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert all(_rel(a, b) <= 1e-5 for a, b in zip(ours(x), bb(x).feature_maps))


def test_refusals(tmp_path):
    ref = _hf("Dinov2Backbone", out_indices=[0, 2])
    ref.save_pretrained(tmp_path / "stem")
    with pytest.raises(VitkitError, match="stem"):
        vitkit.load(tmp_path / "stem", features_only=True)
    assert vitkit.load(tmp_path / "stem", features_only=True, out_indices=[1])  # chosen: fine
    assert vitkit.load(tmp_path / "stem").cfg.num_classes == 0  # the weights load
    _hf("Dinov2Backbone", reshape_hidden_states=False).save_pretrained(tmp_path / "nlc")
    with pytest.raises(VitkitError, match="class token"):
        vitkit.load(tmp_path / "nlc", features_only=True)
    plain = vitkit.create_model("Ti/16", num_classes=0, depth=2, image_size=32, patch_size=8)
    vitkit.save_checkpoint(tmp_path / "vit", plain)
    marked = as_backbone(read_checkpoint(tmp_path / "vit"), [2])
    with pytest.raises(VitkitError, match="Dinov2Model's layout"):
        write_checkpoint(marked, tmp_path / "out", "hf")
