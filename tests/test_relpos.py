"""Relative position bias (vitkit.models.relpos): timm's BEiT (beit.py) and relpos ViTs
(vision_transformer_relpos.py) read exactly, float64 logits against live timm on identical
random weights (tiny models: depth 2, width 64, a 2x2 grid), both ways, bitwise round trips,
a second input size where timm's bias follows the grid, and the refusals."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.checkpoints.description import family_name
from vitkit.checkpoints.native.safetensors_io import Checkpoint
from vitkit.checkpoints.timm import beit_relpos as tr
from vitkit.errors import AssumptionWarning, VitkitError
from vitkit.registry.counts import count_params
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

SMALL = dict(depth=2, img_size=32, num_classes=5, embed_dim=64, num_heads=2)
# (timm entry, its extra arguments, vitkit's family name)
CASES = {
    "beit": ("beit_base_patch16_224", {}, "BEiT"),
    "beitv2": ("beitv2_base_patch16_224", {}, "BEiT"),
    "beit-shared-abs": (
        "beit_base_patch16_224",
        dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True, use_abs_pos_emb=True),
        "BEiT",
    ),
    "beit-token": ("beit_base_patch16_224", dict(global_pool="token"), "BEiT"),
    "relpos": ("vit_relpos_small_patch16_224", {}, "relative-position ViT"),
    "srelpos": ("vit_srelpos_small_patch16_224", dict(rel_pos_dim=32), "relative-position ViT"),
    "relpos-cls": ("vit_relpos_medium_patch16_cls_224", {}, "relative-position ViT"),
    "relpos-clsgap": ("vit_relpos_base_patch16_clsgap_224", {}, "relative-position ViT"),
    "relpos-rpn": ("vit_relpos_small_patch16_rpn_224", {}, "relative-position ViT (post-norm)"),
    "relpos-plus": ("vit_relpos_base_patch16_plus_240", {}, "relative-position ViT"),
    "relpos-swin": ("vit_relpos_small_patch16_224", dict(rel_pos_type="mlp_swin"), "relative"),
    "relpos-table-cls": (
        "vit_relpos_small_patch16_224",
        dict(rel_pos_type="bias", class_token=True, qk_norm=True),
        "relative-position ViT",
    ),
}


def _images(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1)).double()


def _timm(name: str, extra: dict, **over):
    timm = import_reference("timm")
    return perturbed(timm.create_model(name, **{**SMALL, **extra, **over}).double()).eval()


def _folder(path: Path, name: str, model, args: dict) -> Path:
    path.mkdir()
    save_file(model.state_dict(), path / "model.safetensors")
    hub = {"architecture": name, "num_classes": 5, "model_args": args}
    (path / "config.json").write_text(json.dumps(hub))
    return path


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("case", CASES)
def test_timm_logits_match_both_ways(tmp_path, case):
    timm = import_reference("timm")
    name, extra, family = CASES[case]
    ref = _timm(name, extra)
    x = _images()
    ckpt = read_checkpoint(_folder(tmp_path / "hub", name, ref, {**SMALL, **extra}))
    cfg = ckpt.model_config
    assert family_name(cfg).startswith(family)
    model = vitkit.create_model(cfg).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.eval()
    assert count_params(cfg) == sum(p.numel() for p in ref.parameters())
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        want, got = ref(x), model(x)
        assert _rel(got, want) <= 1e-12
        # the analysis path (explicit softmax + the same bias) computes the same
        assert _rel(model.forward_with_attentions(x).logits, want) <= 1e-12
    # vitkit → timm: timm's own keys, read back bitwise, run by timm itself
    ours = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))
    assert tr.state_dict_to_relpos(ours.state_dict, cfg).keys() == ref.state_dict().keys()
    write_checkpoint(ours, tmp_path / "folder", "timm")
    back = read_checkpoint(tmp_path / "folder")
    assert back.model_config == cfg
    assert back.state_dict.keys() == ours.state_dict.keys()
    assert all(torch.equal(back.state_dict[k], v) for k, v in ours.state_dict.items())
    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}").double().eval()
    again.load_state_dict(load_file(tmp_path / "folder" / "model.safetensors"), strict=True)
    with torch.no_grad():
        assert _rel(again(x), want) <= 1e-12


@pytest.mark.parametrize("case", ["relpos", "relpos-swin", "relpos-clsgap"])
def test_an_mlp_bias_follows_the_input_grid(tmp_path, case):
    """timm's set_input_size regenerates the MLP bias's coordinates for the new grid; vitkit
    computes them for the input's grid on the fly: equal at 48 px (3x3) and 64x48 px."""
    name, extra, _ = CASES[case]
    ref = _timm(name, extra)
    ckpt = read_checkpoint(_folder(tmp_path / "hub", name, ref, {**SMALL, **extra}))
    model = vitkit.create_model(ckpt.model_config).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.eval()
    for size in ((48, 48), (64, 48)):
        other = _timm(name, extra, img_size=size)
        other.load_state_dict(ref.state_dict(), strict=True)
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2)).double()
        with torch.no_grad():
            assert _rel(model(x), other(x)) <= 1e-12
            assert _rel(model.forward_with_attentions(x).logits, other(x)) <= 1e-12


