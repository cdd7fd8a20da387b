"""timm eva.py's EVA-02, EVA-1 giant, Perception Encoder and Sapiens2 entries
(checkpoints.timm_eva): parity against live timm in float64 for every entry with its own
switches and tiny sizes, the folders real checkpoints have (no model_args), round trips, bare
state dicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file

from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.checkpoints.native.safetensors_io import Checkpoint
from vitkit.checkpoints.timm.names import EVA_NAMES, OTHER_MODULES
from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

NAMES = sorted(n for n in EVA_NAMES if n.startswith(("eva", "vit_pe_")) or "sapiens2" in n)


def small(name: str) -> dict:
    side = 56 if "patch14" in name else 64  # a 4 x 4 patch grid
    args = {"img_size": side, "num_classes": 5, "depth": 2, "embed_dim": 64, "num_heads": 4}
    if "sapiens2" in name:  # grouped-query attention: key / value heads per block
        args.update(depth=3, num_kv_heads=(4, 2, 1))
    return args


def timm_folder(tmp_path: Path, name: str, **args):
    """A float64 timm ``name`` (random weights moved off their init) and its save_for_hf
    folder."""
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    ref = perturbed(timm.create_model(name, **args).double())
    save_for_hf(ref, str(tmp_path / name), safe_serialization=True)
    return ref, tmp_path / name


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def ours(ckpt: Checkpoint) -> VisionTransformer:
    model = VisionTransformer(ckpt.model_config).double().eval()
    model.load_state_dict(ckpt.state_dict, strict=True)
    return model


def test_the_entries_read_are_the_ones_named():
    assert len(NAMES) == 33  # 12 EVA-02, 4 EVA-1 giants, 12 PE, 5 Sapiens2
    assert not OTHER_MODULES["eva"][1]


@pytest.mark.parametrize("name", NAMES)
def test_timm_entry_is_exact(tmp_path, name):
    args = small(name)
    ref, folder = timm_folder(tmp_path, name, **args)
    model = ours(read_checkpoint(folder))
    x = torch.randn(2, 3, args["img_size"], args["img_size"], dtype=torch.float64)
    with torch.no_grad():
        assert rel(model(x), ref(x)) <= 1e-12
        assert rel(model.forward_features(x), ref.forward_features(x)) <= 1e-12
        assert rel(model.forward_with_attentions(x).logits, ref(x)) <= 1e-12
    if "sapiens2" in name:  # timm's dynamic_img_size entry: RoPE follows the input's grid
        x = torch.randn(2, 3, 48, 80, dtype=torch.float64)
        with torch.no_grad():
            assert rel(model(x), ref(x)) <= 1e-12


@pytest.mark.parametrize(
    "name",
    ["eva02_tiny_patch14_224", "vit_pe_core_tiny_patch16_384", "vit_pe_spatial_tiny_patch16_512"],
)
def test_folder_without_model_args_reads_the_entry(tmp_path, name):
    """Hub folders name the entry only: heads, RoPE, the MAP head's 8 heads and the size come
    from the entry, the width table and E_pos."""
    side = 56 if "patch14" in name else 64
    ref, folder = timm_folder(tmp_path, name, depth=1, img_size=side, num_classes=3)
    config = json.loads((folder / "config.json").read_text())
    del config["model_args"]
    (folder / "config.json").write_text(json.dumps(config))
    ckpt = read_checkpoint(folder)
    assert ckpt.model_config.image_size == (side, side)
    x = torch.randn(2, 3, side, side, dtype=torch.float64)
    with torch.no_grad():
        assert rel(ours(ckpt)(x), ref(x)) <= 1e-12


def test_each_switch_matters(tmp_path):
    """The parity above can fail: PE's RoPE offset / reference grid, its MAP head over the
    class token and its 8 heads, EVA-02's reference grid each change the logits."""
    ref, folder = timm_folder(tmp_path, "vit_pe_core_tiny_patch16_384", **small("pe"))
    ckpt = read_checkpoint(folder)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        want = ref(x)
        for change in (
            {"rope_offset": 0.0},
            {"rope_ref_grid": None},
            {"map_prefix": False},
            {"map_heads": 4},
        ):
            model = VisionTransformer(ckpt.model_config.replace(**change)).double().eval()
            model.load_state_dict(ckpt.state_dict)
            assert rel(model(x), want) > 1e-6, change


