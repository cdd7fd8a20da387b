"""No silent wrong numbers: a loaded checkpoint is exact, or says what it assumed, or is refused.

Each case is a timm model of the kind a user shares (a bare ``model.safetensors`` saved from
``state_dict()``, no config, no name; or a timm Hub folder written by timm's ``save_for_hf``),
compared with live timm in float64 on random weights.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from references import import_reference
from safetensors.torch import save_file

from vitkit.checkpoints import describe, load_state_dict_strict, read_checkpoint
from vitkit.checkpoints.description import format_description
from vitkit.cli import main
from vitkit.errors import AssumptionWarning, VitkitError
from vitkit.models.vit import build_model


def timm_model(name: str, **kw: Any) -> torch.nn.Module:
    timm = import_reference("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, **kw).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # no zero bias or layer scale left to hide a difference
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    return model


def bare(model: torch.nn.Module, tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def hub_folder(model: torch.nn.Module, tmp_path: Path) -> Path:
    from timm.models._hub import save_for_hf

    save_for_hf(model, str(tmp_path / "hub"), safe_serialization=True)
    return tmp_path / "hub"


def load64(path: Path, **kw: Any) -> tuple[torch.nn.Module, list[str]]:
    """vitkit's model of ``path`` in float64 and the AssumptionWarning lines it said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        heads, grid = kw.pop("num_heads", None), kw.pop("grid", None)
        ckpt = read_checkpoint(path, num_heads=heads, grid=grid, overrides=kw)
    model = build_model(ckpt.model_config).double().eval()  # (float64 weights kept exactly)
    load_state_dict_strict(model, ckpt.state_dict, source=str(path))
    said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    assert len(said) <= 1, said  # one warning, however many settings were assumed
    # one line a field: the block's indented lines, each with the file's name before it
    said = [f"{path}: {s.strip()}" for block in said for s in block.splitlines()[1:]]
    # (a bare file never says its preprocessing: that line is checked on its own below)
    return model, [s for s in said if f"{path}: mean=" not in s]


# What a bare timm state dict never records, each said in its own line with the override; and
# a CLIP ViT-B/16 at 32 px stating all of them (the values timm's quick-GELU entry has)
BARE_GUESSES = {"num_heads", "layer_norm_eps", "gelu", "pool", "block", "image_size"}
BARE_GUESSES.add("pos_resample")  # (the kernel that resamples E_pos at another input size)
CLIP_QUICK_STATED = dict(
    gelu="quick",
    num_heads=12,
    layer_norm_eps=1e-5,
    pool="token",
    block="pre",
    grid=(2, 2),
    pos_resample="bicubic-antialias",
)


def fields_said(said: list[str], path: Path) -> set[str]:
    """The fields the lines name (``PATH: FIELD=VALUE assumed ...``), each line one field."""
    assert all(s.startswith(f"{path}: ") and "\n" not in s for s in said), said
    return {s[len(f"{path}: ") :].split("=", 1)[0] for s in said}


def rel_diff(ref: torch.nn.Module, got: torch.nn.Module, size: int) -> float:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(2)).double()
    with torch.no_grad():
        a, b = ref(x), got(x)
    return ((a - b).abs().max() / a.abs().max()).item()


def test_clip_quickgelu_bare_says_the_gelu_and_is_exact_when_told(tmp_path):
    ref = timm_model("vit_base_patch16_clip_quickgelu_224", depth=1, img_size=32)
    path = bare(ref, tmp_path)
    model, said = load64(path)
    assert model.cfg.layer_norm_eps == 1e-5  # the CLIP layout implies timm's CLIP eps
    assert model.cfg.num_heads == 12  # and its heads
    assert fields_said(said, path) == BARE_GUESSES  # each guess in its own line
    (gelu,) = [s for s in said if "gelu='none' assumed" in s]
    assert "gelu='quick'" in gelu and "-o gelu=quick" in gelu
    assert rel_diff(ref, model, 32) > 1e-4  # what it assumed is not what this tower computes
    model, said = load64(path, gelu="quick")
    assert fields_said(said, path) == BARE_GUESSES - {"gelu"}  # stated, not assumed
    model, said = load64(path, **CLIP_QUICK_STATED)
    assert said == []  # every guess stated
    assert rel_diff(ref, model, 32) <= 1e-12


