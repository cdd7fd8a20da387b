"""Rotary position embeddings (vitkit.models.rope) and timm eva.py (checkpoints.timm_eva): parity
against live timm in float64 per family and at a second input size, round trips, ONNX, bf16
autocast, and the refusals kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file

from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.checkpoints.native.safetensors_io import Checkpoint
from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

SMALL = {"img_size": (64, 64), "num_classes": 5, "depth": 2, "embed_dim": 64, "num_heads": 4}
DINO = dict(
    image_size=64, patch_size=16, width=64, depth=2, num_heads=4, mlp_dim=256, num_classes=5,
    rope="dinov3", rope_half=True, abs_pos_embed=False, num_reg_tokens=4, class_token=True,
    pool="gap", layer_scale_init=1e-5, layer_norm_eps=1e-5, gelu="none", k_bias=False,
)  # fmt: skip


EPS6 = {"layer_norm_eps": 1e-6}


def timm_folder(tmp_path, name: str, **extra):
    """A float64 timm ``name`` (small, random weights) and its save_for_hf folder."""
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    ref = perturbed(timm.create_model(name, **SMALL, **extra).double())
    save_for_hf(ref, str(tmp_path / name), safe_serialization=True)
    return ref, tmp_path / name


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def ours(ckpt: Checkpoint) -> VisionTransformer:
    model = VisionTransformer(ckpt.model_config).double().eval()
    model.load_state_dict(ckpt.state_dict, strict=True)
    return model


NAMES = [
    "vit_small_patch16_dinov3",  # no qkv bias
    "vit_small_patch16_dinov3_qkvb",  # q / v biases
    "vit_huge_plus_patch16_dinov3",  # SwiGLU (fc1_g / fc1_x), 20 heads at native width
    "vit_small_patch16_lingbot",  # DINOv3's RoPE, class-token pooling
    "vit_small_patch16_rope_224",  # RoPE-ViT axial
    "vit_small_patch16_rope_ape_224",  # + E_pos on the patches
    "vit_small_patch16_rope_mixed_224",  # learned frequencies
    "vit_small_patch16_rope_mixed_ape_224",
    "vit_medium_patch16_rope_reg1_gap_256",  # timm SBB: reference grid, no class token
]


@pytest.mark.parametrize("name", NAMES)
def test_timm_eva_folder_is_exact(tmp_path, name):
    dynamic = "dinov3" in name or "lingbot" in name  # timm's dynamic_img_size entries
    ref, folder = timm_folder(tmp_path, name)
    model = ours(read_checkpoint(folder))
    sizes = [(64, 64), (48, 80)] if dynamic else [(64, 64)]
    for size in sizes:  # RoPE follows the input's grid, as timm's dynamic_img_size
        x = torch.randn(2, 3, *size, dtype=torch.float64)
        with torch.no_grad():
            want = ref(x)
            assert rel(model(x), want) <= 1e-12, size
            assert rel(model.forward_with_attentions(x).logits, want) <= 1e-12


def test_second_size_of_a_fixed_size_entry(tmp_path):
    """RoPE-ViT axial at another size equals timm's with dynamic_img_size to float32 rounding of
    the sin / cos table: timm's dynamic path takes the angles in float64 and rounds sin / cos to
    float32, its registered fixed-size entries (and vitkit) take them in float32."""
    ref, folder = timm_folder(tmp_path, "vit_small_patch16_rope_224", dynamic_img_size=True)
    model = ours(read_checkpoint(folder))
    x = torch.randn(2, 3, 48, 80, dtype=torch.float64)
    with torch.no_grad():
        assert rel(model(x), ref(x)) <= 1e-8
        assert rel(model.float()(x.float()), ref.float()(x.float())) <= 1e-5


def as_ckpt(model: VisionTransformer) -> Checkpoint:
    cfg = model.cfg
    return Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"mlp": "swiglu"},
        {"rope": "mixed", "rope_half": False, "rope_xy": True, "layer_norm_eps": 1e-6},
    ],
    ids=["dinov3", "swiglu", "mixed"],
)
def test_round_trip_through_a_timm_folder(tmp_path, extra):
    timm = import_reference("timm")
    model = perturbed(VisionTransformer(ViTConfig(**{**DINO, **extra})).double())
    write_checkpoint(as_ckpt(model), tmp_path / "f", "timm")
    back = read_checkpoint(tmp_path / "f")
    assert back.model_config == model.cfg
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict[k], v), k
    ref = timm.create_model(f"local-dir:{tmp_path / 'f'}").double().eval()
    ref.load_state_dict(load_file(tmp_path / "f" / "model.safetensors"))  # float64 as written
    x = torch.randn(2, 3, 48, 80, dtype=torch.float64)
    with torch.no_grad():
        assert rel(model(x), ref(x)) <= 1e-12


def test_config_checks_and_writers_refuse():
    with pytest.raises(VitkitError, match="divisible by 4"):
        ViTConfig(width=36, num_heads=6, rope="dinov3")
    with pytest.raises(VitkitError, match="k_bias=False"):
        ViTConfig(qkv_bias=False, k_bias=False)
    with pytest.raises(VitkitError, match="parallel"):
        ViTConfig(rope="axial", parallel=2)
    assert ViTConfig(**DINO).family_switches["rope"] == "dinov3"


def test_paper_vit_unchanged():
    cfg = ViTConfig(width=64, depth=1, num_heads=4, mlp_dim=128, image_size=32, patch_size=8)
    model = VisionTransformer(cfg)
    assert model.rope is None and model.pos_embed is not None
    assert not any("bias" in k and "q_" in k for k in model.state_dict())


def test_bare_eva_state_dict_is_refused(tmp_path):
    model = VisionTransformer(ViTConfig(**DINO))
    sd = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v
          for k, v in model.state_dict().items()}  # fmt: skip
    save_file(sd, tmp_path / "w.safetensors")
    with pytest.raises(VitkitError, match="eva.py"):
        read_checkpoint(tmp_path / "w.safetensors", num_heads=4)
    with pytest.raises(VitkitError, match="rotary embedding; write a timm folder"):
        write_checkpoint(as_ckpt(model), tmp_path / "o.safetensors", "timm")


def test_an_unknown_eva_like_name_is_refused(tmp_path):
    _, folder = timm_folder(tmp_path, "vit_small_patch16_rope_224")
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = "vit_small_patch16_rope_999"  # not a timm 1.0.31 entry
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(VitkitError, match="not one of the timm ViTs vitkit reads"):
        read_checkpoint(folder)


def test_onnx_and_bf16_autocast(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.engines.onnx_export import check_onnx, export_onnx

    model = perturbed(VisionTransformer(ViTConfig(**DINO)))
    path = export_onnx(model, tmp_path / "m.onnx")
    assert check_onnx(model, path) <= 1e-4
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(x)
    assert low.dtype == torch.bfloat16
    assert (low.float() - model(x)).abs().max() <= 0.05 * model(x).abs().max()


@pytest.mark.parametrize(
    "name", ["vit_small_patch16_dinov3_qkvb", "vit_small_patch16_rope_mixed_224"]
)
def test_counts_and_family_name_match_timm(tmp_path, name):
    from vitkit.checkpoints.description import family_name
    from vitkit.registry.counts import count_params

    ref, folder = timm_folder(tmp_path, name)
    cfg = read_checkpoint(folder).model_config
    n = sum(p.numel() for p in ref.parameters())
    assert count_params(cfg) == n == sum(p.numel() for p in VisionTransformer(cfg).parameters())
    assert family_name(cfg).startswith("DINOv3" if "dinov3" in name else "RoPE-ViT (mixed)")


def test_analyze_a_model_without_learned_position_embeddings(tmp_path):
    """A DINOv3-style model (rotary only, no E_pos): the analysis says why Figure 7's centre
    panel is absent instead of stopping, and still writes its report."""
    import vitkit
    from vitkit.analysis import analyze_model

    model = vitkit.create_model(
        "Ti/4",
        image_size=16,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        num_classes=3,
        rope="dinov3",
        rope_half=True,
        abs_pos_embed=False,
    ).eval()
    result = analyze_model(model, tmp_path / "a")
    assert "position_similarity" not in result.numbers
    (section,) = [s for s in result.sections if s.title == "Position embedding similarity"]
    assert "has nothing to show" in str(section.items[0])
