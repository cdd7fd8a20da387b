"""bench/coverage.py's machinery on a few names, so the coverage table cannot rot: the two modes
(hub folder, bare state dict) on exact names, the outcomes (exact / warned / silent / refused),
the native-width heads check, the seven timm modules, the Hugging Face classes, and the report."""

from __future__ import annotations

from pathlib import Path

import pytest
from references import import_reference, load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def coverage():
    return load_bench("coverage", "coverage_bench")


@pytest.fixture(scope="module")
def timm():
    return import_reference("timm")


def test_timm_names_are_the_seven_modules(coverage, timm):
    names = dict((n, m) for m, n in coverage.timm_names(timm))
    assert names["deit3_small_patch16_224"] == "deit"
    assert names["vit_base_r50_s16_384"] == "vision_transformer_hybrid"
    assert names["vit_small_patch14_reg4_dinov2"] == "vision_transformer"
    assert names["eva02_tiny_patch14_224"] == "eva"
    assert names["naflexvit_base_patch16_gap"] == "naflexvit"
    assert names["beitv2_base_patch16_224"] == "beit"
    assert names["vit_relpos_small_patch16_224"] == "vision_transformer_relpos"


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("eva02_tiny_patch14_224", {"img_size": (28, 28), "depth": 2}),
        ("naflexvit_base_patch16_gap", {"pos_embed_grid_size": (2, 2), "embed_dim": 384}),
        ("vit_base_patch16_sapiens2", {"num_kv_heads": (12, 12)}),  # per block: depth 2
        ("beit_base_patch16_224", {"img_size": (32, 32), "num_heads": 12}),
    ],
)
def test_small_copies_of_the_new_modules(coverage, timm, name, want):
    ref = coverage.build_timm(timm, name)
    assert "model" in ref, ref  # not harness
    args = ref["args"]
    assert {k: args[k] for k in want} == want
    assert len(ref["model"].blocks) == 2 and ref["ref64"].shape == (2, 10)


@pytest.mark.parametrize("mode", ["hub", "bare"])
def test_modes_load_exactly(coverage, timm, tmp_path, mode):
    ref = coverage.build_timm(timm, "deit_tiny_distilled_patch16_224")
    r = coverage.check_timm(timm, "deit_tiny_distilled_patch16_224", tmp_path, mode, ref=ref)
    assert r["status"] == "exact", r
    assert r["rel_f64"] <= 1e-8 and r["rel_f32"] <= 1e-4
    assert r["switches"] == {"dist_token": "True"} and r["heads"] == 3
    assert "read_kw" not in r  # native width: no hint
    if mode == "bare":
        assert r["heads_native"]["result"] == "ok"
        assert (tmp_path / f"deit_tiny_distilled_patch16_224-{mode}").iterdir()
        files = list((tmp_path / "deit_tiny_distilled_patch16_224-bare").iterdir())
        assert [f.name for f in files] == ["model.safetensors"]  # no config, no name
    else:
        assert "heads_native" not in r


def test_bare_scaled_width_passes_the_heads(coverage, timm, tmp_path):
    r = coverage.check_timm(timm, "vit_base_patch16_224", tmp_path, "bare")
    assert r["scaled"] and r["read_kw"] == {"num_heads": 12}, r
    assert r["status"] == "exact" and r["heads"] == 12, r


def test_silent_warned_and_exact_with_warnings(coverage, timm, tmp_path):
    name = "deit_tiny_patch16_224"
    ref = coverage.build_timm(timm, name)
    exact = coverage.check_timm(timm, name, tmp_path / "a", "hub", ref=ref)
    assert exact["status"] == "exact" and exact["warnings"] == [], exact
    altered = {**ref, "ref64": ref["ref64"] * 1.01, "ref32": ref["ref32"] * 1.01}
    silent = coverage.check_timm(timm, name, tmp_path / "b", "hub", ref=altered)
    assert silent["status"] == "silent", silent
    assert 1e-3 < silent["rel_f64"] < 1e-1 and silent["warnings"] == []
    # bare, the file does not say its preprocessing: the loader says so (once), which makes a
    # difference "warned" and leaves an exact row exact with the line recorded
    warned = coverage.check_timm(timm, name, tmp_path / "c", "bare", ref=altered)
    said = warned["warnings"]
    assert warned["status"] == "warned" and len(said) == len(set(said)) >= 1, warned
    assert any("mean=(0.5, 0.5, 0.5) assumed" in w for w in said), said
    exact = coverage.check_timm(timm, name, tmp_path / "d", "bare", ref=ref)
    assert exact["status"] == "exact" and exact["warnings"] == said, exact


def test_score_classifies(coverage):
    import torch

    ref = torch.ones(2, 3, dtype=torch.float64)
    cfg = type("Cfg", (), {"num_heads": 2, "family_switches": {}})()
    got = {"out64": ref.clone(), "out32": ref.float(), "config": cfg, "warnings": []}
    assert coverage.score(ref, ref.float(), got)["status"] == "exact"
    off = {**got, "out64": ref * 1.5, "out32": ref.float() * 1.5}
    assert coverage.score(ref, ref.float(), off)["status"] == "silent"
    assert coverage.score(ref, ref.float(), {**off, "warnings": ["x"]})["status"] == "warned"
    nan = {**off, "out64": ref * float("nan")}
    assert coverage.score(ref, ref.float(), nan)["status"] == "silent"
    shape = {**got, "out64": torch.ones(2, 4, dtype=torch.float64)}
    r = coverage.score(ref, ref.float(), shape)
    assert r["status"] == "silent" and "output shape" in r["reason"]
    refused = {"status": "refused", "reason": "no", "warnings": ["x"]}
    assert coverage.score(ref, ref.float(), refused) == refused


