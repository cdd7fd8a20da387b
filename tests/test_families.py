"""The family's named models (vitkit.registry.families): every row's parameter count equals the same
timm model's (built on the meta device: no memory, no time), the names resolve wherever a model
name is taken, and ``vitkit models`` lists them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from references import import_reference

from vitkit.checkpoints.description import family_name
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_params
from vitkit.registry.families import FAMILIES, family_of
from vitkit.registry.model_config import ViTConfig, model_config

# one of each family and switch (every row was checked once; these keep it checked, fast)
CHECKED = (
    "deit_tiny_patch16_224",
    "deit_small_distilled_patch16_224",
    "deit3_medium_patch16_224",
    "vit_small_patch14_reg4_dinov2",
    "vit_giant_patch14_dinov2",
    "vit_base_patch32_clip_quickgelu_224",
    "vit_base_patch16_224.mae",
)


@pytest.mark.parametrize("name", CHECKED)
def test_count_equals_timm(name):
    timm = import_reference("timm")
    with torch.device("meta"):
        reference = timm.create_model(name)
    cfg = model_config(name)
    assert isinstance(cfg, ViTConfig)
    assert count_params(cfg) == sum(p.numel() for p in reference.parameters())
    assert cfg.num_classes == reference.num_classes
    assert cfg.image_size == tuple(reference.patch_embed.img_size)


# timm eva.py's rows (DINOv3, LingBot, RoPE-ViT, EVA-02, EVA, PE, Sapiens2): every one, on the
# meta device (~30 s in all)
EVA_FAMILIES = ("DINOv3", "LingBot", "RoPE-ViT", "EVA-02", "EVA", "PE", "Sapiens2")
ROPE_ROWS = [n for n in FAMILIES if family_of(n) in EVA_FAMILIES]


@pytest.mark.parametrize("name", ROPE_ROWS)
def test_rope_row_equals_timm_and_the_folder_reader(name):
    from vitkit.checkpoints.timm.eva import eva_hub_config_provenance

    timm = import_reference("timm")
    with torch.device("meta"):
        reference = timm.create_model(name, pretrained=False)
    cfg = model_config(name)
    assert isinstance(cfg, ViTConfig)
    assert count_params(cfg) == sum(p.numel() for p in reference.parameters())
    assert cfg.num_classes == reference.num_classes
    assert cfg.image_size == tuple(reference.patch_embed.img_size)
    # the same network vitkit reads from a timm folder naming this entry: every field, not
    # only the count (the count cannot see the RoPE kind, base, pairing or the pooling)
    hub = {"architecture": name, "model_args": {"img_size": list(cfg.image_size)}}
    read, _ = eva_hub_config_provenance(hub, reference.state_dict(), name, None)
    assert read == cfg  # heads too: timm's folders do not record them (LingBot-g: 24, not 16)


def test_rope_rows_are_every_eva_entry_vitkit_reads():
    from vitkit.checkpoints.timm.names import EVA_NAMES

    assert set(ROPE_ROWS) == EVA_NAMES
    assert len([n for n in ROPE_ROWS if family_of(n) == "DINOv3"]) == 12  # S S+ B L H+ 7B, Ti
    counts = {f: sum(family_of(n) == f for n in ROPE_ROWS) for f in EVA_FAMILIES[3:]}
    assert counts == {"EVA-02": 12, "EVA": 4, "PE": 12, "Sapiens2": 5}


def test_create_model_builds_a_named_rope_model():
    from vitkit import create_model

    with torch.device("meta"):
        model = create_model("vit_small_plus_patch16_dinov3_qkvb")
    assert sum(p.numel() for p in model.parameters()) == 28_692_480  # timm's
    tiny = create_model("vit_small_patch16_rope_mixed_224", depth=1, image_size=32, num_classes=3)
    assert tiny(torch.randn(2, 3, 32, 48)).shape == (2, 3)  # RoPE follows the input's grid


def test_built_model_has_the_counted_parameters():
    from vitkit.models.vit import build_model

    with torch.device("meta"):
        model = build_model(model_config("vit_small_patch14_reg4_dinov2"))
    assert sum(p.numel() for p in model.parameters()) == 22_057_344  # timm's


def test_overrides_and_families():
    cfg = model_config("deit3_small_patch16_224", num_classes=10, image_size=32)
    assert (cfg.num_classes, cfg.image_size, cfg.layer_scale_init) == (10, (32, 32), 1e-6)
    assert not cfg.pos_embed_prefix and cfg.gelu == "none"
    assert model_config("vit_base_patch16_clip_quickgelu_224").gelu == "quick"
    assert model_config("deit_tiny_distilled_patch16_224").dist_token
    families = {"DeiT", "DeiT-III", "DINOv2", "CLIP", "MAE", *EVA_FAMILIES}
    assert {family_of(n) for n in FAMILIES} == families
    with pytest.raises(VitkitError, match="unknown model 'deit3_tiny_patch16_224'"):
        model_config("deit3_tiny_patch16_224")


def test_models_command_lists_the_family(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "deit3_small_patch16_224" in out and "22,059,496" in out  # timm's count
    assert "vit_small_patch14_reg4_dinov2" in out and "22,057,344" in out
    assert "vit_base_patch16_224.mae" in out
    assert "vit_7b_patch16_dinov3                 DINOv3" in out and "6,716,030,976" in out
    assert "vit_small_patch16_lingbot" in out and "21,596,160" in out
    assert "vit_large_patch16_rope_mixed_ape_224  RoPE-ViT" in out and "304,399,336" in out


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("deit3_small_patch16_224", "DeiT-III S/16, layer scale 1e-06, 224 px"),
        ("deit3_huge_patch14_224", "DeiT-III H/14, layer scale 1e-06, 224 px"),
        ("deit_tiny_distilled_patch16_224", "DeiT (distilled) Ti/16, 224 px"),
        ("vit_small_patch14_dinov2", "DINOv2 S/14, layer scale 1e-05, 518 px"),
        (
            "vit_giant_patch14_reg4_dinov2",
            "DINOv2 ViT-w1536-d40-h24/14, 4 registers, SwiGLU MLP, layer scale 1e-05, 518 px",
        ),
        ("vit_base_patch16_clip_quickgelu_224", "CLIP tower B/16, quick GELU, 224 px"),
        (
            "vit_base_patch16_dinov3",
            "DINOv3 B/16, no qkv bias, 4 registers, layer scale 1e-05, gap pool, 256 px",
        ),
        (
            "vit_base_patch16_dinov3_qkvb",
            "DINOv3 B/16, q/v biases, 4 registers, layer scale 1e-05, gap pool, 256 px",
        ),
        (
            "vit_small_patch16_lingbot",
            "DINOv3 S/16, q/v biases, 4 registers, layer scale 1e-05, 512 px",
        ),
        (
            "vit_small_patch16_rope_ape_224",
            "RoPE-ViT (axial) S/16, E_pos + RoPE, layer scale 1e-05, 224 px",
        ),
        ("vit_large_patch16_rope_mixed_224", "RoPE-ViT (mixed) L/16, layer scale 1e-05, 224 px"),
        ("vit_base_patch16_224.mae", "ViT-B/16 (the paper's), 224 px"),
        ("B/32", "ViT-B/32 (the paper's), 224 px"),
        ("r50_vit_b16", "R(3,4,9)x1+ViT-B/16 (the paper's), 224 px"),
        # a size outside the table is named once, not "ViT-ViT-w32-..."
        ("vit_ti16", "ViT-Ti/16 (the paper's), 224 px"),
    ],
)
def test_family_name_from_the_switches(name, family):
    cfg = model_config(name)
    assert isinstance(cfg, ViTConfig)
    assert family_name(cfg) == family


def test_family_name_of_timm_gap_and_non_square():
    cfg = model_config("S/16", pool="gap", class_token=True, fc_norm=True, image_size=(224, 160))
    assert family_name(cfg) == "timm GAP ViT (fc_norm) S/16, gap pool + fc_norm, 224x160 px"


def test_family_name_of_sizes_outside_the_table():
    """The paper's layout at a size of no table row: "ViT-w32-d2-h2/4" once, not twice."""
    cfg = model_config("Ti/4", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=8)
    assert family_name(cfg) == "ViT-w32-d2-h2/4 (the paper's), 8 px"
    hybrid = model_config("r26_vit_s32", width=32, depth=2, num_heads=2, mlp_dim=64)
    assert family_name(hybrid).startswith("R(2,2,2,2)x1+ViT-w32-d2-h2/32 (the paper's)")


