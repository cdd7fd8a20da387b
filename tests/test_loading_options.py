"""Every command that reads a checkpoint takes the same loading options (one shared group),
and ``arch=`` / ``--arch`` read a bare timm state dict exactly as timm's entry, nothing assumed."""

from __future__ import annotations

import argparse
import warnings

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file

import vitkit
from vitkit.cli import build_parser, main
from vitkit.errors import AssumptionWarning, VitkitError

LOADING = {"--arch", "--num-heads", "-o"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


# not checkpoints of any format: a dataset (shards), vitkit's own sharded run (consolidate)
NOT_READERS = {"shards", "consolidate"}


def test_every_reading_command_takes_the_same_loading_options():
    readers = {}
    for name, p in _commands().items():
        if name in NOT_READERS:
            continue
        dests = {a.dest for a in p._actions}
        if dests & {"ckpt", "init_from", "src"}:
            readers[name] = {o for a in p._actions for o in a.option_strings} & LOADING
    assert {"predict", "eval", "inspect", "convert", "finetune", "serve", "train"} <= set(readers)
    missing = {n: sorted(LOADING - have) for n, have in readers.items() if have != LOADING}
    assert not missing


# (timm name, its settings at a small size that keeps its layout: the entry's own args win)
SMALL = {"embed_dim": 64, "depth": 2, "num_classes": 4}
NAMES = [
    "vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_base_patch32_224",
    "deit_small_patch16_224", "deit3_small_patch16_224", "vit_base_patch16_clip_224",
    "vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_siglip_224",
    "vit_base_patch32_siglip_256", "vit_base_patch16_rpn_224", "vit_small_patch14_dinov2",
    "vit_small_patch14_reg4_dinov2", "vit_medium_patch16_gap_256", "vit_base_patch16_gap_224",
    "vit_betwixt_patch16_reg4_gap_256", "vit_base_patch16_224_miil", "vit_small_patch16_384",
    "eva02_tiny_patch14_224", "vit_small_patch16_rope_224", "vit_small_patch16_dinov3",
    "vit_base_patch16_plus_240",
]  # fmt: skip


def _bare(tmp_path, name: str):
    """timm's ``name`` at full size (its layout, heads, GELU and input untouched), 2 blocks
    (timm's ``depth``; the blocks are identical in kind), random weights, saved bare."""
    timm = import_reference("timm")
    ref = perturbed(timm.create_model(name, depth=2, num_classes=4))
    f = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(f))
    return ref, f


@pytest.mark.parametrize("name", NAMES)
def test_arch_reads_a_bare_file_exactly_with_nothing_assumed(tmp_path, name):
    ref, f = _bare(tmp_path, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumptionWarning)
        model, ckpt = vitkit.load_model(f, arch=name)
    size = tuple(ckpt.model_config.image_size)
    assert size == tuple(ref.pretrained_cfg["input_size"][1:])
    assert ckpt.provenance is not None and not ckpt.provenance.assumptions
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref.eval()(x), rtol=1e-4, atol=1e-4)
    timm = import_reference("timm")
    from timm.data import resolve_data_config

    want = resolve_data_config({}, model=ref)
    assert ckpt.preprocess.crop_pct == want["crop_pct"]
    assert tuple(ckpt.preprocess.mean) == tuple(want["mean"]) and timm


def test_arch_the_weights_contradict_is_refused(tmp_path, capsys):
    _, f = _bare(tmp_path, "vit_tiny_patch16_224")
    with pytest.raises(VitkitError, match="cls_token"):
        vitkit.load(f, arch="vit_base_patch16_rpn_224")
    with pytest.raises(VitkitError, match="not a timm entry"):
        vitkit.load(f, arch="vit_nonesuch")
    assert main(["inspect", str(f), "--arch", "vit_base_patch16_siglip_224"]) != 0
    assert "attn_pool" in capsys.readouterr().err


def test_the_guide_s_arch_line_runs_with_nothing_assumed(tmp_path, capsys):
    """docs/guide/checkpoints.md's ``--arch`` predict line as written, on a bare CLIP tower."""
    import json
    import shlex

    import numpy as np
    from doc_commands import page_commands
    from PIL import Image

    (line,) = [c for c in page_commands("docs/guide/checkpoints.md") if "--arch" in c]
    timm = import_reference("timm")
    ref = perturbed(timm.create_model("vit_base_patch16_clip_224", depth=1))
    save_file(
        {k: v.contiguous() for k, v in ref.state_dict().items()},
        str(tmp_path / "model.safetensors"),
    )
    rgb = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "cat.jpg", format="PNG")
    args = [
        str(tmp_path / a) if a in ("cat.jpg", "model.safetensors") else a
        for a in shlex.split(line)[1:]
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*args, "--json"]) == 0
    assert not [w for w in caught if issubclass(w.category, AssumptionWarning)]
    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(row["top_k"]) == 5