@pytest.mark.parametrize(
    "name", ["vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_rpn_224"]
)
def test_bare_state_dicts_that_cannot_say_their_settings(coverage, timm, tmp_path, name):
    """A bare state dict cannot say QuickGELU or the rpn's norm: vitkit must say what it assumed
    or refuse; today's loader says nothing (silent)."""
    hub = coverage.check_timm(timm, name, tmp_path, "hub")
    assert hub["status"] == "exact", hub  # the hub folder's architecture name says it
    r = coverage.check_timm(timm, name, tmp_path, "bare")
    assert r["status"] != "exact", r
    if r["status"] in ("silent", "warned"):
        assert r["rel_f64"] > 1e-4
        assert (r["status"] == "warned") == bool(r["warnings"]), r


def test_native_width_heads(coverage, timm):
    cm = coverage.cm
    ok = cm.native_heads_check(timm, "vit_base_patch16_224")
    # (right, and said all the same: a state dict never records its heads)
    assert ok == {"timm": 12, "width": 768, "vitkit": 12, "warned": True, "result": "ok"}
    # 768 wide with 16 heads: the layout's entries disagree (SigLIP-GAP B has 12), so it is said
    wrong = cm.native_heads_check(timm, "vit_base_patch16_gap_224")
    assert wrong["timm"] == 16 and wrong["vitkit"] == 12, wrong
    assert wrong["result"] == "warned" and wrong["warned"], wrong
    aimv2 = cm.native_heads_check(timm, "aimv2_large_patch14_224")  # the family's own heads
    assert aimv2["result"] == "ok" and aimv2["vitkit"] == 8, aimv2
    refused = cm.native_heads_check(timm, "test_vit")  # 64 wide: no table says its heads
    assert refused["result"].startswith("refused: ") and "num_heads" in refused["result"]


def test_bare_row_is_silent_where_native_heads_are(coverage, timm, tmp_path, monkeypatch):
    cm = coverage.cm
    monkeypatch.setattr(
        cm,
        "native_heads_check",
        lambda timm, name: {"timm": 16, "width": 768, "vitkit": 12, "result": "silent"},
    )
    r = coverage.check_timm(timm, "deit_tiny_patch16_224", tmp_path, "bare")
    assert r["status"] == "silent" and r["small_status"] == "exact", r
    assert "vitkit infers 12 heads, timm has 16" in r["reason"]


@pytest.mark.parametrize("mode", ["hub", "bare"])
def test_hf_classes(coverage, tmp_path, mode):
    transformers = import_reference("transformers")
    ref = coverage.build_hf(transformers, "ViTForImageClassification")
    r = coverage.check_hf(transformers, "ViTForImageClassification", tmp_path, mode, ref=ref)
    assert r["status"] == ("exact" if mode == "hub" else "refused"), r
    for cls_name in ("IJepaModel", "ViTMSNModel"):  # ViT-like: must not load silently
        r = coverage.check_hf(transformers, cls_name, tmp_path, mode)
        assert not r["implemented"]
        assert r["status"] in ("refused", "exact", "warned"), r
        assert "\n" not in r.get("reason", "") and str(tmp_path) not in r.get("reason", "")


def test_report(coverage, timm, tmp_path):
    res = {
        "timm": {"hub": {}, "bare": {}},
        "hf": {"hub": {}, "bare": {}},
        "modules": {},
        "meta": dict(timm="t", transformers="t", torch="t", threads=1, seconds=1),
    }
    for name in ("deit_tiny_patch16_224", "vit_small_resnet26d_224"):
        res["modules"][name] = "deit" if name.startswith("deit") else "vision_transformer_hybrid"
        ref = coverage.build_timm(timm, name)
        for mode in ("hub", "bare"):
            res["timm"][mode][name] = coverage.check_timm(timm, name, tmp_path, mode, ref=ref)
    res["timm"]["bare"]["fake_silent"] = {
        "status": "silent",
        "rel_f64": 0.5,
        "rel_f32": 0.5,
        "warnings": [],
        "switches": {},
        "heads": 3,
    }
    res["modules"]["fake_silent"] = "eva"
    refused = res["timm"]["hub"]["vit_small_resnet26d_224"]
    assert "a hybrid backbone in a layout other than" in refused["reason"]
    md = coverage.report.markdown(res)
    first = md.splitlines()[0]
    assert first.startswith(
        "# Coverage: SILENT (loads, wrong numbers, nothing said): hub 0, bare 1"
    )
    assert "hub: 1 of 2 exact, **0 silent**, 1 refused" in first
    assert "bare: 1 of 3 exact, **1 silent**, 1 refused" in first
    assert "| eva | 0 | 0 | **1** | 0 | 0 | 0 | 1 |" in md  # per module and mode
    assert "- fake_silent (eva): rel f64 5.0e-01" in md  # the silent listing
    assert "| 1 | a hybrid backbone in a layout" in md  # refusals grouped by reason
    assert "## bare: rows" in md and "| fake_silent | eva | silent (!!) |" in md


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
def test_what_the_coverage_run_found(coverage, timm, tmp_path, name, status, says):
    r = coverage.check_timm(timm, name, tmp_path)
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

    from vitkit.checkpoints.timm.vision_transformer import HEADS_BY_WIDTH, _name_settings

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
