"""transformers' backbone classes as vitkit loads them with ``backbone=True``
(vitkit.models.hf_backbone): the same output object (feature_maps, hidden_states, attentions,
the tuple), attributes (channels, out_features, out_indices, stage_names) and stage numbering
as Dinov2Backbone, Dinov2WithRegistersBackbone and DINOv3ViTBackbone on identical random
weights; and stage-numbered out_indices given to features_only said, apply_layernorm kept."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from references import import_reference, perturbed

import vitkit
from vitkit.errors import AssumptionWarning, VitkitError
from vitkit.models.hf_backbone import HFBackbone

TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
            image_size=32, patch_size=8)  # fmt: skip


def _saved(tmp_path, cls_name, **kw):
    """transformers' backbone (random weights, float32, eager attention) and its folder."""
    transformers = import_reference("transformers")
    config_cls = {
        "Dinov2Backbone": transformers.Dinov2Config,
        "Dinov2WithRegistersBackbone": transformers.Dinov2WithRegistersConfig,
        "DINOv3ViTBackbone": transformers.DINOv3ViTConfig,
    }[cls_name]
    torch.manual_seed(0)
    config = config_cls(**{**TINY, **kw})
    config._attn_implementation = "eager"  # (attention weights: the explicit path)
    ref = perturbed(getattr(transformers, cls_name)(config))
    ref.save_pretrained(tmp_path / "hf")
    return ref, tmp_path / "hf"


def _close(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a.double() - b.double()).abs().max() <= 1e-5 * b.abs().max(), "values differ"


def _same_outputs(ours, ref, x):
    with torch.no_grad():
        want = ref(x, output_hidden_states=True, output_attentions=True)
        got = ours(x, output_hidden_states=True, output_attentions=True)
        plain_want, plain_got = ref(x), ours(x)
        tuple_want = ref(x, return_dict=False)
        tuple_got = ours(x, return_dict=False)
    assert list(got.keys()) == list(want.keys())
    assert list(plain_got.keys()) == list(plain_want.keys())  # no hidden_states unasked
    assert plain_got.hidden_states is None and plain_got.attentions is None
    for name in want:
        assert type(got[name]) is type(want[name]) and len(got[name]) == len(want[name]), name
        for a, b in zip(got[name], want[name]):
            _close(a, b)
    for a, b in zip(plain_got[0], plain_want.feature_maps):
        _close(a, b)
    assert type(tuple_got) is tuple and len(tuple_got) == len(tuple_want)
    for g, w in ((got, want), (plain_got, plain_want)):  # (DINOv3's: always)
        if getattr(w, "last_hidden_state", None) is None:
            assert g.last_hidden_state is None
        else:
            _close(g.last_hidden_state, w.last_hidden_state)


def _same_attributes(ours, ref):
    for name in ("channels", "out_features", "out_indices", "stage_names", "num_features",
                 "out_feature_channels"):  # fmt: skip
        assert getattr(ours, name) == getattr(ref, name), name
        assert type(getattr(ours, name)) is type(getattr(ref, name)), name
    assert ours.config.apply_layernorm == ref.config.apply_layernorm
    assert ours.config.reshape_hidden_states == ref.config.reshape_hidden_states


CASES = [
    ("Dinov2Backbone", dict(out_indices=[0, 1, 3])),  # the stem (the embeddings) too
    ("Dinov2Backbone", dict(out_features=["stage2"], apply_layernorm=False)),
    ("Dinov2Backbone", dict(out_indices=[1, -1], reshape_hidden_states=False)),  # with the prefix
    ("Dinov2WithRegistersBackbone", dict(out_indices=[2, 3], num_register_tokens=2)),
    ("DINOv3ViTBackbone", dict(out_indices=[1, 3], num_register_tokens=2)),
    ("DINOv3ViTBackbone", dict(out_indices=[0, 2, 3], apply_layernorm=False)),  # last normed
    ("DINOv3ViTBackbone", dict(out_indices=[1], reshape_hidden_states=False)),
    ("DINOv3ViTBackbone", dict(out_indices=[2, -1], return_class_token=True)),  # cls_tokens
]


