"""A timm folder whose ``architecture`` names another entry than its weights (and pooling its
weights disprove) is refused naming the keys, as timm refuses it; entries.json equals timm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file

import vitkit
from vitkit.checkpoints.arch import entries, layout_facts
from vitkit.checkpoints.timm.names import EVA_NAMES, VIT_NAMES
from vitkit.errors import VitkitError

# a plain ViT: width 192, 2 blocks (timm's vit_tiny layout)
PLAIN = {"embed_dim": 192, "depth": 2, "num_heads": 3, "img_size": 32, "num_classes": 5}


def _plain_folder(tmp_path: Path, arch: str, model_args: dict, **hub) -> tuple[Path, dict]:
    timm = import_reference("timm")
    ref = perturbed(timm.create_model("vit_tiny_patch16_224", **PLAIN))
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    d = tmp_path / arch
    d.mkdir()
    save_file(sd, str(d / "model.safetensors"))
    cfg = {"architecture": arch, "num_classes": 5, "model_args": model_args, **hub}
    (d / "config.json").write_text(json.dumps(cfg))
    return d, sd


def _timm_refuses(arch: str, model_args: dict, sd: dict) -> bool:
    timm = import_reference("timm")
    try:
        model = timm.create_model(arch, pretrained=False, **model_args)
        model.load_state_dict(sd, strict=True)
    except (RuntimeError, TypeError, AssertionError, ValueError):
        return True
    return False


LYING = [
    ("vit_base_patch16_rpn_224", "cls_token"),  # post-norm, no class token
    ("vit_base_patch16_dinov3", "pos_embed"),  # RoPE, no E_pos
    ("eva02_tiny_patch14_224", "blocks.0.mlp"),  # SwiGLU
    ("vit_base_patch16_rope_224", "pos_embed"),  # RoPE, no E_pos
    ("vit_base_patch16_clip_quickgelu_224", "norm_pre"),  # CLIP's pre-norm, quick GELU
    ("vit_base_patch32_siglip_256", "attn_pool"),  # MAP head, tanh GELU
]


@pytest.mark.parametrize(("arch", "key"), LYING)
@pytest.mark.parametrize("sizes", [True, False], ids=["sized", "bare_args"])
def test_a_name_the_weights_contradict_is_refused(tmp_path, arch, key, sizes):
    args = {k: v for k, v in PLAIN.items() if k != "num_classes"} if sizes else {}
    d, sd = _plain_folder(tmp_path, arch, args)
    if arch.startswith(("eva02", "vit_base_patch16_dinov3", "vit_base_patch16_rope")) and sizes:
        args = {k: v for k, v in args.items() if k != "num_heads"} | {"num_heads": 3}
    assert _timm_refuses(arch, {**args, "num_classes": 5}, sd)
    with pytest.raises(VitkitError, match=key) as e:
        vitkit.load(d)
    assert "does not match the weights" in str(e.value) and str(d) in str(e.value)


def test_the_true_name_still_loads(tmp_path):
    d, sd = _plain_folder(tmp_path, "vit_tiny_patch16_224", {"img_size": 32, "depth": 2})
    timm = import_reference("timm")
    ref = timm.create_model("vit_tiny_patch16_224", **PLAIN).eval()
    ref.load_state_dict(sd)
    model = vitkit.load(d).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fc_norm", [None, True])
def test_pooled_global_pool_without_fc_norm_weights_is_refused(tmp_path, fc_norm):
    args = {"img_size": 32, "depth": 2, "global_pool": "avg"} | (
        {} if fc_norm is None else {"fc_norm": True}
    )
    d, sd = _plain_folder(tmp_path, "vit_tiny_patch16_224", args)
    assert _timm_refuses("vit_tiny_patch16_224", {**PLAIN, **args}, sd)
    with pytest.raises(VitkitError, match="fc_norm.weight"):
        vitkit.load(d)


def test_avg_with_fc_norm_false_loads_as_timm(tmp_path):
    args = {"img_size": 32, "depth": 2, "global_pool": "avg", "fc_norm": False}
    d, sd = _plain_folder(tmp_path, "vit_tiny_patch16_224", args)
    timm = import_reference("timm")
    ref = timm.create_model("vit_tiny_patch16_224", **{**PLAIN, **args}).eval()
    ref.load_state_dict(sd)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.load(d).eval()(x), ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name",
    ["vit_base_patch16_rpn_224", "vit_so400m_patch14_siglip_224", "eva02_tiny_patch14_224",
     "vit_small_patch16_dinov3", "deit3_small_patch16_224", "vit_base_patch14_reg4_dinov2"],
)  # fmt: skip
def test_entries_equal_the_installed_timm(name):
    timm = import_reference("timm")
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    size = list(model.pretrained_cfg["input_size"][1:])
    assert entries()[name]["layout"] == json.loads(json.dumps(layout_facts(shapes, size)))
    assert set(entries()) == set(VIT_NAMES | EVA_NAMES)


# keys the size args do not explain: q_norm (an entry without it), a fused qkv.bias (an Eva name)
KEYS_ONLY = [
    ("vit_large_patch14_clip_336", {"qk_norm": True, "pre_norm": True}, "q_norm"),
    ("eva_giant_patch14_224", {"global_pool": "avg", "act_layer": "quick_gelu"}, "qkv.bias"),
]


@pytest.mark.parametrize(("arch", "extra", "key"), KEYS_ONLY)
def test_keys_the_named_entry_lacks_are_refused_with_sizes_given(tmp_path, arch, extra, key):
    timm = import_reference("timm")
    args = {"embed_dim": 64, "depth": 1, "num_heads": 4, "img_size": 32, "num_classes": 5}
    ref = perturbed(timm.create_model("vit_tiny_patch16_224", **args, **extra))
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    d = tmp_path / arch
    d.mkdir()
    save_file(sd, str(d / "model.safetensors"))
    sizes = {**args, "patch_size": 16}
    (d / "config.json").write_text(json.dumps({"architecture": arch, "model_args": sizes}))
    assert _timm_refuses(arch, sizes, sd)
    with pytest.raises(VitkitError, match=key):
        vitkit.load(d)