def test_clip_bare_with_exact_gelu_is_exact(tmp_path):
    ref = timm_model("vit_base_patch16_clip_224", depth=1, img_size=32)
    model, said = load64(bare(ref, tmp_path))
    assert rel_diff(ref, model, 32) <= 1e-12
    assert [s for s in said if "gelu" in s]  # the guess is still said


def test_aimv2_large_bare_gets_aimv2_heads(tmp_path):
    ref = timm_model("aimv2_large_patch14_224", depth=1, img_size=28)
    path = bare(ref, tmp_path)
    model, said = load64(path)
    assert model.cfg.num_heads == 8  # every AIMv2-L has 8 (the width table would say 16)
    # (SwiGLU: no GELU to guess; AIMv2's block is pre-norm only)
    assert fields_said(said, path) == BARE_GUESSES - {"gelu", "block"}
    assert [s for s in said if "num_heads=8 assumed (every timm AIMv2 of width 1024" in s]
    assert rel_diff(ref, model, 28) <= 1e-12


def test_post_norm_rpn_bare_warns_and_is_exact_when_told(tmp_path):
    ref = timm_model("vit_base_patch16_rpn_224", depth=1, img_size=32)
    path = bare(ref, tmp_path)
    model, said = load64(path)
    assert any("block='pre' assumed" in s and "block='post'" in s for s in said)
    assert rel_diff(ref, model, 32) > 1e-3
    model, said = load64(path, block="post")
    assert not [s for s in said if "block" in s]
    assert rel_diff(ref, model, 32) <= 1e-12


def test_siglip_map_bare_assumes_tanh_and_says_so(tmp_path):
    ref2 = timm_model("vit_base_patch32_siglip_256", depth=1, img_size=64)  # SigLIP 2: tanh
    model, said = load64(bare(ref2, tmp_path))
    assert rel_diff(ref2, model, 64) <= 1e-12
    assert any("gelu='tanh' assumed" in s for s in said)
    ref1 = timm_model("vit_base_patch16_siglip_224", depth=1, img_size=32)  # SigLIP 1: exact
    model, _ = load64(bare(ref1, tmp_path), gelu="none")
    assert rel_diff(ref1, model, 32) <= 1e-12


def test_gap_vit_b_bare_says_its_heads(tmp_path):
    ref = timm_model("vit_base_patch16_gap_224", depth=1, img_size=32)  # B width, 16 heads
    path = bare(ref, tmp_path)
    _, said = load64(path)
    assert any("num_heads=12 assumed" in s and "num_heads=16" in s for s in said)
    model, said = load64(path, num_heads=16)
    assert not [s for s in said if "num_heads" in s]
    assert rel_diff(ref, model, 32) <= 1e-12


def test_perception_encoder_bare_says_its_rope_and_is_read_as_a_hub_folder(tmp_path):
    """Bare, at its own size (timm's reference grid is the entry's grid): exact, the RoPE said
    in one line; a hub folder naming the entry: exact, nothing said."""
    ref = timm_model("vit_pe_core_tiny_patch16_384", depth=1, img_size=32, ref_feat_shape=2)
    model, said = load64(bare(ref, tmp_path))
    assert [s for s in said if "rope='axial' assumed (Perception Encoder" in s and "\n" not in s]
    assert rel_diff(ref, model, 32) <= 1e-12
    model, said = load64(hub_folder(ref, tmp_path))
    assert not said and rel_diff(ref, model, 32) <= 1e-12


