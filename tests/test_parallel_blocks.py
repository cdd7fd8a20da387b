"""Parallel blocks and differential attention (vitkit.models.parallel_blocks): exact counts, logits
equal to live timm models with the same blocks in float64, both converter directions, bitwise
round trips, and a one-line refusal for what vitkit does not have."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.checkpoints.description import format_description
from vitkit.checkpoints.formats import describe
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_flops, count_params
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

BASE = dict(image_size=32, patch_size=8, num_classes=5, width=32, depth=2, num_heads=4, mlp_dim=64)
# timm's registered models with these blocks use registers, GAP + fc_norm, no E_pos prefix rows
WEE = dict(pool="gap", fc_norm=True, num_reg_tokens=1, pos_embed_prefix=False)
# timm's vit_*_xp_*: RMSNorm everywhere (eps 1e-6), a norm before the blocks, no patch bias
XP = dict(layer_norm_eps=1e-6, norm_pre=True, patch_bias=False, pos_embed_prefix=False)

# (name, vitkit switches): each as the timm models that have it use it
SWITCHES = {
    "18x2": dict(parallel=2, layer_scale_init=1e-5),  # vit_small_patch16_18x2_224
    "pwee": dict(parallel_scaling=True, layer_scale_init=1e-5, **WEE),  # vit_pwee_*
    "scaling-no-qkv-bias": dict(parallel_scaling=True, qkv_bias=False, qk_norm=True),
    "xp": dict(parallel_scaling=True, qkv_bias=False, qk_norm=True, norm="rmsnorm", **XP),
    "dwee": dict(diff_attn=True, layer_scale_init=1e-5, **WEE),  # vit_dwee_*, vit_dlittle_*
    "dpwee": dict(parallel_scaling=True, diff_attn=True, layer_scale_init=1e-5, **WEE),
    "diff-qk-norm": dict(diff_attn=True, qk_norm=True, qkv_bias=False),
    "18x2-diff": dict(parallel=2, diff_attn=True, layer_scale_init=1e-5),
}


def tiny(**kw) -> ViTConfig:
    return ViTConfig(**{**BASE, "gelu": "none", **kw})


def timm_model(timm, cfg: ViTConfig) -> torch.nn.Module:
    """timm's model of ``cfg`` as vitkit writes it: the named architecture + model_args."""
    args = timm_conv.timm_model_args(cfg)
    return timm.create_model(timm_conv.timm_architecture(cfg), **args)


@pytest.mark.parametrize("name", SWITCHES)
def test_counts_are_exact_and_equal_timms(name):
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES[name])
    model = vitkit.create_model(cfg).eval()
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    assert sum(p.numel() for p in timm_model(timm, cfg).parameters()) == count_params(cfg)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.forward_with_attentions(torch.randn(1, 3, 32, 32))
    assert counter.get_total_flops() == count_flops(cfg)


@pytest.mark.parametrize("name", SWITCHES)
def test_timm_logits_match_both_ways(tmp_path, name):
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES[name])
    ref = perturbed(timm_model(timm, cfg).double())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    # timm → vitkit: a bare state dict; its keys say which block it is
    save_file(ref.state_dict(), tmp_path / "timm.safetensors")
    ckpt = read_checkpoint(tmp_path / "timm.safetensors", num_heads=4)
    for k in ("parallel", "parallel_scaling", "diff_attn", "qkv_bias", "qk_norm", "mlp_dim"):
        assert getattr(ckpt.model_config, k) == getattr(cfg, k), k
    model = vitkit.create_model(ckpt.model_config).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.eval()
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max().item() <= 1e-12 * ref(x).abs().max().item()
        # the explicit path (analysis) computes the same, with [B, heads, T, T] weights
        out = model.forward_with_attentions(x)
    assert (out.logits - ref(x)).abs().max().item() <= 1e-12 * ref(x).abs().max().item()
    assert out.attentions[0].shape == (2, 4, cfg.seq_len, cfg.seq_len)
    # vitkit → timm folder → vitkit: the same config, bitwise the same tensors; timm runs it
    model = model.float()  # a checkpoint holds float32: both sides then run its weights
    ours = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    write_checkpoint(ours, tmp_path / "folder", "timm")
    back = read_checkpoint(tmp_path / "folder")
    assert back.model_config == cfg.replace(pos_resample="bicubic-antialias")  # timm's kernel
    family = format_description(describe(back)).split("family:")[1].split("\n")[0]
    assert ("differential attention" in family) == cfg.diff_attn
    assert ("parallel" in family) == (cfg.parallel > 1 or cfg.parallel_scaling)
    assert back.state_dict.keys() == ours.state_dict.keys()
    assert all(torch.equal(back.state_dict[k], v) for k, v in ours.state_dict.items())
    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}", pretrained=True).double()
    with torch.no_grad():
        assert (again.eval()(x) - model.double()(x)).abs().max().item() <= 1e-12