ROUND_TRIPS = [
    "eva02_base_patch14_224",  # unfused q / k / v with q, v biases, SwiGLU sub-norm
    "eva02_large_patch14_clip_224",  # + the attention's sub-norm, class-token pooling
    "eva02_enormous_patch14_clip_224",  # post-norm, no RoPE
    "eva_giant_patch14_224",  # E_pos only, fc_norm
    "vit_pe_core_gigantic_patch14_448",  # MAP head: 8 heads, its own MLP width, no class token
    "vit_pe_core_small_patch16_384",  # MAP head over the class token
    "vit_pe_lang_large_patch14_448",  # no final norm, layer scale
    "vit_large_patch16_sapiens2",  # RMSNorm, grouped-query attention (unfused), attention-only
]  # layer scale


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_round_trip_through_a_timm_folder(tmp_path, name):
    timm = import_reference("timm")
    args = small(name)
    ref, folder = timm_folder(tmp_path, name, **args)
    ckpt = read_checkpoint(folder)
    write_checkpoint(ckpt, tmp_path / "out", "timm")
    back = read_checkpoint(tmp_path / "out")
    assert back.model_config == ckpt.model_config
    for k, v in ckpt.state_dict.items():
        assert torch.equal(back.state_dict[k], v), k
    again = timm.create_model(f"local-dir:{tmp_path / 'out'}").double().eval()
    again.load_state_dict(load_file(tmp_path / "out" / "model.safetensors"))
    x = torch.randn(2, 3, args["img_size"], args["img_size"], dtype=torch.float64)
    with torch.no_grad():
        assert rel(again(x), ref(x)) <= 1e-12


def test_sapiens2_folder_without_model_args_has_its_own_heads(tmp_path):
    """Sapiens2-H is 1280 wide with 16 heads (DINOv3 H+ of the same width has 20): the entry's
    family says which, and the key / value heads follow from the key projections."""
    name = "vit_huge_patch16_sapiens2"
    args = {"depth": 1, "img_size": 32, "num_classes": 3, "num_kv_heads": (8,)}
    ref, folder = timm_folder(tmp_path, name, **args)
    config = json.loads((folder / "config.json").read_text())
    del config["model_args"]
    (folder / "config.json").write_text(json.dumps(config))
    ckpt = read_checkpoint(folder)
    assert (ckpt.model_config.num_heads, ckpt.model_config.kv_heads) == (16, (8,))
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert rel(ours(ckpt)(x), ref(x)) <= 1e-12


def test_bad_eva_folders_are_refused(tmp_path):
    _, folder = timm_folder(tmp_path, "eva02_base_patch14_224", **small("patch14"))
    sd = load_file(folder / "model.safetensors")
    del sd["blocks.1.attn.k_proj.weight"]  # one of the three unfused projections missing
    save_file(sd, folder / "model.safetensors")
    with pytest.raises(VitkitError, match="not all three weights"):
        read_checkpoint(folder)
    _, folder = timm_folder(tmp_path, "vit_pe_core_tiny_patch16_384", **small("pe"))
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["global_pool"] = "avg"  # says no attention pool; the weights have one
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(VitkitError, match="attn_pool weights disagree"):
        read_checkpoint(folder)


def test_kv_heads_are_checked():
    with pytest.raises(VitkitError, match="one per block"):
        ViTConfig(depth=2, kv_heads=(4,))
    with pytest.raises(VitkitError, match="dividing num_heads"):
        ViTConfig(depth=2, num_heads=12, kv_heads=(5, 12))
    with pytest.raises(VitkitError, match="with k_bias"):
        ViTConfig(depth=1, kv_heads=(6,), k_bias=False)
    cfg = ViTConfig(depth=2, kv_heads=(6, 12), layer_scale_init=1.0, layer_scale_mlp=False)
    from vitkit.registry.counts import count_params

    assert count_params(cfg) == sum(p.numel() for p in VisionTransformer(cfg).parameters())


def test_map_head_fields_are_checked():
    with pytest.raises(VitkitError, match="MAP head"):
        ViTConfig(map_prefix=True)
    with pytest.raises(VitkitError, match="map_heads"):
        ViTConfig(pool="map", map_heads=5)
    cfg = ViTConfig(pool="map", class_token=True, map_heads=8, map_mlp_dim=100)
    assert cfg.family_switches["map_heads"] == 8
    from vitkit.registry.counts import count_params

    assert count_params(cfg) == sum(p.numel() for p in VisionTransformer(cfg).parameters())


