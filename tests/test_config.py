"""The variant table, name parsing, config validation and serialisation, and the FLOP count."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_flops
from vitkit.registry.model_config import SIZES, STANDARD_MODELS, ViTConfig, model_config, parse_name

# Table 1 of Dosovitskiy et al. (B, L, H) and Steiner et al. (Ti, S):
# (hidden size D, layers, MLP size, heads). Written out here, not read from vitkit.
PAPER_SIZES = {
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "H": (1280, 32, 5120, 16),
}


def tiny(**changes) -> ViTConfig:
    base = dict(
        image_size=16, patch_size=4, width=24, depth=2, num_heads=3, mlp_dim=40, num_classes=5
    )
    base.update(changes)
    return ViTConfig(**base)


# ---------------------------------------------------------------------------- name parsing


@pytest.mark.parametrize(
    "name, size, patch",
    [
        ("B/16", "B", 16),
        ("vit_b16", "B", 16),
        ("vit-b/16", "B", 16),
        ("b16", "B", 16),
        ("Ti/16", "Ti", 16),
        ("vit_ti16", "Ti", 16),
        ("vit_h14", "H", 14),
        ("L/32", "L", 32),
        ("S/8", "S", 8),
    ],
)
def test_parse_name(name, size, patch):
    assert parse_name(name) == (size, patch)
    cfg = model_config(name)
    width, depth, mlp_dim, heads = PAPER_SIZES[size]
    assert (cfg.width, cfg.depth, cfg.mlp_dim, cfg.num_heads) == (width, depth, mlp_dim, heads)
    assert cfg.patch_size == (patch, patch)
    assert cfg.image_size == (224, 224)
    assert cfg.num_classes == 1000


def test_size_table_matches_the_papers():
    assert set(SIZES) == set(PAPER_SIZES)
    for name, (width, depth, mlp_dim, heads) in PAPER_SIZES.items():
        s = SIZES[name]
        assert (s.width, s.depth, s.mlp_dim, s.num_heads) == (width, depth, mlp_dim, heads), name


def test_standard_models_parse():
    for name in STANDARD_MODELS:
        size, patch = parse_name(name)
        assert f"{size}/{patch}" == name


@pytest.mark.parametrize("bad", ["vit_q16", "B16x", "resnet34", "vit_b", "B/", "/16", "vitb_16x"])
def test_bad_names_raise_naming_the_name(bad):
    with pytest.raises(VitkitError) as err:
        parse_name(bad)
    assert bad in str(err.value)
    with pytest.raises(VitkitError) as err:
        vitkit.create_model(bad)
    assert bad in str(err.value)


def test_empty_name_raises():
    with pytest.raises(VitkitError) as err:
        parse_name("")
    assert "''" in str(err.value) or '""' in str(err.value)


# ---------------------------------------------------------------------- overrides and validation


def test_model_config_overrides():
    cfg = model_config("B/16", depth=6, image_size=384, num_classes=10, pool="gap")
    assert cfg.depth == 6
    assert cfg.image_size == (384, 384)
    assert cfg.num_classes == 10
    assert cfg.pool == "gap"
    # Untouched fields keep the table's values.
    assert (cfg.width, cfg.mlp_dim, cfg.num_heads, cfg.patch_size) == (768, 3072, 12, (16, 16))
    assert cfg.grid_size == (24, 24)
    assert cfg.seq_len == 576  # no class token with gap
    # Overriding the patch size of a name works too, as does a non-square image.
    cfg = model_config("S/16", patch_size=(8, 16), image_size=(64, 96))
    assert cfg.patch_size == (8, 16) and cfg.image_size == (64, 96)
    assert cfg.grid_size == (8, 6) and cfg.num_patches == 48 and cfg.seq_len == 49


def test_unknown_overrides_are_named():
    with pytest.raises(VitkitError) as err:
        model_config("B/16", dept=6, colour_space="rgb")
    assert "dept" in str(err.value) and "colour_space" in str(err.value)


@pytest.mark.parametrize(
    "changes",
    [
        dict(image_size=225),  # not a multiple of 16
        dict(image_size=(224, 200)),  # width not a multiple of 16
        dict(patch_size=0),
        dict(image_size=(224, 224, 3)),
        dict(width=100),  # not divisible by 12 heads
        dict(pool="cls"),
        dict(gelu="exact"),
    ],
)
def test_invalid_configs_raise(changes):
    with pytest.raises(VitkitError):
        model_config("B/16", **changes)
    if changes.get("image_size") in (225, (224, 200)):
        # a loaded model may floor its grid (timm's so400m/14 at 384 px): the config allows it
        assert ViTConfig(**changes).grid_size in ((14, 14), (14, 12))
        return
    with pytest.raises(VitkitError):
        ViTConfig(**changes)


def test_invalid_config_messages_name_the_values():
    with pytest.raises(VitkitError) as err:
        ViTConfig(image_size=15, patch_size=16)  # not even one patch
    assert "15" in str(err.value) and "16" in str(err.value)
    with pytest.raises(VitkitError) as err:
        ViTConfig(width=100, num_heads=12)
    assert "100" in str(err.value) and "12" in str(err.value)
    with pytest.raises(VitkitError) as err:
        ViTConfig(pool="cls")
    assert "cls" in str(err.value)


def test_config_is_frozen():
    cfg = tiny()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.depth = 3  # type: ignore[misc]
    assert cfg.replace(depth=3).depth == 3 and cfg.depth == 2


def test_derived_sizes():
    cfg = tiny(image_size=(16, 24), patch_size=(4, 8), representation_size=7)
    assert cfg.grid_size == (4, 3)
    assert cfg.num_patches == 12
    assert cfg.num_prefix_tokens == 1 and cfg.seq_len == 13
    assert cfg.feature_dim == 7
    gap = cfg.replace(pool="gap", representation_size=None)
    assert gap.num_prefix_tokens == 0 and gap.seq_len == 12 and gap.feature_dim == 24


# ---------------------------------------------------------------------------- serialisation


@pytest.mark.parametrize(
    "cfg",
    [
        ViTConfig(),
        tiny(image_size=(16, 24), patch_size=(4, 8), pool="gap", representation_size=7),
        tiny(in_chans=1, num_classes=0, dropout=0.1, drop_path=0.2, gelu="none", qkv_bias=False),
    ],
)
def test_dict_and_json_round_trip(cfg):
    d = cfg.to_dict()
    assert ViTConfig.from_dict(d) == cfg
    text = json.dumps(d)
    back = ViTConfig.from_dict(json.loads(text))
    assert back == cfg
    assert isinstance(back.image_size, tuple) and isinstance(back.patch_size, tuple)
    # Every field is serialised.
    assert set(d) == {f.name for f in dataclasses.fields(ViTConfig)}


def test_from_dict_rejects_unknown_keys():
    d = tiny().to_dict()
    d["hidden_size"] = 64
    d["zzz"] = 1
    with pytest.raises(VitkitError) as err:
        ViTConfig.from_dict(d)
    assert "hidden_size" in str(err.value) and "zzz" in str(err.value)


def test_from_dict_validates():
    d = tiny().to_dict()
    d["image_size"] = [17, 16]  # floored to the grid (a loaded so400m/14 at 384 px)
    assert (
        ViTConfig.from_dict(d).grid_size
        == ViTConfig.from_dict({**d, "image_size": [16, 16]}).grid_size
    )
    d["image_size"] = [1, 16]  # not one patch
    with pytest.raises(VitkitError):
        ViTConfig.from_dict(d)


# ---------------------------------------------------------------------------- FLOPs


def measured_flops(model: torch.nn.Module, cfg: ViTConfig, batch: int) -> int:
    """FLOPs that PyTorch's own counter sees (2 per multiply-add in mm/bmm/conv)."""
    x = torch.randn(batch, cfg.in_chans, *cfg.image_size)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        # The explicit-softmax path, so that q k^T and (weights) v run as visible matmuls.
        model.forward_with_attentions(x)
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "cfg",
    [
        tiny(),
        tiny(pool="gap"),
        tiny(image_size=(16, 24), patch_size=(4, 8), in_chans=1, representation_size=7),
        tiny(num_classes=0, depth=3),
        tiny(qkv_bias=False, num_heads=4, width=32, mlp_dim=20),
        ViTConfig(
            image_size=32,
            patch_size=1,
            width=32,
            depth=1,
            num_heads=2,
            mlp_dim=64,
            resnet_layers=(1, 2),
            resnet_width_factor=0.5,
        ),  # fmt: skip
        ViTConfig(
            image_size=(16, 24),
            patch_size=2,
            width=32,
            depth=1,
            num_heads=2,
            mlp_dim=64,
            resnet_layers=(),
            resnet_width_factor=0.5,
        ),  # fmt: skip
    ],
)
def test_count_flops_matches_flop_counter(cfg):
    model = vitkit.create_model(cfg).eval()
    assert measured_flops(model, cfg, batch=3) == 3 * count_flops(cfg)