def test_the_switches_default_to_the_papers_block_and_refuse_what_no_block_has():
    d = tiny().to_dict()
    assert (d["parallel"], d["parallel_scaling"], d["diff_attn"]) == (1, False, False)
    old = {k: v for k, v in d.items() if k not in ("parallel", "parallel_scaling", "diff_attn")}
    assert ViTConfig.from_dict(old) == tiny() and tiny().family_switches == {}
    cfg = tiny(**SWITCHES["dpwee"])
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.family_switches["parallel_scaling"] is True
    for bad, match in (
        (dict(parallel=0), "parallel"),
        (dict(parallel=2, parallel_scaling=True), "parallel=1"),
        (dict(parallel_scaling=True, mlp="swiglu"), "GELU MLP"),
        (dict(diff_attn=True, width=24, num_heads=8), "odd"),
    ):
        with pytest.raises(VitkitError, match=match):
            tiny(**bad)


def test_what_timm_cannot_build_or_vitkit_cannot_read_is_one_line_and_xp_reads(tmp_path):
    for cfg, match in ((tiny(parallel=3), "2 branches"), (tiny(parallel=2), "layer scale")):
        sd = vitkit.create_model(cfg).state_dict()
        ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd)
        with pytest.raises(VitkitError, match=match):
            write_checkpoint(ckpt, tmp_path / "folder", "timm")
    timm = import_reference("timm")
    small = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
    # timm's DiffAttention(dual_lambda=True): two scalars, not the paper's
    sd = dict(timm_model(timm, tiny(**SWITCHES["dwee"])).state_dict())
    sd["blocks.0.attn.lambda_a"] = sd.pop("blocks.0.attn.lambda_q1")
    save_file(sd, tmp_path / "bad.safetensors")
    with pytest.raises(VitkitError, match="dual_lambda") as e:
        read_checkpoint(tmp_path / "bad.safetensors", num_heads=4)
    assert "\n" not in str(e.value) and "bad.safetensors" in str(e.value)
    # timm's own vit_*_xp_* entry (ParallelScalingBlock with RMSNorm everywhere) is read exactly
    ref = perturbed(timm.create_model("vit_base_patch16_xp_224", **small).double()).eval()
    save_file(ref.state_dict(), tmp_path / "xp.safetensors")
    ckpt = read_checkpoint(tmp_path / "xp.safetensors", num_heads=4)
    assert (ckpt.model_config.norm, ckpt.model_config.layer_norm_eps) == ("rmsnorm", 1e-6)
    model = vitkit.create_model(ckpt.model_config).double().eval()
    model.load_state_dict(ckpt.state_dict, strict=True)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max().item() <= 1e-12 * ref(x).abs().max().item()


@pytest.mark.parametrize("fmt", ["npz", "hf"])
def test_formats_without_parallel_blocks_refuse_them_by_name(tmp_path, fmt):
    cfg = tiny(**SWITCHES["18x2"])
    sd = vitkit.create_model(cfg).state_dict()
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd)
    with pytest.raises(VitkitError, match="parallel"):
        write_checkpoint(ckpt, tmp_path / ("out.npz" if fmt == "npz" else "out"), fmt)


@pytest.mark.parametrize("name", ["pwee", "dwee", "dpwee", "18x2-diff"])
def test_the_fused_path_equals_the_explicit_one_gradients_included(name):
    model = perturbed(vitkit.create_model(tiny(**SWITCHES[name])).double())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, requires_grad=True)
    fused = model(x)
    (grad_fused,) = torch.autograd.grad(fused.square().sum(), x)
    explicit = model.forward_with_attentions(x).logits
    (grad_explicit,) = torch.autograd.grad(explicit.square().sum(), x)
    assert torch.allclose(fused, explicit, rtol=0, atol=1e-12)
    assert torch.allclose(grad_fused, grad_explicit, rtol=0, atol=1e-12)


def test_parallel_blocks_train_and_are_deterministic_in_eval():
    cfg = tiny(**SWITCHES["dpwee"], drop_path=0.1, dropout=0.1)
    model = vitkit.create_model(cfg)
    x = torch.randn(2, 3, 32, 32)
    model.train()
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


@pytest.mark.parametrize("later", [{"norm": "rmsnorm"}, {"proj_bias": False}, {"block": "post"}])
def test_parallel_blocks_refuse_the_switches_they_do_not_read(later: dict) -> None:
    base = dict(image_size=8, patch_size=4, width=32, depth=1, num_heads=2, mlp_dim=64)
    kinds = [dict(parallel=2), dict(diff_attn=True), dict(parallel_scaling=True, diff_attn=True)]
    if later != {"norm": "rmsnorm"}:  # (ParallelScalingBlock with RMSNorm: timm's vit_*_xp_*)
        kinds.append(dict(parallel_scaling=True))
    for kind in kinds:
        with pytest.raises(VitkitError, match="parallel blocks and diff_attn do not read"):
            ViTConfig(**base, **kind, **later)
    ViTConfig(**base, **later)  # fine on the paper's block