def test_writer_refuses_a_map_head_that_skips_the_class_token(tmp_path):
    cfg = ViTConfig(
        image_size=32, patch_size=16, width=64, depth=1, num_heads=4, mlp_dim=128,
        pool="map", class_token=True, rope="axial", abs_pos_embed=False, gelu="none",
    )  # fmt: skip
    model = VisionTransformer(cfg)
    ckpt = Checkpoint(Path("m"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))
    with pytest.raises(VitkitError, match="no pool"):
        write_checkpoint(ckpt, tmp_path / "o", "timm")


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("eva02_base_patch14_224", "EVA-02"),
        ("vit_pe_core_gigantic_patch14_448", "Perception Encoder"),
        ("eva_giant_patch14_clip_224", "EVA"),
        ("vit_large_patch16_sapiens2", "Sapiens2"),
    ],
)
def test_counts_and_family_name_match_timm(tmp_path, name, family):
    from vitkit.checkpoints.description import family_name
    from vitkit.registry.counts import count_params

    ref, folder = timm_folder(tmp_path, name, **small(name))
    cfg = read_checkpoint(folder).model_config
    assert count_params(cfg) == sum(p.numel() for p in ref.parameters())
    assert family_name(cfg).startswith(f"{family} ")


def test_analysis_of_a_map_head_over_the_class_token(tmp_path):
    from vitkit.analysis.attention import pooled_row

    _, folder = timm_folder(tmp_path, "vit_pe_core_tiny_patch16_384", **small("pe"))
    model = ours(read_checkpoint(folder)).float()
    out = model.forward_with_attentions(torch.randn(1, 3, 64, 64))
    assert out.pool_attention is not None and out.pool_attention.shape == (1, 8, 17)
    row = pooled_row(out.attentions[-1], model.cfg, out.pool_attention)
    assert row.shape == (1, 4, 17) and torch.allclose(row.sum(-1), torch.ones(1, 4))


