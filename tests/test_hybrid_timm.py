"""The paper's hybrids and timm: timm's ResNet numerics (``resnet_eps="timm"``) on reading, and
writing hybrids in timm's layout (``patch_embed.backbone.*``), loaded by live timm models."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from references import import_reference
from safetensors.torch import save_file

import vitkit
from vitkit.checkpoints import Checkpoint, load_model, read_checkpoint, write_checkpoint
from vitkit.errors import VitkitError
from vitkit.models.vit import build_model
from vitkit.registry.model_config import PreprocessConfig

# (stages, timm name): root only (R+Ti/16's layout) and R50 (vit_base_r50_s16_384's layout)
HYBRIDS = [((), "vit_tiny_r_s16_p8_224"), ((3, 4, 9), "vit_base_r50_s16_384")]


def perturbed(model: torch.nn.Module, scale: float = 0.02) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return model.eval()


def ours(layers: tuple[int, ...], **kw) -> torch.nn.Module:
    patch = 8 if not layers else 1
    size = 32 if not layers else 64
    model = vitkit.create_model(
        "Ti/16",
        **{
            "image_size": size,
            "patch_size": patch,
            "resnet_layers": layers,
            "width": 64,
            "depth": 2,
            "num_heads": 4,
            "mlp_dim": 128,
            "num_classes": 5,
            "gelu": "none",
            **kw,
        },
    )
    return perturbed(model)


def as_ckpt(model: torch.nn.Module) -> Checkpoint:
    cfg = model.cfg
    return Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))


@pytest.mark.parametrize("layers,name", HYBRIDS, ids=["root-only", "r50"])
def test_timm_hybrid_reads_with_timms_numerics_exactly_in_float64(tmp_path, layers, name):
    timm = import_reference("timm")
    size = 32 if not layers else 64
    small = dict(embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0)
    ref = timm.create_model(name, img_size=size, num_classes=5, **small).double()
    ref = perturbed(ref)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "h.st"))
    (tmp_path / "h.st").rename(tmp_path / "h.safetensors")
    ckpt = read_checkpoint(tmp_path / "h.safetensors", num_heads=4)
    assert ckpt.model_config.resnet_eps == "timm" and ckpt.model_config.resnet_layers == layers
    model = build_model(ckpt.model_config).double().eval()
    model.load_state_dict(ckpt.state_dict)
    x = torch.randn(
        2, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    with torch.no_grad():
        want = ref(x)
        err = (model(x) - want).abs().max().item() / want.abs().max().item()
        assert err <= 1e-12, err
        official = build_model(ckpt.model_config.replace(resnet_eps="vit_jax")).double().eval()
        official.load_state_dict(ckpt.state_dict)
        assert (official(x) - want).abs().max().item() > 1e-9  # the switch is what matches


@pytest.mark.parametrize("layers,name", HYBRIDS, ids=["root-only", "r50"])
def test_hybrid_written_in_timms_layout_loads_in_timm(tmp_path, layers, name):
    timm = import_reference("timm")
    model = ours(layers, resnet_eps="timm")
    write_checkpoint(as_ckpt(model), tmp_path / "timm", "timm")
    hub = json.loads((tmp_path / "timm" / "config.json").read_text())
    assert hub["architecture"] == name.replace("_384", "_224")
    ref = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    x = torch.randn(2, 3, *model.cfg.image_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ref(x) - model(x)).abs().max().item() <= 1e-5
    back = read_checkpoint(tmp_path / "timm")
    assert back.model_config == model.cfg.replace(pos_resample="bicubic-antialias")
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict[k], v), k
    # a state dict alone loads into timm's registered model of the same stages
    write_checkpoint(as_ckpt(model), tmp_path / "h.safetensors", "timm")
    model2, _ = load_model(tmp_path / "h.safetensors", num_heads=4)
    with torch.no_grad():
        assert torch.equal(model2(x), model(x))


def test_writing_an_official_hybrid_to_timm_warns_about_the_epsilons(tmp_path):
    model = ours((), resnet_eps="vit_jax")
    with pytest.warns(UserWarning, match=r"sqrt\(var \+ 1e-8\)"):
        write_checkpoint(as_ckpt(model), tmp_path / "timm", "timm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_checkpoint(as_ckpt(ours((), resnet_eps="timm")), tmp_path / "t2", "timm")


def test_hybrids_timm_cannot_build_are_refused(tmp_path):
    with pytest.raises(VitkitError, match=r"timm registers hybrids .* \(1, 1\) x1"):
        write_checkpoint(as_ckpt(ours((1, 1), resnet_eps="timm")), tmp_path / "a", "timm")
    narrow = ours((), resnet_eps="timm", resnet_width_factor=0.25)
    with pytest.raises(VitkitError, match="32 groups; this one's root is 16"):
        write_checkpoint(as_ckpt(narrow), tmp_path / "b.safetensors", "timm")


def test_resnet_eps_is_checked_and_old_configs_keep_the_official_numerics():
    with pytest.raises(VitkitError, match="resnet_eps must be one of"):
        vitkit.create_model("r50_vit_b16", resnet_eps="flax")
    assert vitkit.model_config("r50_vit_b16").resnet_eps == "vit_jax"


def test_npz_and_hugging_face_say_what_they_cannot_hold_of_a_timm_hybrid(tmp_path):
    model = ours((), resnet_eps="timm")
    with pytest.warns(UserWarning, match="timm's ResNet epsilons"):
        write_checkpoint(as_ckpt(model), tmp_path / "h.npz", "npz")
    assert read_checkpoint(tmp_path / "h.npz").model_config.resnet_eps == "vit_jax"
    with pytest.raises(VitkitError, match="removed ViTHybrid"):
        write_checkpoint(as_ckpt(model), tmp_path / "hf", "hf")