def test_count_flops_matches_flop_counter_for_b16():
    cfg = model_config("B/16")
    with torch.device("meta"):  # shapes only: no memory, no arithmetic
        model = vitkit.create_model(cfg).eval()
        assert measured_flops(model, cfg, batch=2) == 2 * count_flops(cfg)


def test_count_flops_hand_derived_b16():
    # ViT-B/16 at 224 px, 1000 classes, written out matmul by matmul as (rows, inner, cols).
    n, t, d, m, p2c = 196, 197, 768, 3072, 16 * 16 * 3
    matmuls = [(n, p2c, d)]  # patch embedding
    per_block = [
        (t, d, 3 * d),  # q, k, v
        (t, d, t),  # q k^T summed over heads: heads * (t, d/heads, t)
        (t, t, d),  # weights @ v summed over heads: heads * (t, t, d/heads)
        (t, d, d),  # attention output projection
        (t, d, m),  # MLP fc1
        (t, m, d),  # MLP fc2
    ]
    matmuls += per_block * 12
    matmuls.append((1, d, 1000))  # head on the class token
    flops = sum(2 * a * b * c for a, b, c in matmuls)
    assert flops == 35_127_656_448  # ≈ 17.56 GMACs, the figure usually quoted for B/16
    assert count_flops(model_config("B/16")) == flops


def test_key_values_take_bracketed_lists_including_the_empty_one():
    """``-o resnet_layers=[]`` is the hybrid's root-only ResNet; it used to reach the config as
    the string '[]' and be refused, so no command line could build that hybrid."""
    from vitkit.registry.model_config import model_config
    from vitkit.registry.overrides import parse_key_values

    got = parse_key_values(["resnet_layers=[]", "image_size=(28, 28)", "b=[3]", "c=[3,4]"])
    assert got == {"resnet_layers": [], "image_size": [28, 28], "b": [3], "c": [3, 4]}
    cfg = model_config("Ti/4", resnet_layers=got["resnet_layers"], patch_size=1, image_size=28)
    assert cfg.resnet_layers == () and cfg.is_hybrid and cfg.grid_size == (7, 7)
