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
