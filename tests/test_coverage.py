"""bench/coverage.py's machinery on a few names, so the coverage table cannot rot: one exact
timm model, one refused with its one-line reason, one Hugging Face class, and the report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from references import import_reference

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def coverage():
    spec = importlib.util.spec_from_file_location("coverage_bench", ROOT / "bench" / "coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timm_names_are_the_three_modules(coverage):
    names = dict((n, m) for m, n in coverage.timm_names(import_reference("timm")))
    assert names["deit3_small_patch16_224"] == "deit"
    assert names["vit_base_r50_s16_384"] == "vision_transformer_hybrid"
    assert names["vit_small_patch14_reg4_dinov2"] == "vision_transformer"


def test_exact_refused_and_report(coverage, tmp_path):
    timm = import_reference("timm")
    res = {
        name: coverage.check_timm(timm, name, tmp_path)
        for name in ("deit_tiny_distilled_patch16_224", "vit_small_resnet26d_224")
    }
    exact = res["deit_tiny_distilled_patch16_224"]
    assert exact["status"] == "exact", exact
    assert exact["rel_f64"] <= 1e-8 and exact["rel_f32"] <= 1e-4
    assert exact["switches"] == {"dist_token": "True"}
    refused = res["vit_small_resnet26d_224"]
    assert refused["status"] == "refused", refused
    assert "a hybrid backbone in a layout other than" in refused["reason"]
    assert "\n" not in refused["reason"] and str(tmp_path) not in refused["reason"]
    meta = dict(timm="t", transformers="t", torch="t", threads=1, seconds=1)
    md = coverage.markdown(res, {}, meta)
    assert "**timm: 1 of 2 exact, 1 refused.**" in md
    assert "| 1 | a hybrid backbone in a layout" in md  # refusals grouped by reason


def test_hf_class(coverage, tmp_path):
    transformers = import_reference("transformers")
    r = coverage.check_hf(transformers, "ViTForImageClassification", tmp_path)
    assert r["status"] == "exact", r


@pytest.mark.parametrize(
    ("name", "status", "says"),
    [
        ("vit_base_patch32_siglip_gap_256", "exact", ""),  # SigLIP 2: tanh GELU from the name
        ("vit_little_patch16_reg1_gap_256", "exact", ""),  # 320 wide, 5 heads from the name
        ("vit_base_patch16_rpn_224", "exact", ""),  # was: differs, then refused by name
        ("test_vit4", "exact", ""),  # RMSNorm; 96 wide, 3 heads from the name
        ("test_vit3", "refused", "pool_include_prefix"),  # the name says what weights cannot
    ],
)
def test_what_the_coverage_run_found(coverage, tmp_path, name, status, says):
    r = coverage.check_timm(import_reference("timm"), name, tmp_path)
    assert r["status"] == status, r
    assert says in r.get("reason", "")


# one name per pattern of timm._NAME_HEADS / _TANH_GELU, and their neighbours that must not match
HINTED = (
    "vit_base_patch16_gap_224",
    "vit_base_patch16_224",
    "vit_giant_patch14_reg4_dinov2",
    "vit_giant_patch14_clip_224",
    "vit_wee_patch16_reg1_gap_256",
    "vit_xsmall_patch16_clip_224",
    "vit_dlittle_patch16_reg1_gap_256",
    "vit_mediumd_patch16_reg4_gap_256",
    "vit_betwixt_patch16_reg4_gap_256",
    "vit_so150m2_patch16_reg1_gap_256",
    "vit_so150m_patch16_reg4_gap_256",
    "vit_base_patch16_plus_240",
    "vit_so400m_patch14_siglip_gap_224",
    "vit_so400m_patch16_siglip_gap_256",
    "vit_large_patch16_siglip_gap_512",
    "vit_large_patch16_siglip_gap_384",
    "vit_giantopt_patch16_siglip_gap_256",
    "vit_gigantic_patch14_clip_quickgelu_224",
)


@pytest.mark.parametrize("name", HINTED)
def test_name_hints_agree_with_timm(name):
    import torch

    from vitkit.checkpoints.timm import HEADS_BY_WIDTH, _name_settings

    timm = import_reference("timm")
    with torch.device("meta"):
        model = timm.create_model(name)
    hints = _name_settings(name)
    assert hints.get("num_heads", HEADS_BY_WIDTH.get(model.embed_dim)) == (
        model.blocks[0].attn.num_heads
    )
    act = model.blocks[0].mlp.act
    want = {"QuickGELU": "quick_gelu", "GELUTanh": "gelu_tanh"}.get(type(act).__name__, "gelu")
    if getattr(act, "approximate", "none") == "tanh":
        want = "gelu_tanh"
    assert hints.get("act_layer", "gelu") == want
