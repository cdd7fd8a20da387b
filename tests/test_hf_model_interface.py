"""transformers' call on a model vitkit loads from a transformers folder
(vitkit.models.hf_model): a transformers user's script, only the loading line changed, gives
transformers' outputs (fields, tuple form, hidden states, attentions, another size with
interpolation, .config, .logits, the loss) on ViT, DINOv2 with registers and DINOv3 folders;
model(x) stays vitkit's; the classes whose outputs differ refuse in one line."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from references import import_reference, perturbed

import vitkit
from vitkit.errors import VitkitError

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def _saved(tmp_path, config_name, cls_name, **kw):
    """transformers' model (random weights, eager attention) and its folder."""
    transformers = import_reference("transformers")
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**TINY, **kw})
    config._attn_implementation = "eager"  # (attention weights: the explicit path)
    ref = perturbed(getattr(transformers, cls_name)(config))
    ref.save_pretrained(tmp_path / cls_name)
    return ref, tmp_path / cls_name


def _load(folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the assumed preprocessing: not this test's)
        return vitkit.load(folder, **kw)


def _close(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
        return
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a.double() - b.double()).abs().max() <= 1e-5 * max(1.0, float(b.abs().max()))


def _user_script(model, x, kw):
    """What a transformers user writes: keyword pixels, every output asked for, the tuple."""
    with torch.no_grad():
        full = model(pixel_values=x, output_hidden_states=True, output_attentions=True, **kw)
        plain = model(pixel_values=x, **kw)
        as_tuple = model(x, return_dict=False, **kw)
    return full, plain, as_tuple


CASES = [  # config, class, settings, (input size, interpolate_pos_encoding given)
    ("ViTConfig", "ViTForImageClassification", dict(image_size=64, patch_size=16, num_labels=5),
     (96, True)),
    ("ViTConfig", "ViTModel", dict(image_size=64, patch_size=16), (96, True)),
    ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel",
     dict(image_size=224, patch_size=14, num_register_tokens=2), (518, False)),
    ("Dinov2WithRegistersConfig", "Dinov2WithRegistersForImageClassification",
     dict(image_size=56, patch_size=14, num_register_tokens=2, num_labels=3), (70, False)),
    ("DeiTConfig", "DeiTForImageClassificationWithTeacher",
     dict(image_size=32, patch_size=8, num_labels=3), (48, True)),
    ("DINOv3ViTConfig", "DINOv3ViTModel",
     dict(image_size=64, patch_size=16, num_register_tokens=2), (96, False)),
]  # fmt: skip


@pytest.mark.parametrize(("config_name", "cls_name", "kw", "other"), CASES)
def test_a_transformers_script_equals_transformers(tmp_path, config_name, cls_name, kw, other):
    ref, folder = _saved(tmp_path, config_name, cls_name, **kw)
    ours = _load(folder)
    size = kw["image_size"]
    for side, interpolate in ((size, False), other):
        extra = {"interpolate_pos_encoding": True} if interpolate else {}
        x = torch.randn(2, 3, side, side)
        want, got = _user_script(ref, x, extra), _user_script(ours, x, extra)
        for w, g in zip(want, got):
            if isinstance(w, tuple):
                assert isinstance(g, tuple) and len(g) == len(w)
                for a, b in zip(g, w):
                    _close(a, b)
                continue
            assert type(g).__name__ == type(w).__name__
            assert list(g.keys()) == list(w.keys())
            for name in w:
                _close(g[name], w[name])
            _close(g[0], w[0])
            assert g.hidden_states is None or len(g.hidden_states) == TINY["num_hidden_layers"] + 1
    assert ours.config.image_size == ref.config.image_size
    assert ours.config.num_labels == ref.config.num_labels
    assert ours.config.id2label == ref.config.id2label  # (integer keys, as transformers reads)
    assert ours.config.hidden_size == ref.config.hidden_size


def test_model_x_stays_vitkits_and_logits_and_loss_are_transformers(tmp_path):
    ref, folder = _saved(tmp_path, "ViTConfig", "ViTForImageClassification", image_size=32,
                         patch_size=8, num_labels=4)  # fmt: skip
    ours = _load(folder)
    x, labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 1])
    with torch.no_grad():
        plain = ours(x)  # vitkit's call: the logits tensor, as before
        want = ref(pixel_values=x, labels=labels)
        got = ours(pixel_values=x, labels=labels)
    assert isinstance(plain, torch.Tensor)
    _close(plain, want.logits)
    _close(got.logits, want.logits)
    _close(got.loss, want.loss)
    assert list(got.keys()) == list(want.keys()) == ["loss", "logits"]
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        with torch.no_grad():
            _close(clone(pixel_values=x).logits, want.logits)
        assert clone.config.id2label == ref.config.id2label


def test_another_size_needs_interpolation_as_in_transformers(tmp_path):
    ref, folder = _saved(tmp_path, "ViTConfig", "ViTModel", image_size=32, patch_size=8)
    ours = _load(folder)
    x = torch.randn(1, 3, 48, 48)
    with pytest.raises(ValueError, match="doesn't match model"):
        ref(pixel_values=x)
    with pytest.raises(VitkitError, match="interpolate_pos_encoding=True"):
        ours(pixel_values=x)
    with torch.no_grad():  # vitkit's own call keeps resampling on the fly
        assert ours(x).shape == (1, 32)


def test_a_backbone_folder_answers_as_its_backbone(tmp_path):
    transformers = import_reference("transformers")
    torch.manual_seed(0)
    config = transformers.Dinov2WithRegistersConfig(
        **TINY, image_size=28, patch_size=14, num_register_tokens=2, out_indices=[1, 2]
    )
    config._attn_implementation = "eager"
    ref = perturbed(transformers.Dinov2WithRegistersBackbone(config))
    ref.save_pretrained(tmp_path / "bb")
    ours = _load(tmp_path / "bb")  # no backbone=True
    x = torch.randn(2, 3, 42, 28)
    with torch.no_grad():
        want = ref(pixel_values=x, output_hidden_states=True)
        got = ours(pixel_values=x, output_hidden_states=True)
    assert list(got.keys()) == list(want.keys())
    for name in want:
        _close(tuple(got[name]), tuple(want[name]))
    assert ours.channels == ref.channels and ours.out_features == ref.out_features
    assert ours.stage_names == ref.stage_names


def test_what_is_not_answered_is_refused(tmp_path):
    _, folder = _saved(tmp_path, "CLIPVisionConfig", "CLIPVisionModel", image_size=32,
                       patch_size=8)  # fmt: skip
    clip = _load(folder)
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(VitkitError, match="CLIPVisionModel: vitkit answers transformers' call"):
        clip(pixel_values=x)
    with torch.no_grad():
        assert clip(x).ndim == 2  # (vitkit's call still answers)
    _, folder = _saved(tmp_path, "ViTConfig", "ViTModel", image_size=32, patch_size=8)
    vit = _load(folder)
    with pytest.raises(VitkitError, match="bool_masked_pos: not a keyword"):
        vit(pixel_values=x, bool_masked_pos=torch.zeros(1, 16, dtype=torch.bool))
    with pytest.raises(VitkitError, match="takes no labels"):
        vit(pixel_values=x, labels=torch.tensor([0]))