@pytest.mark.parametrize(("cls_name", "kw"), CASES)
def test_backbone_equals_transformers(tmp_path, cls_name, kw):
    ref, folder = _saved(tmp_path, cls_name, **kw)
    ours = vitkit.load(folder, backbone=True)
    assert isinstance(ours, HFBackbone) and ours.cls_name == cls_name
    _same_attributes(ours, ref)
    _same_outputs(ours, ref, torch.randn(2, 3, 32, 48))  # (a non-square grid)


def test_chosen_stages_are_transformers(tmp_path):
    """out_indices / out_features given at load are stages, as from_pretrained takes them."""
    ref, folder = _saved(tmp_path, "Dinov2WithRegistersBackbone", num_register_tokens=1)
    cls = type(ref)
    for chosen in (dict(out_indices=[1, -1]), dict(out_features=["stem", "stage2"])):
        want = cls.from_pretrained(folder, **chosen, attn_implementation="eager").eval()
        got = vitkit.load(folder, backbone=True, **chosen)
        _same_attributes(got, want)
        _same_outputs(got, want, torch.randn(1, 3, 32, 32))
    with pytest.raises(VitkitError, match="stage order"):
        vitkit.load(folder, backbone=True, out_indices=[2, 1])
    with pytest.raises(VitkitError, match="choose one"):
        vitkit.load(folder, backbone=True, features_only=True)
    with pytest.raises(VitkitError, match="need backbone=True"):
        vitkit.load(folder, apply_layernorm=False)


def test_any_vit_checkpoint_as_a_backbone(tmp_path):
    """A vitkit checkpoint of DINOv2's layout gives Dinov2Backbone's defaults: the last stage,
    normed, as a map."""
    torch.manual_seed(0)
    tiny = dict(image_size=32, patch_size=8, width=32, depth=3, num_heads=2, mlp_dim=64)
    model = perturbed(vitkit.create_model("Ti/16", **tiny, num_classes=0))
    vitkit.save_checkpoint(tmp_path / "vit", model)
    ours = vitkit.load(tmp_path / "vit", backbone=True)
    assert ours.out_features == ["stage3"] and ours.channels == [32]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        (got,) = ours(pixel_values=x).feature_maps
        want = model.forward_intermediates(x, [-1], norm=True, intermediates_only=True)[0]
    assert torch.allclose(got, want, atol=1e-6)
    for wrapper in (ours, vitkit.load(tmp_path / "vit", features_only=True)):
        with pytest.raises(VitkitError, match=r"save the model it wraps \(\.model\)"):
            vitkit.save_checkpoint(tmp_path / "out", wrapper)
    assert not (tmp_path / "out").exists()


def test_stage_numbers_given_to_features_only_are_said(tmp_path):
    """features_only's out_indices are blocks (timm's); a backbone folder's stage numbering
    would pick others: said in one line. The folder's apply_layernorm stays."""
    ref, folder = _saved(tmp_path, "Dinov2Backbone", out_indices=[2])
    with pytest.warns(AssumptionWarning, match=r"would be blocks \[0, -1\]") as said:
        got = vitkit.load(folder, features_only=True, out_indices=[1, -1])
    assert len([w for w in said if issubclass(w.category, AssumptionWarning)
                and "out_indices" in str(w.message)]) == 1  # fmt: skip
    assert "\n" not in str(said[-1].message)
    x = torch.randn(1, 3, 32, 32)
    want = type(ref).from_pretrained(folder, out_indices=[2, 3]).eval()  # blocks 1 and 2
    with torch.no_grad():
        for a, b in zip(got(x), want(x).feature_maps):  # normed, as the folder says
            _close(a, b)
    with pytest.warns(AssumptionWarning, match=r"would be blocks \[1, the embeddings\]"):
        vitkit.load(folder, features_only=True, out_indices=np.array([2, 0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumptionWarning)
        vitkit.load(folder, features_only=True, out_indices=[-2, -1], mean=(0.5,) * 3,
                    std=(0.5,) * 3)  # fmt: skip  # negative numbers agree: nothing said