def test_inspect_names_the_family_of_a_timm_folder(tmp_path, capsys):
    from vitkit.checkpoints import Checkpoint, write_checkpoint
    from vitkit.models.vit import build_model
    from vitkit.registry.model_config import PreprocessConfig

    cfg = model_config("deit3_small_patch16_224", image_size=32, depth=1, num_classes=3)
    sd = {k: v + 0.01 for k, v in build_model(cfg).state_dict().items()}  # no zero head
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd)
    write_checkpoint(ckpt, tmp_path / "f", "timm")
    assert main(["inspect", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "family:      DeiT-III ViT-w384-d1-h6/16, layer scale 1e-06, 32 px" in out
    assert "switches:    layer_scale_init=1e-06, pos_embed_prefix=False" in out


def test_inspect_names_a_dinov3_timm_folder(tmp_path, capsys):
    cfg = model_config("vit_small_patch16_dinov3_qkvb", image_size=32, depth=1, num_classes=3)
    folder = _timm_folder(tmp_path, cfg)
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "family:      DINOv3 ViT-w384-d1-h6/16, q/v biases, 4 registers" in out


def _timm_folder(tmp_path: Path, cfg: ViTConfig) -> Path:
    from vitkit.checkpoints import Checkpoint, write_checkpoint
    from vitkit.models.vit import build_model
    from vitkit.registry.model_config import PreprocessConfig

    sd = {k: v + 0.01 for k, v in build_model(cfg).state_dict().items()}
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd)
    return write_checkpoint(ckpt, tmp_path / "f", "timm")


def test_timm_folder_grid_comes_from_its_img_size(tmp_path):
    # 3x3 patches + 4 registers without E_pos rows: 9 rows, and 9 - 5 = 4 is a square too
    cfg = model_config(
        "vit_small_patch14_reg4_dinov2", image_size=42, depth=1, width=32, num_heads=2, mlp_dim=64
    )
    from vitkit.checkpoints import read_checkpoint

    read = read_checkpoint(_timm_folder(tmp_path, cfg)).model_config
    assert read == cfg.replace(pos_resample="bicubic-antialias")  # (timm's kernel)


def test_a_refusal_names_the_folder_once(tmp_path):
    import json

    from vitkit.checkpoints import read_checkpoint

    cfg = model_config("B/16", depth=1, width=32, num_heads=2, mlp_dim=64)
    folder = _timm_folder(tmp_path, cfg)
    hub = json.loads((folder / "config.json").read_text())
    hub["model_args"]["pool_include_prefix"] = True  # (timm's test_vit3 sets it by name)
    (folder / "config.json").write_text(json.dumps(hub))
    with pytest.raises(VitkitError) as e:
        read_checkpoint(folder)
    assert str(e.value).count(str(folder)) == 1 and "pool_include_prefix" in str(e.value)
