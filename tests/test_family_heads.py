"""The family's heads: SigLIP's attention-pooling MAP head (``pool="map"``), a model without a
final norm (``final_norm=False``) and DeiT's two training outputs (``forward_heads``). Exact
counts, and logits equal to live timm models with the same switches (float64), both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_flops, count_params
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

BASE = dict(image_size=32, patch_size=8, num_classes=5, width=32, depth=2, num_heads=4, mlp_dim=64)

SWITCHES = {
    # timm's vit_base_patch16_siglip_224 built small: no class token, MAP head, exact GELU
    "siglip-map": dict(pool="map"),
    # vit_base_patch32_siglip_256 / so400m_patch16: tanh GELU (act_layer="gelu_tanh")
    "siglip-map-tanh": dict(pool="map", gelu="tanh"),
    "map-regs": dict(pool="map", num_reg_tokens=4),  # vit_so150m_patch16_reg4_map_256
    "no-final-norm": dict(final_norm=False),  # vit_intern300m_patch14_448
    # C-RADIOv3: registers, E_pos over the patches only, layer scale, no final norm
    "radio": dict(
        final_norm=False, num_reg_tokens=3, pos_embed_prefix=False, layer_scale_init=1e-5
    ),
}


def tiny(**kw) -> ViTConfig:
    return ViTConfig(**{**BASE, "gelu": "none", **kw})


def images(n: int = 2, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=dtype)


def timm_model(cfg: ViTConfig) -> torch.nn.Module:
    timm = import_reference("timm")
    args = timm_conv.timm_model_args(cfg)
    return perturbed(timm.create_model(timm_conv.timm_architecture(cfg), **args).double())


@pytest.mark.parametrize("name", SWITCHES)
def test_counts_are_exact_and_equal_timms(name):
    cfg = tiny(**SWITCHES[name])
    model = vitkit.create_model(cfg).eval()
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    assert sum(p.numel() for p in timm_model(cfg).parameters()) == count_params(cfg)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.forward_with_attentions(torch.randn(1, 3, 32, 32))
    assert counter.get_total_flops() == count_flops(cfg)


@pytest.mark.parametrize("name", SWITCHES)
def test_timm_logits_match_both_ways(tmp_path, name):
    timm = import_reference("timm")
    cfg = tiny(**SWITCHES[name])
    ref = timm_model(cfg)
    x = images()
    save_file(ref.state_dict(), tmp_path / "timm.safetensors")
    ckpt = read_checkpoint(tmp_path / "timm.safetensors", num_heads=4)
    for k in ("pool", "final_norm", "num_reg_tokens", "pos_embed_prefix", "class_token"):
        assert getattr(ckpt.model_config, k) == getattr(cfg, k), k
    model = vitkit.create_model(ckpt.model_config.replace(gelu=cfg.gelu)).double()
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.eval()
    with torch.no_grad():
        diff = (model(x) - ref(x)).abs().max().item()
        features = (model.forward_head(model.forward_features(x), pre_logits=True)).abs().max()
        assert features > 0.1  # the pooled features are not degenerate
    assert diff <= 1e-12, diff
    # vitkit → timm: written as a timm folder, read back bitwise, and run by timm itself
    ours = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    write_checkpoint(ours, tmp_path / "folder", "timm")
    back = read_checkpoint(tmp_path / "folder")
    assert back.model_config == cfg.replace(pos_resample="bicubic-antialias")  # timm's kernel
    assert all(torch.equal(back.state_dict[k], v) for k, v in model.state_dict().items())
    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}", pretrained=True).eval()
    with torch.no_grad():  # timm builds float32 weights: compare there
        diff = (again(x.float()) - model.float()(x.float())).abs().max().item()
    assert diff <= 1e-5, diff


def test_map_head_attention_is_the_pooling():
    """The MAP probe's attention sums to one over the patch tokens (registers left out), and
    the logits of forward_with_attentions are forward's."""
    cfg = tiny(pool="map", num_reg_tokens=2)
    model = perturbed(vitkit.create_model(cfg))
    x = images(3, torch.float32)
    with torch.no_grad():
        out = model.forward_with_attentions(x)
        assert torch.allclose(out.logits, model(x), atol=1e-5)
    assert out.pool_attention is not None
    assert out.pool_attention.shape == (3, 4, cfg.num_patches)
    assert torch.allclose(out.pool_attention.sum(-1), torch.ones(3, 4))
    assert vitkit.create_model(tiny()).forward_with_attentions(x).pool_attention is None