def test_so400m_patch14_at_384_floors_its_grid_as_timm(tmp_path):
    # 384 px in 14 px patches: 27 x 27 patches, the last 6 pixels unused (timm, big_vision)
    ref = timm_model(
        "vit_so400m_patch14_siglip_384", depth=1, embed_dim=256, num_heads=16, mlp_ratio=2
    )
    model, said = load64(hub_folder(ref, tmp_path))
    assert model.cfg.image_size == (384, 384) and model.cfg.grid_size == (27, 27)
    assert said == []  # a registered name says everything
    assert rel_diff(ref, model, 384) <= 1e-12


def test_a_folder_naming_an_unknown_architecture_or_argument_is_refused(tmp_path):
    import json

    ref = timm_model("vit_base_patch16_224", depth=1, img_size=32, embed_dim=64, num_heads=2)
    folder = hub_folder(ref, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architecture": "my_vit"}))
    with pytest.raises(VitkitError, match="'my_vit' is not one of the timm ViTs"):
        read_checkpoint(folder)
    args = {**config["model_args"], "use_rope": True}
    (folder / "config.json").write_text(json.dumps({**config, "model_args": args}))
    with pytest.raises(VitkitError, match="model_args use_rope"):
        read_checkpoint(folder)


def test_provenance_per_field_bare_and_folder(tmp_path):
    ref = timm_model("vit_base_patch16_clip_quickgelu_224", depth=1, img_size=32)
    with pytest.warns(AssumptionWarning):
        ckpt = read_checkpoint(bare(ref, tmp_path))
    src = ckpt.provenance.sources
    assert src["width"] == src["mlp_dim"] == src["norm_pre"] == "weights"  # shapes and keys
    assert all(src[f] == "assumed" for f in BARE_GUESSES)  # heads, eps: never in the weights
    assert src["gelu"] == src["mean"] == src["std"] == "assumed"  # the preprocessing too
    assert src["dropout"] == src["drop_path"] == "default"  # no effect on the outputs
    assert set(ckpt.model_config.to_dict()) <= set(src)  # every field has a source
    text = format_description(describe(ckpt))
    assert "ASSUMED" in text and "gelu" in text.split("ASSUMED")[1]
    hub = read_checkpoint(hub_folder(ref, tmp_path))
    src = hub.provenance.sources
    assert src["gelu"] == "name" and src["depth"] == "file" and src["qkv_bias"] == "weights"
    assert hub.model_config.gelu == "quick" and hub.provenance.assumptions == []


def test_cli_loading_options_state_what_the_file_does_not(tmp_path, capsys):
    ref = timm_model("vit_base_patch16_clip_quickgelu_224", depth=1, img_size=32)
    path = bare(ref, tmp_path)
    with pytest.warns(AssumptionWarning, match="gelu='none' assumed"):
        assert main(["inspect", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert "ASSUMED" in out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stated = ["-o", "mean=0.5", "-o", "std=0.5"]
        for k, v in CLIP_QUICK_STATED.items():
            stated += ["-o", f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}"]
        assert main(["inspect", str(path), *stated]) == 0
    assert not [w for w in caught if issubclass(w.category, AssumptionWarning)]
    out, _ = capsys.readouterr()
    assert "given when loading:" in out and "GELU quick" in out
    dst = tmp_path / "converted"
    assert main(["convert", str(path), str(dst), "--to", "vitkit", "-o", "gelu=quick"]) == 0
    capsys.readouterr()
    model, said = load64(dst)  # the stated value travels with the converted checkpoint
    assert said == [] and rel_diff(ref, model, 32) <= 1e-6  # (vitkit's format: float32)


def test_every_reading_command_takes_the_loading_options():
    from vitkit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command" or a.choices)
    for name in ("eval", "predict", "fewshot", "explain", "analyze", "export", "inspect"):
        p = sub.choices[name]
        opts = {s for a in p._actions for s in a.option_strings}
        assert {"--num-heads", "-o"} <= opts, name


def test_a_hugging_face_class_vitkit_does_not_read_is_refused(tmp_path):
    import json

    transformers = import_reference("transformers")
    conf = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    transformers.ViTModel(conf).save_pretrained(tmp_path / "hf")
    read_checkpoint(tmp_path / "hf")  # as written: read
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["architectures"] = ["ViTForMaskedImageModeling"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(VitkitError, match="'ViTForMaskedImageModeling' is not a Hugging Face"):
        read_checkpoint(tmp_path / "hf")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("vit_small_patch16_dinov3_qkvb", "q / v biases, gamma_1 layer scale"),
        ("vit_small_patch16_rope_ape_224", "rotary position embeddings"),
    ],
)
def test_bare_weights_of_other_timm_modules_are_refused_by_what_they_are(tmp_path, name, says):
    ref = timm_model(name, depth=1, img_size=32)
    with pytest.raises(VitkitError, match=says):
        read_checkpoint(bare(ref, tmp_path))


def test_the_guide_s_stating_what_a_bare_file_does_not_say_runs(tmp_path, capsys):
    """docs/guide/checkpoints.md's predict line as written, on a bare CLIP quick-GELU tower and
    a PNG: every guess stated, so nothing is assumed, and the top-5 is printed."""
    import shlex

    import numpy as np
    from doc_commands import page_commands
    from PIL import Image

    commands = page_commands("docs/guide/checkpoints.md")
    (line,) = [c for c in commands if "predict" in c and "-o gelu=quick" in c]
    ref = timm_model("vit_base_patch16_clip_quickgelu_224", depth=1)  # (224 px: its grid)
    bare(ref, tmp_path)
    rgb = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "cat.jpg", format="PNG")
    args = [
        str(tmp_path / a) if a in ("cat.jpg", "model.safetensors") else a
        for a in shlex.split(line)[1:]
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*args, "--json"]) == 0
    assert not [w for w in caught if issubclass(w.category, AssumptionWarning)]
    import json

    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(row["top_k"]) == 5 and row["top_k"][0]["prob"] >= row["top_k"][1]["prob"]


