"""The ViT family's switches (fc_norm, class token, registers, E_pos without prefix rows, layer
scale, pre-norm, quick GELU): exact counts, and logits equal to a live timm model built with the
same switches, read and written through vitkit's timm converter on identical random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis.attention import patch_map
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.checkpoints.adapt import adapt
from vitkit.checkpoints.description import format_description
from vitkit.checkpoints.formats import describe
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_flops, count_params
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

BASE = dict(image_size=32, patch_size=8, num_classes=5, width=32, depth=2, num_heads=4, mlp_dim=64)

# (name, vitkit switches): each the way a real family member uses it.
SWITCHES = {
    "timm-avg": dict(pool="gap", class_token=True, fc_norm=True),  # timm's global_pool="avg"
    "gap-no-cls-fc-norm": dict(pool="gap", fc_norm=True),  # class_token=False, fc_norm
    "deit3": dict(layer_scale_init=1e-6, pos_embed_prefix=False),  # DeiT-III
    "dinov2-reg": dict(num_reg_tokens=4, pos_embed_prefix=False, layer_scale_init=1e-5),
    "regs-embedded": dict(num_reg_tokens=2),  # E_pos rows for the registers too
    "clip": dict(norm_pre=True, gelu="quick", patch_bias=False),  # CLIP image tower
    "qk-norm": dict(qk_norm=True),
    "avgmax": dict(pool="avgmax", class_token=True, fc_norm=True),  # timm's global_pool="avgmax"
    "max": dict(pool="max"),
    "dinov2-giant": dict(
        mlp="swiglu", layer_scale_init=1e-5, num_reg_tokens=4, pos_embed_prefix=False
    ),
    "deit-distilled": dict(dist_token=True),
}


def tiny(**kw) -> ViTConfig:
    return ViTConfig(**{**BASE, "gelu": "none", **kw})


@pytest.mark.parametrize("name", SWITCHES)
def test_counts_are_exact(name):
    cfg = tiny(**SWITCHES[name])
    model = vitkit.create_model(cfg).eval()
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.forward_with_attentions(torch.randn(1, 3, 32, 32))
    assert counter.get_total_flops() == count_flops(cfg)


@pytest.mark.parametrize("name", SWITCHES)
def test_timm_logits_match_both_ways(tmp_path, name):
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES[name])
    args = timm_conv.timm_model_args(cfg)
    ref = perturbed(timm.create_model(timm_conv.timm_architecture(cfg), **args).double())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    # timm → vitkit: a bare state dict (num_heads given), then a timm folder with its config
    save_file(ref.state_dict(), tmp_path / "timm.safetensors")
    ckpt = read_checkpoint(tmp_path / "timm.safetensors", num_heads=4)
    for k in (
        "fc_norm",
        "num_reg_tokens",
        "pos_embed_prefix",
        "norm_pre",
        "qk_norm",
        "dist_token",
        "mlp",
    ):
        assert getattr(ckpt.model_config, k) == getattr(cfg, k), k
    assert (ckpt.model_config.layer_scale_init is None) == (cfg.layer_scale_init is None)
    model = vitkit.create_model(cfg).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.eval()
    with torch.no_grad():
        diff = (model(x) - ref(x)).abs().max().item()
    assert diff <= 1e-12, diff
    # vitkit → timm: written as a timm folder, read back equal, and run by timm itself
    ours = Checkpoint(
        Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(model.float().state_dict())
    )
    write_checkpoint(ours, tmp_path / "folder", "timm")
    back = read_checkpoint(tmp_path / "folder")
    assert back.model_config == cfg.replace(pos_resample="bicubic-antialias")  # timm's kernel
    shown = format_description(describe(back))
    assert "switches:" in shown and next(iter(cfg.family_switches)) in shown
    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}", pretrained=True).eval()
    with torch.no_grad():
        diff = (again(x.float()) - model(x.float())).abs().max().item()
    assert diff <= 1e-5, diff


def test_old_configs_load_with_the_papers_switches():
    d = tiny().to_dict()
    assert d["fc_norm"] is False and d["num_reg_tokens"] == 0 and d["class_token"] is None
    old = {k: v for k, v in d.items() if k not in SWITCHES["dinov2-reg"] | SWITCHES["timm-avg"]}
    assert ViTConfig.from_dict(old) == tiny()
    cfg = tiny(**SWITCHES["dinov2-reg"])
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(VitkitError, match="class token"):
        tiny(class_token=False)
    with pytest.raises(VitkitError, match="num_reg_tokens"):
        tiny(num_reg_tokens=-1)


def test_registers_stay_out_of_the_grid_and_resampling():
    cfg = tiny(num_reg_tokens=4)  # class token + 4 registers, all with E_pos rows
    model = perturbed(vitkit.create_model(cfg))
    out = model.forward_with_attentions(torch.randn(1, 3, 32, 32))
    assert out.attentions[0].shape[-1] == 1 + 4 + 16
    grid = patch_map(out.attentions[0], cfg)
    assert grid.shape[-2:] == (4, 4) and torch.allclose(grid.sum((-2, -1)), torch.tensor(1.0))
    for c in (cfg, tiny(num_reg_tokens=4, pos_embed_prefix=False)):
        sd = perturbed(vitkit.create_model(c)).state_dict()
        new_cfg, new_sd = adapt(c, sd, image_size=48)
        assert new_sd["pos_embed"].shape[1] == c.num_pos_prefix + 36
        assert torch.equal(
            new_sd["pos_embed"][:, : c.num_pos_prefix], sd["pos_embed"][:, : c.num_pos_prefix]
        )
        vitkit.create_model(new_cfg).load_state_dict(new_sd)


@pytest.mark.parametrize("fmt", ["npz", "hf"])
def test_formats_that_cannot_hold_a_switch_refuse_it(tmp_path, fmt):
    # (Hugging Face holds CLIP's switches in CLIPVisionModel, not q/k norm)
    switch = "qk_norm" if fmt == "hf" else "norm_pre"
    cfg = tiny(**SWITCHES["qk-norm" if fmt == "hf" else "clip"])
    ckpt = Checkpoint(
        Path("mem"),
        cfg,
        PreprocessConfig.for_model(cfg),
        dict(vitkit.create_model(cfg).state_dict()),
    )
    with pytest.raises(VitkitError, match=switch):
        write_checkpoint(ckpt, tmp_path / ("out.npz" if fmt == "npz" else "out"), fmt)


@pytest.mark.parametrize(
    "arch",
    [
        "vit_base_patch16_clip_quickgelu_224",
        "vit_small_patch14_reg4_dinov2",
        "deit3_small_patch16_224",
    ],
)
def test_a_timm_folder_without_model_args_is_read_from_its_model_name(tmp_path, arch):
    """Hub folders name the architecture; heads (width 32: not a table size) are given."""
    timm = import_reference("timm")
    small = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
    ref = perturbed(timm.create_model(arch, **small, mlp_ratio=2.0))
    (tmp_path / "hub").mkdir()
    save_file(ref.state_dict(), tmp_path / "hub" / "model.safetensors")
    hub = {"architecture": arch, "num_classes": 5, "global_pool": ref.global_pool}
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    model = vitkit.load(tmp_path / "hub", num_heads=4)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(x) - ref(x)).abs().max().item()
    assert diff <= 1e-5, diff
