"""AIMv2, BEiT-3 and post-norm switches (RMSNorm, patch-embedding norm, no projection / MLP
biases, unpacked SwiGLU, sub-LayerNorms, timm's ResPostBlock): exact counts, float64 logits equal
to live timm models of the same entries on identical random weights, both ways, and bitwise
round trips through timm folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.checkpoints.description import family_name
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_flops, count_params
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

BASE = dict(image_size=32, patch_size=8, num_classes=5, width=32, depth=2, num_heads=4, mlp_dim=64)

# (name, vitkit switches) as timm's entries set them
SWITCHES = {
    "aimv2": dict(  # aimv2_*: RMSNorm (eps 1e-5) everywhere, unpacked SwiGLU, no biases
        norm="rmsnorm",
        layer_norm_eps=1e-5,
        patch_norm=True,
        proj_bias=False,
        qkv_bias=False,
        mlp="swiglu",
        mlp_dim=88,
        pool="gap",
    ),
    "beit3": dict(  # beit3_*: sub-LayerNorms in attention and MLP, eps 1e-5, "avg" + fc_norm
        scale_attn_norm=True,
        scale_mlp_norm=True,
        layer_norm_eps=1e-5,
        pool="gap",
        class_token=True,
        fc_norm=True,
    ),
    "beit3-eps6": dict(scale_attn_norm=True, scale_mlp_norm=True),  # not an entry: eps 1e-6
    "rms-swiglu-eps6": dict(  # on timm's DINOv2-giant entry (which always has layer scale)
        norm="rmsnorm", patch_norm=True, mlp="swiglu", proj_bias=False, layer_scale_init=1e-5
    ),
    "rpn": dict(block="post", qkv_bias=False, pool="gap", fc_norm=True),  # ResPostBlock
    "test_vit4": dict(  # RMSNorm with timm's eps 1e-6, a register, layer scale, fc_norm
        norm="rmsnorm",
        num_reg_tokens=1,
        layer_scale_init=1e-5,
        pool="gap",
        fc_norm=True,
    ),
}


def tiny(**kw) -> ViTConfig:
    return ViTConfig(**{**BASE, "gelu": "none", **kw})


def _images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)).double()


@pytest.mark.parametrize("name", SWITCHES)
def test_counts_are_exact(name):
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES[name])
    model = vitkit.create_model(cfg).eval()
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    ref = timm.create_model(timm_conv.timm_architecture(cfg), **timm_conv.timm_model_args(cfg))
    assert sum(p.numel() for p in ref.parameters()) == count_params(cfg)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.forward_with_attentions(torch.randn(1, 3, 32, 32))
    assert counter.get_total_flops() == count_flops(cfg)


@pytest.mark.parametrize("name", SWITCHES)
def test_timm_logits_match_both_ways(tmp_path, name):
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES[name])
    arch, args = timm_conv.timm_architecture(cfg), timm_conv.timm_model_args(cfg)
    ref = perturbed(timm.create_model(arch, **args).double())
    x = _images()
    # timm → vitkit: a timm folder naming the entry, with timm's keys (fc1_g / fc1_x for AIMv2)
    (tmp_path / "hub").mkdir()
    save_file(ref.state_dict(), tmp_path / "hub" / "model.safetensors")
    hub = {"architecture": arch, "num_classes": 5, "model_args": args}
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    ckpt = read_checkpoint(tmp_path / "hub")
    assert ckpt.model_config == cfg.replace(pos_resample="bicubic-antialias")  # timm's kernel
    model = vitkit.create_model(cfg).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.eval()
    with torch.no_grad():
        want = ref(x)
        diff = (model(x) - want).abs().max().item()
    assert diff <= 1e-12 * want.abs().max().item(), diff
    with torch.no_grad():  # the analysis path (explicit softmax) computes the same
        assert torch.allclose(model.forward_with_attentions(x).logits, model(x), atol=1e-12)
    if name in ("aimv2", "beit3", "rpn"):
        family = {"aimv2": "AIMv2", "beit3": "BEiT-3", "rpn": "post-norm ViT"}[name]
        assert family_name(cfg).startswith(family)
    # vitkit → timm: the same keys as timm's, read back bitwise, run by timm itself
    ours = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))
    assert timm_conv.state_dict_to_timm(ours.state_dict, cfg).keys() == ref.state_dict().keys()
    write_checkpoint(ours, tmp_path / "folder", "timm")
    back = read_checkpoint(tmp_path / "folder")
    assert back.model_config == cfg.replace(pos_resample="bicubic-antialias")  # timm's kernel
    assert back.state_dict.keys() == ours.state_dict.keys()
    assert all(torch.equal(back.state_dict[k], v) for k, v in ours.state_dict.items())
    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}").double().eval()  # its config
    again.load_state_dict(load_file(tmp_path / "folder" / "model.safetensors"), strict=True)
    with torch.no_grad():
        diff = (again(x) - model(x)).abs().max().item()
    assert diff <= 1e-12 * want.abs().max().item(), diff


def test_a_bare_aimv2_state_dict_packs_its_swiglu():
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES["aimv2"])
    ref = timm.create_model(timm_conv.timm_architecture(cfg), **timm_conv.timm_model_args(cfg))
    sd = perturbed(ref).state_dict()
    assert "blocks.0.mlp.fc1_g.weight" in sd
    got = timm_conv.timm_config(sd, num_heads=4)
    assert got == cfg.replace(class_token=None)  # eps 1e-5 too: only AIMv2 has these weights
    ours = timm_conv.timm_to_state_dict(sd, got)
    gate, value = sd["blocks.1.mlp.fc1_g.weight"], sd["blocks.1.mlp.fc1_x.weight"]
    assert torch.equal(ours["blocks.1.mlp.fc1.weight"], torch.cat([gate, value]))
    del sd["blocks.1.mlp.fc1_x.weight"]
    with pytest.raises(VitkitError, match="fc1_g / fc1_x"):
        timm_conv.timm_config(sd, num_heads=4)


def test_switch_combinations_no_checkpoint_has_are_refused():
    with pytest.raises(VitkitError, match="layer scale"):
        tiny(block="post", layer_scale_init=1e-5)
    with pytest.raises(VitkitError, match='pool="map"'):
        tiny(pool="map", norm="rmsnorm")
    with pytest.raises(VitkitError, match="norm"):
        tiny(norm="batchnorm")
    cfg = tiny(norm="rmsnorm", layer_norm_eps=1e-3)
    with pytest.raises(VitkitError, match="RMSNorm has eps"):
        timm_conv.state_dict_to_timm(vitkit.create_model(cfg).state_dict(), cfg)
    cfg = tiny(**{**SWITCHES["aimv2"], "patch_norm": False})
    with pytest.raises(VitkitError, match="patch_norm"):
        timm_conv.state_dict_to_timm(vitkit.create_model(cfg).state_dict(), cfg)
    assert tiny().later_switches == {} and "norm" in tiny(norm="rmsnorm").family_switches


@pytest.mark.parametrize(
    "name",
    [
        "aimv2_large_patch14_224",
        "aimv2_huge_patch14_336",
        "aimv2_1b_patch14_448",
        "aimv2_3b_patch14_224",
        "beit3_giant_patch14_224",
        "test_vit",
        "test_vit2",
        "test_vit3",
        "test_vit4",
    ],
)
def test_name_hints_give_timms_heads_and_eps(name):
    timm = import_reference("timm")
    with torch.device("meta"):
        model = timm.create_model(name)
    hints = timm_conv._name_settings(name)
    heads = hints.get("num_heads", timm_conv.HEADS_BY_WIDTH.get(model.embed_dim))
    assert heads == model.blocks[0].attn.num_heads
    assert hints.get("layer_norm_eps", 1e-6) == model.blocks[0].norm1.eps


@pytest.mark.parametrize("fmt", ["npz", "hf"])
@pytest.mark.parametrize("name", ["aimv2", "beit3", "rpn"])
def test_formats_that_cannot_hold_the_switches_refuse_them(tmp_path, fmt, name):
    cfg = tiny(**SWITCHES[name])
    sd = dict(vitkit.create_model(cfg).state_dict())
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd)
    switch = next(iter(cfg.later_switches))
    with pytest.raises(VitkitError, match=switch):
        write_checkpoint(ckpt, tmp_path / ("out.npz" if fmt == "npz" else "out"), fmt)
