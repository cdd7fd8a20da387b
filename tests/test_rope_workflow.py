"""A DINOv3-style model through the rest of vitkit: a tiny ``vit_small_patch16_dinov3_qkvb``
(rotary embeddings, no E_pos, 4 storage tokens, layer scale, q/v biases; random weights) written
as a timm eva.py folder at 16 px is fine-tuned on digits at 8 px with ``vitkit finetune``, learns,
exports to ONNX within 1e-4 of PyTorch, and runs ``fewshot``, ``analyze`` and ``explain``. Also
what moving a checkpoint to another size does without a learned E_pos (``checkpoints.adapt``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.checkpoints import Checkpoint, load_checkpoint, write_checkpoint
from vitkit.checkpoints.adapt import adapt
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.models.vit import build_model
from vitkit.registry.model_config import PreprocessConfig, ViTConfig, model_config

TINY = {"patch_size": 2, "width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def _dinov3_folder(dst: Path) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A "pre-trained" DINOv3-style timm folder: random weights, layer scale grown to 0.1 (a
    trained DINOv3's gammas are far from their 1e-5 start), non-zero q/v biases."""
    cfg = model_config("vit_small_patch16_dinov3_qkvb", image_size=16, num_classes=7, **TINY)
    assert isinstance(cfg, ViTConfig)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.fill_(0.1)
            else:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    write_checkpoint(Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd), dst, "timm")
    return cfg, sd


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ViTConfig, dict]:
    root = tmp_path_factory.mktemp("dinov3")
    cfg, sd = _dinov3_folder(root / "dinov3")
    out = root / "ft"
    args = ["finetune", "--from", str(root / "dinov3"), "--data", "digits", "--image-size", "8"]
    args += ["--augment", "none", "--optimizer", "adamw", "--lr", "1e-2", "--warmup-steps", "10"]
    args += ["--epochs", "3", "--batch-size", "32", "--precision", "fp32", "--threads", "1"]
    assert main([*args, "--out-dir", str(out), "--no-progress"]) == 0
    return out, cfg, sd


@pytest.mark.slow
def test_dinov3_finetunes_on_digits_at_another_size(tuned):
    out, cfg, sd = tuned
    report = json.loads((out / "report.json").read_text())
    assert report["test_top1"] > 0.4  # 10 classes: chance is 0.1 (about 0.6 measured here)
    ckpt = load_checkpoint(out)
    got = ckpt.model_config
    assert got.image_size == (8, 8) and got.num_classes == 10
    assert got.family_switches == cfg.family_switches  # RoPE, storage tokens, q/v biases, ...
    assert "pos_embed" not in ckpt.state_dict  # still no E_pos: RoPE follows the 4x4 grid
    assert not torch.equal(ckpt.state_dict["blocks.0.ls1.gamma"], sd["blocks.0.ls1.gamma"])
    assert not torch.equal(ckpt.state_dict["blocks.1.attn.q_bias"], sd["blocks.1.attn.q_bias"])


@pytest.mark.slow
def test_finetuned_dinov3_exports_to_onnx_within_1e_4(tuned, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out, _, _ = tuned
    onnx = tmp_path / "dinov3.onnx"
    capsys.readouterr()
    assert main(["export", str(out), str(onnx)]) == 0
    assert "onnxruntime vs PyTorch: max relative difference" in capsys.readouterr().out
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    model = vitkit.load(out)
    x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    got = session.run(None, {"pixel_values": x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    assert got.shape == (5, 10) and np.abs(got - want).max() <= 1e-4


@pytest.mark.slow
def test_fewshot_analyze_and_explain_run_on_the_finetuned_dinov3(tuned, tmp_path, capsys):
    out, _, _ = tuned
    fewshot = tmp_path / "fewshot.json"
    args = ["fewshot", "--from", str(out), "--data", "digits", "--shots", "5", "--seeds", "2"]
    assert main([*args, "--out", str(fewshot)]) == 0
    assert fewshot.is_file()
    analysis = tmp_path / "analysis"
    args = ["analyze", "--from", str(out), "--data", "digits", "--num-images", "6"]
    assert main([*args, "--examples", "2", "--out", str(analysis)]) == 0
    numbers = json.loads((analysis / "analysis.json").read_text())
    assert numbers["attention_distance"]["images"] == 6  # RoPE's geometry shows here
    assert "position_similarity" not in numbers  # no learned E_pos to compare
    assert set(numbers["prefix_tokens"]) == {"class token", "registers", "patches"}
    image = tmp_path / "digit.png"
    Image.fromarray(np.full((8, 8, 3), 128, np.uint8)).save(image)
    capsys.readouterr()
    ex = tmp_path / "explain"
    assert main(["explain", str(image), "--from", str(out), "--out", str(ex), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert Path(record["rollout_png"]).is_file() and Path(record["layers_png"]).is_file()


@pytest.mark.filterwarnings("ignore:.*head is all zeros")
def test_adapt_moves_a_rope_model_to_another_size_without_e_pos():
    """Fine-tuning a RoPE model at another size stopped with KeyError: 'pos_embed'."""
    cfg = model_config("vit_small_patch16_dinov3", image_size=16, num_classes=3, **TINY)
    assert isinstance(cfg, ViTConfig)
    sd = build_model(cfg).state_dict()
    new, moved = adapt(cfg, sd, image_size=8)
    assert new.image_size == (8, 8) and moved.keys() == sd.keys()
    assert all(torch.equal(moved[k], sd[k]) for k in sd)
    build_model(new).load_state_dict(moved)


@pytest.mark.filterwarnings("ignore:.*head is all zeros")
def test_adapt_keeps_naflex_e_pos_on_its_own_grid():
    cfg = ViTConfig(image_size=16, naflex=True, naflex_grid=(3, 3), pool="gap", **TINY)
    sd = build_model(cfg).state_dict()
    new, moved = adapt(cfg, sd, image_size=12)
    assert torch.equal(moved["pos_embed"], sd["pos_embed"])
    build_model(new).load_state_dict(moved)


def test_adapt_refuses_a_relative_position_table_at_another_size():
    cfg = ViTConfig(image_size=16, rel_pos="bias", abs_pos_embed=False, **TINY)
    sd = build_model(cfg).state_dict()
    with pytest.raises(VitkitError, match="relative position bias table is learned for a 8x8"):
        adapt(cfg, sd, image_size=8, source="beit")


def test_train_builds_a_named_dinov3_and_inspect_names_it(tmp_path, capsys):
    """``--model vit_small_patch16_dinov3`` (a named model, families.py) with smaller sizes:
    the run's checkpoint has the entry's switches and ``inspect`` names the family."""
    out = tmp_path / "run"
    args = ["train", "--data", "digits", "--model", "vit_small_patch16_dinov3"]
    args += [f"-o{k}={v}" for k, v in TINY.items()]
    args += ["--max-steps", "1", "--epochs", "1", "--batch-size", "32", "--no-progress"]
    assert main([*args, "--threads", "1", "--out-dir", str(out)]) == 0
    got = load_checkpoint(out).model_config
    want = model_config("vit_small_patch16_dinov3", image_size=8, num_classes=10, **TINY)
    assert got.family_switches == want.family_switches and not got.qkv_bias
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    assert (
        "family:      DINOv3 ViT-w32-d2-h2/2, no qkv bias, 4 registers" in capsys.readouterr().out
    )
