"""The loading fuzzer (bench/fuzz_loading.py) on a few dozen seeded draws of the settings people
train with, and the silently wrong loads it found, each now exact, said or refused.

A draw is a tiny timm ``VisionTransformer`` (random global_pool, fc_norm, heads, tokens, input
size, patch, pre_norm, qk_norm, layer scale, activation, LayerNorm eps) or a Hugging Face
ViT / DINOv2 / CLIP / SigLIP vision config, written as a bare safetensors file, a ``.pth`` state
dict, a timm folder or a ``save_pretrained`` folder, read by vitkit and compared with the
reference in float64. ``silent`` (the output differs and no AssumptionWarning names what
differs) must never happen. The fuzzer can fail: with the heads fix reverted it finds the bare
ViT-S trained with 12 heads read with 6, unsaid (:func:`test_the_fuzzer_finds_a_reverted_fix`),
and with the timm-folder reader's activations broken it finds those loads silently wrong too.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from references import import_reference, load_bench
from safetensors.torch import save_file

from vitkit.checkpoints.provenance import Provenance

ROOT = Path(__file__).resolve().parents[1]
DRAWS = 40  # about 10 s on one core


@pytest.fixture(scope="module")
def fuzz():
    return load_bench("fuzz_loading", "fuzz_loading_bench")


@pytest.fixture(scope="module")
def timm():
    return import_reference("timm")


def test_seeded_draws_have_no_silent_wrong_load(fuzz):
    result = fuzz.run(DRAWS, seconds=300, seed=0)
    assert result["draws"] == DRAWS
    total = result["total"]
    assert total["silent"] == 0 and total["crashed"] == 0, result["examples"]
    assert total["exact"] > 0 and total["warned"] > 0
    counts = result["counts"]
    for source in fuzz.SOURCES:  # every way of handing a model on was exercised
        assert sum(counts[source].values()) > 0, source
    assert counts["timm-folder"]["warned"] == counts["timm-folder"]["silent"] == 0  # all stated


def _hunt(fuzz, draws: int, seed: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fuzz.run(draws, seconds=300, seed=seed)


def test_the_fuzzer_finds_a_reverted_fix(fuzz, monkeypatch):
    """The heads fix reverted (a bare file's heads taken from the width table as if the weights
    said them, as before): the fuzzer reports silently wrong bare loads."""
    from vitkit.checkpoints.timm import bare

    def unsaid(heads: int, width: int, which: str, prov: Provenance) -> int:
        prov.set("weights", ["num_heads"], which)
        return heads

    monkeypatch.setattr(bare, "heads_assumed", unsaid)
    result = _hunt(fuzz, 24, seed=0)
    silent = [e for e in result["examples"]["silent"] if "num_heads" in e["differs"]]
    assert silent and silent[0]["source"].startswith("bare"), result["total"]


def test_the_fuzzer_finds_a_broken_reader(fuzz, monkeypatch):
    """A timm folder's tanh GELU read as the exact one (the reader deliberately broken):
    silently wrong timm-folder loads."""
    from vitkit.checkpoints.timm import hub_folder

    monkeypatch.setattr(hub_folder, "_TIMM_ACT", {**hub_folder._TIMM_ACT, "none": "gelu_tanh"})
    result = _hunt(fuzz, 40, seed=0)
    assert result["counts"]["timm-folder"]["silent"] > 0, result["total"]


# ---------------------------------------------------------------------------------------------
# the silently wrong classes, one case each: said (with the override that makes it exact)

BASE: dict[str, Any] = {
    "img_size": [32, 32],
    "patch_size": [16, 16],
    "num_classes": 5,
    "embed_dim": 384,
    "depth": 1,
    "num_heads": 6,
    "mlp_ratio": 4.0,
    "qkv_bias": True,
    "qk_norm": False,
    "class_token": True,
    "global_pool": "token",
    "fc_norm": None,
    "reg_tokens": 0,
    "no_embed_class": False,
    "pre_norm": False,
    "init_values": None,
    "act_layer": "gelu",
    "_eps": 1e-6,
}


def _case(fuzz, timm, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], Path, Any]:
    """A bare ``model.safetensors`` of BASE with ``kw`` changed, read by vitkit."""
    args = {**BASE, **kw}
    model = fuzz.build_timm_model(timm, args, seed=3)
    path = tmp_path / "model.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    x = torch.randn(2, 3, *args["img_size"], generator=torch.Generator().manual_seed(0))
    x = x.double()
    with torch.no_grad():
        ref = model(x)
    row = fuzz.classify(ref, fuzz.vitkit_read(path, x, False, fuzz.timm_expected(args)))
    return row, path, (model, x, ref)


def _exact_when_told(fuzz, path: Path, ref: Any, **told: Any) -> None:
    """Loaded with the override(s) the warning names: exact, and that field no longer said."""
    from vitkit.checkpoints import load_state_dict_strict, read_checkpoint
    from vitkit.models.vit import build_model

    _, x, want = ref
    rest = {k: v for k, v in told.items() if k not in ("grid", "num_heads")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(
            path, grid=told.get("grid"), num_heads=told.get("num_heads"), overrides=rest
        )
    model = build_model(ckpt.model_config).double().eval()  # (float64 weights kept exactly)
    load_state_dict_strict(model, ckpt.state_dict, source=str(path))
    with torch.no_grad():
        got = model(x)
    assert ((got - want).abs().max() / want.abs().max()).item() <= fuzz.EXACT
    said = fuzz.said_fields([str(w.message) for w in caught])
    assert not said & {k for k in told if k != "grid"}, said


@pytest.mark.parametrize(
    ("kw", "field", "told"),
    [
        ({"global_pool": "avg", "fc_norm": False}, "pool", {"pool": "gap", "class_token": True}),
        ({"global_pool": "avgmax"}, "pool", {"pool": "avgmax", "class_token": True}),
        ({"num_heads": 12}, "num_heads", {"num_heads": 12}),
        ({"pre_norm": True}, "layer_norm_eps", {"layer_norm_eps": 1e-6}),
        ({"act_layer": "quick_gelu"}, "gelu", {"gelu": "quick"}),
        ({"img_size": [64, 16]}, "image_size", {"grid": (4, 1)}),  # 4 rows: 2x2 or 4x1
        # class token + 4 registers without position rows, 3x3 patches: 9 rows, or 5 + 2x2
        (
            {"reg_tokens": 4, "no_embed_class": True, "img_size": [48, 48]},
            "image_size",
            {"grid": (3, 3)},
        ),  # fmt: skip
    ],
    ids=["avg-no-fc-norm", "avgmax", "heads", "pre-norm-eps", "quick-gelu", "grid", "registers"],
)
def test_a_setting_the_weights_do_not_show_is_said_and_can_be_stated(
    fuzz, timm, tmp_path, kw, field, told
):
    row, path, ref = _case(fuzz, timm, tmp_path, **kw)
    assert row["status"] == "warned", row  # (silent before: read as the table's value, unsaid)
    assert field in row["differs"] and field in fuzz.said_fields(row["warnings"])
    line = next(w for w in row["warnings"] if f": {field}=" in w)
    assert "load with" in line and "-o " in line  # the value assumed, and the override
    _exact_when_told(fuzz, path, ref, **told)


def test_a_bare_eva02_says_its_heads(fuzz, timm, tmp_path):
    """EVA-02's keys fix the family, not the heads: 192 wide with 6 heads is said."""
    args = {**fuzz.draw_eva(random.Random(0)), "embed_dim": 192, "num_heads": 6}
    model = fuzz.build_timm_model(timm, args, seed=3)
    path = tmp_path / "model.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    size = args["img_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        ref = model(x)
    row = fuzz.classify(ref, fuzz.vitkit_read(path, x, False, fuzz.timm_expected(args)))
    assert row["status"] == "warned" and "num_heads" in row["differs"], row
    assert "num_heads" in fuzz.said_fields(row["warnings"])