def test_deit_training_outputs_equal_timms_distilled_training():
    """forward_heads = timm's VisionTransformerDistilled with set_distilled_training(True) in
    train mode; forward still averages the two (what the Trainer and eval use)."""
    cfg = tiny(dist_token=True)
    ref = timm_model(cfg)
    model = vitkit.create_model(cfg).double()
    model.load_state_dict(timm_conv.timm_to_state_dict(ref.state_dict(), cfg), strict=True)
    ref.set_distilled_training(True)
    ref.train()
    model.train()
    x = images()
    with torch.no_grad():
        cls_ref, dist_ref = ref(x)
        cls, dist = model.forward_heads(x)
        assert (cls - cls_ref).abs().max() <= 1e-12 and (dist - dist_ref).abs().max() <= 1e-12
        assert (cls - dist).abs().max() > 1e-3  # two different heads
        assert torch.allclose(model(x), (cls + dist) / 2, rtol=0, atol=1e-12)
    with pytest.raises(VitkitError, match="dist_token"):
        vitkit.create_model(tiny()).forward_heads(x.float())


def test_a_timm_siglip_folder_reads_its_map_head(tmp_path):
    """A hub folder naming vit_base_patch16_siglip_224 (no model_args, only global_pool)."""
    timm = import_reference("timm")
    small = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
    ref = perturbed(timm.create_model("vit_base_patch16_siglip_224", **small, mlp_ratio=2.0))
    (tmp_path / "hub").mkdir()
    save_file(ref.state_dict(), tmp_path / "hub" / "model.safetensors")
    hub = {"architecture": "vit_base_patch16_siglip_224", "num_classes": 5, "global_pool": "map"}
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    model = vitkit.load(tmp_path / "hub", num_heads=4)
    x = images(2, torch.float32)
    with torch.no_grad():
        diff = (model(x) - ref(x)).abs().max().item()
    assert diff <= 1e-5, diff
    hub["global_pool"] = "avg"
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    with pytest.raises(VitkitError, match="MAP head"):
        vitkit.load(tmp_path / "hub", num_heads=4)


def test_bad_map_heads_and_switch_combinations_are_refused(tmp_path):
    sd = perturbed(vitkit.create_model(tiny(pool="map"))).state_dict()
    odd = {k: v for k, v in sd.items() if k != "attn_pool.q.weight"}
    save_file(odd, tmp_path / "odd.safetensors")
    with pytest.raises(VitkitError, match=r"odd.safetensors: .*attn_pool.q.weight"):
        read_checkpoint(tmp_path / "odd.safetensors", num_heads=4)
    two = {**sd, "attn_pool.latent": torch.zeros(1, 2, 32)}
    save_file(two, tmp_path / "two.safetensors")
    with pytest.raises(VitkitError, match="2 probes"):
        read_checkpoint(tmp_path / "two.safetensors", num_heads=4)
    with pytest.raises(VitkitError, match="swiglu"):
        tiny(pool="map", mlp="swiglu")
    with pytest.raises(VitkitError, match="final_norm=False"):
        tiny(pool="gap", fc_norm=True, final_norm=False)
    with pytest.raises(VitkitError, match="final_norm"):
        ViTConfig.from_dict({**tiny().to_dict(), "final_norm": "no"})


def test_the_map_probe_gets_no_weight_decay_and_prefix_pooling_is_refused(tmp_path):
    from vitkit.train.optim import param_groups

    model = vitkit.create_model(tiny(pool="map"))
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in param_groups(model, 0.1)[0]["params"]}
    assert "attn_pool.latent" not in decayed and "attn_pool.kv.weight" in decayed
    sd = model.state_dict()
    (tmp_path / "hub").mkdir()
    save_file(sd, tmp_path / "hub" / "model.safetensors")
    args = {"global_pool": "map", "pool_include_prefix": True, "num_heads": 4}
    hub = {"architecture": "test_vit3", "model_args": args}
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    with pytest.raises(VitkitError, match="hub: pool_include_prefix=True"):
        read_checkpoint(tmp_path / "hub")