@pytest.mark.parametrize(
    ("name", "rope"),
    [
        ("eva02_base_patch14_224", "axial"),  # unfused q / k / v, sub-norm, fc_norm: GAP
        ("eva02_large_patch14_clip_224", "axial"),  # no fc_norm: the class token
        ("eva_giant_patch14_224", "none"),
        ("vit_pe_spatial_gigantic_patch14_448", "axial"),  # no class token: RoPE from (0, 0)
        ("vit_pe_lang_large_patch14_448", "axial"),  # class token: from (1, 1); layer scale
    ],
)
def test_bare_eva_layouts_are_read_saying_the_rope(tmp_path, name, rope):
    """A bare EVA-02 / EVA / PE file: the keys fix the family, the RoPE is said in one line,
    and stating it silences the line (and changes the numbers where the guess was wrong)."""
    import warnings

    from vitkit.errors import AssumptionWarning

    width, heads = (1408, 16) if "giant_" in name else (192, 3)  # timm's: the heads are known
    timm = import_reference("timm")
    args = {"depth": 1, "img_size": 28, "num_classes": 3, "embed_dim": width, "num_heads": heads}
    if "_pe_" in name:  # a checkpoint at its own size: PE's reference grid is its grid
        args["ref_feat_shape"] = 2
    ref = perturbed(timm.create_model(name, **args).double())
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    x = torch.randn(2, 3, 28, 28, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(path)
    said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    assert len(said) == 1  # one warning, a line a setting after its summary
    assert [s for s in said[0].splitlines()[1:] if s.startswith(f"  rope='{rope}' assumed")]
    with torch.no_grad():
        assert rel(ours(ckpt)(x), ref(x)) <= 1e-12
    if rope == "axial":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            told = read_checkpoint(path, overrides={"rope": "none"})
        assert not [w for w in caught if "rope=" in str(w.message)]
        with torch.no_grad():
            assert rel(ours(told)(x), ref(x)) > 1e-6


def test_bare_eva_block_is_said_where_no_entry_has_the_width(tmp_path):
    """EVA-02 enormous (post-norm) and the EVA-1 giant CLIP tower (pre-norm) have the same keys;
    only their widths tell them apart, so another width says the block it assumed."""
    import warnings

    from vitkit.errors import AssumptionWarning

    timm = import_reference("timm")
    args = {"depth": 1, "img_size": 28, "num_classes": 3, "embed_dim": 64, "num_heads": 4}
    ref = perturbed(timm.create_model("eva02_enormous_patch14_clip_224", **args).double())
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    x = torch.randn(2, 3, 28, 28, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guessed = read_checkpoint(path, num_heads=4)
    said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    assert [s for s in said if "block='pre' assumed" in s and "-o block=post" in s]
    told = read_checkpoint(path, num_heads=4, overrides={"block": "post"})
    with torch.no_grad():
        assert rel(ours(guessed)(x), ref(x)) > 1e-6
        assert rel(ours(told)(x), ref(x)) <= 1e-12


def test_bare_sapiens2_is_read_saying_its_rope(tmp_path):
    """RMSNorm with q / k / v apart, all biased: only Sapiens2's keys; its heads from its own
    width table, the key / value heads from the key projections, DINOv3's RoPE said."""
    import warnings

    from vitkit.errors import AssumptionWarning

    timm = import_reference("timm")
    args = {"depth": 1, "img_size": 32, "num_classes": 3, "num_kv_heads": (6,)}
    ref = perturbed(timm.create_model("vit_base_patch16_sapiens2", **args).double())
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(path)
    said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    assert [s for s in said if "rope='dinov3' assumed (Sapiens2" in s]
    assert (ckpt.model_config.num_heads, ckpt.model_config.kv_heads) == (12, (6,))
    x = torch.randn(2, 3, 48, 32, dtype=torch.float64)
    with torch.no_grad():
        assert rel(ours(ckpt)(x), ref(x)) <= 1e-12


@pytest.mark.parametrize(
    "extra",
    [
        {"kv_heads": (2, 4)},
        {"layer_scale_init": 0.5, "layer_scale_mlp": False},
        {"pool": "map", "map_heads": 2, "map_mlp_dim": 96},
        {"pool": "map", "class_token": True, "map_prefix": True},
    ],
    ids=["kv_heads", "ls_attn_only", "map_heads", "map_prefix"],
)
def test_new_switches_without_rope_are_written_as_timm_eva(tmp_path, extra):
    """Only timm's Eva holds these: a model with them (and no RoPE) is written as an eva.py
    folder timm computes the same, never as a VisionTransformer that cannot hold them."""
    timm = import_reference("timm")
    cfg = ViTConfig(
        image_size=32, patch_size=16, width=64, depth=2, num_heads=4, mlp_dim=128,
        num_classes=3, gelu="none", **extra,
    )  # fmt: skip
    model = perturbed(VisionTransformer(cfg).double())
    ckpt = Checkpoint(Path("m"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))
    write_checkpoint(ckpt, tmp_path / "out", "timm")
    assert read_checkpoint(tmp_path / "out").model_config == cfg.replace(
        class_token=cfg.has_class_token, pos_resample="bicubic-antialias"
    )
    ref = timm.create_model(f"local-dir:{tmp_path / 'out'}").double().eval()
    ref.load_state_dict(load_file(tmp_path / "out" / "model.safetensors"))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert rel(model(x), ref(x)) <= 1e-12


@pytest.mark.parametrize("name", ["vit_pe_core_tiny_patch16_384", "vit_base_patch16_sapiens2"])
def test_onnx_export(tmp_path, name):
    """The MAP head over the class token and grouped-query attention export with parity."""
    pytest.importorskip("onnxruntime")
    from vitkit.engines.onnx_export import check_onnx, export_onnx

    _, folder = timm_folder(tmp_path, name, **small(name))
    model = ours(read_checkpoint(folder)).float()
    assert check_onnx(model, export_onnx(model, tmp_path / "m.onnx")) <= 1e-4


def test_other_writers_refuse_what_only_timm_eva_holds(tmp_path):
    """Hugging Face's DINOv3 and BEiT cannot hold grouped-query attention or attention-only
    layer scale; NaFlex and relative-bias models never have them (refused as configs)."""
    base = dict(
        image_size=32, patch_size=16, width=64, depth=2, num_heads=4, mlp_dim=128, gelu="none",
        num_classes=0, layer_scale_init=1.0, pool="token",
    )  # fmt: skip
    dino = dict(rope="dinov3", rope_half=True, abs_pos_embed=False, layer_norm_eps=1e-5)
    for extra, says in [
        ({**dino, "kv_heads": (2, 4)}, "DINOv3ViTModel cannot hold kv_heads"),
        ({**dino, "layer_scale_mlp": False}, "DINOv3ViTModel cannot hold layer_scale_mlp=False"),
        ({"k_bias": False, "layer_scale_mlp": False}, "BEiT cannot hold layer_scale_mlp=False"),
    ]:
        cfg = ViTConfig(**{**base, **extra})
        model = VisionTransformer(cfg)
        ckpt = Checkpoint(Path("m"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
        with pytest.raises(VitkitError, match=says):
            write_checkpoint(ckpt, tmp_path / "hf", "hf")
    with pytest.raises(VitkitError, match="naflex .* does not combine with map_heads"):
        ViTConfig(naflex=True, pool="map", map_heads=4, pos_embed_prefix=False)
    with pytest.raises(VitkitError, match="relative position bias with kv_heads"):
        ViTConfig(rel_pos="bias", depth=1, kv_heads=(6,), abs_pos_embed=False)