def test_qk_norm_weights_say_the_heads(fuzz, timm, tmp_path):
    """qk_norm normalises each head: its width fixes the heads, read from the weights."""
    row, _, _ = _case(fuzz, timm, tmp_path, num_heads=12, qk_norm=True)
    assert "num_heads" not in row["differs"] and "num_heads" not in fuzz.said_fields(
        row["warnings"]
    )


def test_inspect_names_no_guess_as_the_weights(timm, tmp_path, capsys):
    """``vitkit inspect`` of a bare ViT-S/16: what the weights cannot show is assumed (said) or
    a default with no effect, never "the weights"."""
    from vitkit.cli import main

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", depth=1, num_classes=5)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    (weights,) = [x for x in out.splitlines() if x.strip().startswith("the weights:")]
    named = {f.strip() for f in weights.split(":", 1)[1].split(",")}
    guesses = {"num_heads", "layer_norm_eps", "gelu", "dropout", "drop_path", "pool", "block"}
    assert not named & guesses, named & guesses
    assert {"width", "depth", "patch_size"} <= named
    (assumed,) = [x for x in out.splitlines() if x.strip().startswith("ASSUMED:")]
    assert {"num_heads", "layer_norm_eps", "gelu", "pool"} <= set(
        f.strip() for f in assumed.split(":", 1)[1].split(",")
    )


def test_a_draw_is_reproducible(fuzz):
    a, b = fuzz.draw_timm(random.Random(5)), fuzz.draw_timm(random.Random(5))
    assert a == b and a["embed_dim"] % a["num_heads"] == 0