def test_a_table_bias_refuses_another_size(tmp_path):
    name, extra, _ = CASES["beit"]
    ckpt = read_checkpoint(_folder(tmp_path / "hub", name, _timm(name, extra), SMALL))
    model = vitkit.create_model(ckpt.model_config).eval()
    with pytest.raises(VitkitError, match="learned for a 2x2 patch grid; these images make 3x3"):
        model(torch.zeros(1, 3, 48, 48))


@pytest.mark.parametrize(
    ("case", "said"),
    [("beit", set()), ("relpos-cls", {"image_size"}), ("relpos-rpn", {"image_size", "block"})],
)
def test_bare_state_dicts_say_what_they_assume(tmp_path, case, said):
    name, extra, _ = CASES[case]
    ref = _timm(name, extra)
    save_file(ref.state_dict(), tmp_path / "model.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(tmp_path / "model.safetensors")
    lines = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    fields = {a.field for a in ckpt.provenance.assumptions} - {"mean"}
    assert fields == said, lines
    model = vitkit.create_model(ckpt.model_config).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    x = _images()
    with torch.no_grad():
        assert _rel(model.eval()(x), ref(x)) <= 1e-12  # (the assumed values are timm's here)


def test_refusals(tmp_path):
    name, extra, _ = CASES["beit"]
    ref = _timm(name, extra)
    sd = dict(ref.state_dict())
    sd["blocks.0.attn.relative_position_index"] = torch.zeros(5, 5, dtype=torch.long)
    cfg, _ = tr.relpos_config_provenance(sd, None, "f")
    with pytest.raises(VitkitError, match="relative_position_index is not the index"):
        tr.relpos_to_state_dict(sd, cfg, "f")
    with pytest.raises(VitkitError, match="num_heads=4, but the relative position bias has 2"):
        tr.relpos_config_provenance(dict(ref.state_dict()), None, "f", num_heads=4)
    bad = {"architecture": name, "model_args": {**SMALL, "swiglu_mlp": True}}
    with pytest.raises(VitkitError, match="swiglu_mlp=True is not supported"):
        tr.relpos_config_provenance(dict(ref.state_dict()), bad, "f")
    odd = {"architecture": "vit_relpos_small_patch16_224", "model_args": SMALL}
    with pytest.raises(VitkitError, match="is timm's relpos, but the weights are beit's"):
        tr.relpos_config_provenance(dict(ref.state_dict()), odd, "f")
    with pytest.raises(VitkitError, match="at most"):  # registers with a relative bias
        ViTConfig(num_reg_tokens=1, rel_pos="mlp")
    with pytest.raises(VitkitError, match="needs qkv_bias=True"):
        ViTConfig(qkv_bias=False, k_bias=False)
    cfg = ViTConfig(image_size=32, width=64, depth=1, num_heads=2, mlp_dim=128, gelu="none")
    with pytest.raises(VitkitError, match="relpos ViT has no absolute position embedding"):
        tr.state_dict_to_relpos({}, cfg.replace(rel_pos="mlp"))
    with pytest.raises(VitkitError, match="exact GELU"):
        tr.state_dict_to_relpos({}, cfg.replace(rel_pos="mlp", abs_pos_embed=False, gelu="tanh"))


def test_paper_vit_is_unchanged_npz_refuses_the_switches_hf_holds_them_as_beit(tmp_path):
    cfg = ViTConfig(image_size=32, width=64, depth=1, num_heads=2, mlp_dim=128)
    assert cfg.family_switches == {}
    beit = cfg.replace(gelu="none", pool="gap", class_token=True, fc_norm=True, k_bias=False)
    beit = beit.replace(abs_pos_embed=False, rel_pos="bias", layer_scale_init=0.1)
    assert set(beit.family_switches) >= {"abs_pos_embed", "rel_pos", "k_bias"}
    model = vitkit.create_model(beit)
    ckpt = Checkpoint(Path("mem"), beit, PreprocessConfig.for_model(beit), model.state_dict())
    with pytest.raises(VitkitError):
        write_checkpoint(ckpt, tmp_path / "m.npz", "npz")
    write_checkpoint(ckpt, tmp_path / "hf", "hf")  # BeitForImageClassification (hf_beit.py)
    back = read_checkpoint(tmp_path / "hf")
    assert back.model_config == beit
    assert all(torch.equal(back.state_dict[k], v) for k, v in model.state_dict().items())


def test_onnx_export_of_a_tiny_beit(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.engines.onnx_export import check_onnx, export_onnx

    name, extra, _ = CASES["beit"]
    ckpt = read_checkpoint(_folder(tmp_path / "hub", name, _timm(name, extra), SMALL))
    model = vitkit.create_model(ckpt.model_config)
    model.load_state_dict({k: v.float() for k, v in ckpt.state_dict.items()}, strict=True)
    path = export_onnx(model.eval(), tmp_path / "beit.onnx")
    assert check_onnx(model, path) <= 1e-4
