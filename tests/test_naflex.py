"""NaFlex (vitkit.models.naflex_packing, checkpoints/timm/naflexvit.py): timm's NaFlexVit read
exactly, float64, on fixed-size images and on images of three aspect ratios packed in one batch; the
converter both ways (bitwise round trip); the paper's ViT unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from references import import_reference

from vitkit.checkpoints import read_checkpoint
from vitkit.checkpoints.native.safetensors_io import load_state_dict_strict
from vitkit.checkpoints.timm.naflexvit import ENTRIES, naflex_model_args
from vitkit.checkpoints.timm.vision_transformer import state_dict_to_timm, timm_to_state_dict
from vitkit.errors import VitkitError
from vitkit.models.naflex_packing import pack
from vitkit.models.vit import build_model
from vitkit.registry.model_config import ViTConfig

TINY = {"embed_dim": 32, "depth": 2, "num_classes": 5, "pos_embed_grid_size": (3, 4)}
SIZES = [(32, 64), (48, 48), (80, 16)]  # 2x4, 3x3, 5x1 patches of 16: three aspect ratios


def _timm_model(name: str, **extra):
    timm = import_reference("timm")
    heads = 2 if ENTRIES[name]["num_heads"] != 13 else 1
    torch.manual_seed(0)
    model = timm.create_model(name, num_heads=heads, **{**TINY, **extra}).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    return model


def _read(model, tmp_path):
    from timm.models._hub import save_for_hf

    save_for_hf(model, str(tmp_path / "m"), safe_serialization=True)
    ckpt = read_checkpoint(tmp_path / "m")
    ours = build_model(ckpt.model_config).double().eval()
    load_state_dict_strict(ours, ckpt.state_dict, source="test")
    return ours, ckpt


def _images():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in SIZES]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / a.abs().max()).item()


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_timm_naflex_exact_packed_and_fixed(name, tmp_path):
    ref = _timm_model(name)
    ours, ckpt = _read(ref, tmp_path)
    batch = pack(_images(), (16, 16), max_seq_len=12)  # padding in every row but one
    with torch.no_grad():
        want, got = ref(batch), ours(batch)
        assert _rel(want, got) <= 1e-12, name
        x = torch.randn(2, 3, 48, 80, dtype=torch.float64)  # fixed size: 3x5, resampled E_pos
        assert _rel(ref(x), ours(x)) <= 1e-12, name
        one = pack([_images()[0]], (16, 16))  # one image alone equals its row in the batch
        assert _rel(ours(one)[0], got[0]) <= 1e-12
    back = state_dict_to_timm(ckpt.state_dict, ckpt.model_config)
    sd = ref.state_dict()
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_naflex_writes_back_to_timm():
    timm = import_reference("timm")
    ref = _timm_model("naflexvit_base_patch16_parfac_gap")
    cfg = dataclasses.replace(
        ViTConfig(image_size=(48, 64), num_classes=5, width=32, depth=2, num_heads=2),
        mlp_dim=128,
        gelu="none",
        pool="gap",
        fc_norm=True,
        num_reg_tokens=4,
        pos_embed_prefix=False,
        layer_scale_init=1e-5,
        naflex=True,
        naflex_grid=(3, 4),
        naflex_pos="factorized",
        naflex_ar_preserving=True,
    )
    ours = build_model(cfg).double().eval()
    ours.load_state_dict(timm_to_state_dict(ref.state_dict(), cfg))
    again = timm.create_model("naflexvit_base_patch16_gap", **naflex_model_args(cfg)).double()
    again.load_state_dict(state_dict_to_timm(ours.state_dict(), cfg))
    batch = pack(_images(), (16, 16))
    with torch.no_grad():
        assert _rel(again.eval()(batch), ours(batch)) <= 1e-12


def test_bare_naflex_weights_are_refused(tmp_path):
    from safetensors.torch import save_file

    sd = {
        k: v.contiguous() for k, v in _timm_model("naflexvit_base_patch16_gap").state_dict().items()
    }
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(VitkitError, match="naflexvit weights .* alone do not say"):
        read_checkpoint(tmp_path / "model.safetensors")


def test_unsupported_model_args_are_refused(tmp_path):
    ref = _timm_model("naflexvit_base_patch16_gap", pos_embed_use_grid_sample=True)
    with pytest.raises(VitkitError, match="pos_embed_use_grid_sample=True is not supported"):
        _read(ref, tmp_path)


def test_config_switches_off_by_default_and_checked():
    cfg = ViTConfig()
    assert not cfg.naflex and "naflex" not in cfg.family_switches
    assert ViTConfig.from_dict(cfg.replace(naflex_grid=(2, 3)).to_dict()).naflex_grid == (2, 3)
    with pytest.raises(VitkitError, match="does not combine with pos_embed_prefix"):
        ViTConfig(naflex=True, num_reg_tokens=1, pool="gap")
    with pytest.raises(VitkitError, match="naflex_pos must be one of"):
        ViTConfig(naflex_pos="rope")  # type: ignore[arg-type]


def test_written_timm_folder_reads_back_and_runs_in_timm(tmp_path):
    timm = import_reference("timm")
    from vitkit.checkpoints.writing import write_checkpoint

    ref = _timm_model("naflexvit_so400m_patch16_siglip")
    ours, ckpt = _read(ref, tmp_path)
    write_checkpoint(ckpt, tmp_path / "folder", "timm")
    back = read_checkpoint(tmp_path / "folder")
    assert back.model_config == ckpt.model_config
    assert all(torch.equal(back.state_dict[k], v) for k, v in ckpt.state_dict.items())
    from safetensors.torch import load_file

    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}").double().eval()  # its config
    again.load_state_dict(load_file(str(tmp_path / "folder" / "model.safetensors")))
    batch = pack(_images(), (16, 16))
    with torch.no_grad():
        assert _rel(again(batch), ours(batch)) <= 1e-12
    # npz has no NaFlex; Hugging Face's (SigLIP 2) has no non-square E_pos grid: both say so
    for fmt, said in (("npz", "naflex"), ("hf", "NaFlex tower .* non-square E_pos grid")):
        with pytest.raises(VitkitError, match=said):
            write_checkpoint(ckpt, tmp_path / fmt, fmt)  # type: ignore[arg-type]


def test_fit_size_is_timms():
    timm = import_reference("timm")
    from timm.data.naflex_transforms import get_image_size_for_seq

    from vitkit.models.naflex_packing import fit_size

    for size in [(480, 640), (100, 1000), (37, 23), (2000, 16), (16, 16)]:
        for n in (1, 7, 64, 256):
            want = get_image_size_for_seq(size, (16, 16), n)[1]
            assert fit_size(size, (16, 16), n) == tuple(want), (size, n)
    del timm


def test_predict_keeps_aspect_ratios(tmp_path, capsys):
    import json

    import numpy as np
    from PIL import Image

    from vitkit.cli import main
    from vitkit.data.images import load_images_native
    from vitkit.data.transforms import normalize

    ref = _timm_model("naflexvit_base_patch16_par_gap")
    from timm.models._hub import save_for_hf

    save_for_hf(ref, str(tmp_path / "m"), safe_serialization=True)
    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate([(40, 90), (70, 70), (120, 30)]):
        files.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(files[-1])
    ckpt = read_checkpoint(tmp_path / "m")
    pre = ckpt.preprocess
    images = load_images_native(files, pre, (16, 16), 12)
    assert [tuple(x.shape[1:]) for x in images] == [(32, 80), (48, 48), (96, 32)]
    x = [normalize(i.float()[None], pre.mean, pre.std, pre.rescale_factor)[0] for i in images]
    with torch.no_grad():
        want = ref.float()(pack(x, (16, 16), 12)).softmax(-1)
    argv = ["predict", *map(str, files), "--from", str(tmp_path / "m"), "--max-seq-len", "12"]
    argv.append("--json")
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row, p in zip(rows, want):
        top = row["top_k"][0]
        assert top["index"] == int(p.argmax()) and abs(top["prob"] - float(p.max())) < 1e-5
    from pathlib import Path

    from vitkit.checkpoints import Checkpoint
    from vitkit.eval.predict import predict_files
    from vitkit.registry.model_config import PreprocessConfig

    cfg = ViTConfig(image_size=(32, 32), num_classes=3, width=32, depth=1, num_heads=2)
    paper = build_model(cfg)
    plain = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), paper.state_dict())
    with pytest.raises(VitkitError, match="--max-seq-len needs a NaFlex model"):
        predict_files(paper, plain, files, max_seq_len=12)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_padded_batch_under_bf16_autocast_stays_finite(device):
    """The padding mask is fp32's most negative number, which bf16 rounds to -inf: a padding
    query masked from every key then took softmax(-inf, ...) = NaN and every token after it (the
    README's NaFlex training diverged at step 1 on a CPU with native bf16). The mask is added
    at the attention's precision now, clamped to its range."""
    import vitkit

    torch.manual_seed(0)
    kw = dict(width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
    ours = vitkit.create_model("Ti/16", naflex=True, pos_embed_prefix=False, **kw)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = ours.to(device).train()
    batch = {k: v.to(device) for k, v in pack([x.float() for x in _images()], (16, 16)).items()}
    assert not batch["patch_valid"].all()  # padding in the batch
    with torch.autocast(device, torch.bfloat16):
        logits = ours(batch)
    assert torch.isfinite(logits).all()
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None)
    with torch.no_grad():
        want = ours.eval()(batch)
        with torch.autocast(device, torch.bfloat16):
            got = ours(batch).float()
    assert (got - want).abs().max() < 0.1 * want.abs().max()  # bf16, close to fp32


@pytest.mark.parametrize("num_classes", [0, 5])
def test_a_naflex_model_without_pooling_reads_and_writes_as_timm(tmp_path, num_classes):
    """timm's NaFlexVit with global_pool="" (every token out, as a pruned head leaves it): read
    from a timm folder, written back (it was a KeyError traceback), equal to timm both ways."""
    from safetensors.torch import load_file

    from vitkit.checkpoints.writing import write_checkpoint

    timm = import_reference("timm")
    ref = _timm_model("naflexvit_base_patch16_gap", global_pool="", num_classes=num_classes)
    ours, ckpt = _read(ref, tmp_path)
    assert ckpt.model_config.pool == "none"
    write_checkpoint(ckpt, tmp_path / "folder", "timm")
    again = timm.create_model(f"local-dir:{tmp_path / 'folder'}").double().eval()
    again.load_state_dict(load_file(str(tmp_path / "folder" / "model.safetensors")))
    batch = pack(_images(), (16, 16))
    with torch.no_grad():
        want = ref(batch)
        assert want.dim() == 3 and want.shape[0] == 3 and want.shape[-1] == (num_classes or 32)
        assert _rel(ours(batch), want) <= 1e-12
        assert _rel(again(batch), want) <= 1e-12