def test_a_value_given_when_converting_travels_as_given(tmp_path, capsys):
    """``convert --num-heads 4`` of a bare file wrote a config whose provenance then said the
    file stated the heads; the converted checkpoint keeps "given" (and "assumed") as they were
    when it was read, and a later read says so."""
    from vitkit.checkpoints import read_checkpoint

    ref = timm_model("deit_tiny_patch16_224", embed_dim=64, num_heads=4, depth=1, img_size=32)
    src = bare(ref, tmp_path)
    out = tmp_path / "converted"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AssumptionWarning)
        assert main(["convert", str(src), str(out), "--to", "vitkit", "--num-heads", "4"]) == 0
    sources = read_checkpoint(out).provenance.sources  # type: ignore[union-attr]
    assert sources["num_heads"] == "given"
    assert sources["mean"] == "assumed"  # the paper's preprocessing, assumed at conversion
    assert sources["width"] == "file"
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    given = [x for x in capsys.readouterr().out.splitlines() if "given when loading" in x]
    assert given == ["  given when loading:     num_heads"], given


def test_a_bare_timm_file_says_its_assumptions_in_one_warning(tmp_path):
    path = bare(timm_model("vit_base_patch16_clip_quickgelu_224", depth=1, img_size=32), tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_checkpoint(path)
    (block,) = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    head, *fields = block.splitlines()
    assert head.startswith(f"{path}: {len(fields)} settings assumed (the file does not say them)")
    assert head.endswith("state them with --arch NAME or -o KEY=VALUE")
    assert len(fields) == len(BARE_GUESSES) + 1  # and the mean / std
    assert all(f.startswith("  ") and len(f) < 300 for f in fields), fields
