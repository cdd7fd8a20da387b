"""The MAE and DeiT authors' own ``.pth`` files: a torch file holding ``{"model": {timm keys}}``
(training checkpoints also ``model_ema``, ``optimizer``, ``epoch``, ``args``), read through the
safe unpickler and equal to a live timm model with the same weights."""

from __future__ import annotations

import argparse
import pathlib

import pytest
import torch
from references import import_reference

from vitkit.checkpoints import load_model, read_checkpoint
from vitkit.errors import VitkitError

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _check(path, ref) -> None:
    model, ckpt = load_model(path, num_heads=4)
    assert ckpt.format == "timm"
    x = images()
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max().item() <= 1e-5


def test_mae_finetuned_checkpoint_with_args_loads(tmp_path):
    """MAE's fine-tuned ViTs: global average pool over the patches with ``fc_norm``."""
    timm = import_reference("timm")
    ref = perturbed(timm.create_model("vit_base_patch16_224", global_pool="avg", **SMALL))
    assert "fc_norm.weight" in ref.state_dict() and "norm.weight" not in ref.state_dict()
    args = argparse.Namespace(model="vit_base_patch16", global_pool=True, lr=1e-3, input_size=224)
    obj = {"model": ref.state_dict(), "optimizer": {"state": {}}, "epoch": 99, "args": args}
    torch.save(obj, tmp_path / "checkpoint-99.pth")
    _check(tmp_path / "checkpoint-99.pth", ref)
    assert read_checkpoint(tmp_path / "checkpoint-99.pth", num_heads=4).model_config.fc_norm


def test_mae_pretraining_checkpoint_drops_the_decoder(tmp_path):
    timm = import_reference("timm")
    ref = perturbed(timm.create_model("vit_base_patch16_224", **{**SMALL, "num_classes": 0}))
    decoder = {
        "mask_token": torch.zeros(1, 1, 32),
        "decoder_embed.weight": torch.zeros(32, 64),
        "decoder_pos_embed": torch.zeros(1, 17, 32),
        "decoder_blocks.0.norm1.weight": torch.ones(32),
        "decoder_norm.weight": torch.ones(32),
        "decoder_pred.weight": torch.zeros(192, 32),
    }
    torch.save({"model": {**ref.state_dict(), **decoder}}, tmp_path / "mae_pretrain.pth")
    _check(tmp_path / "mae_pretrain.pth", ref)


@pytest.mark.parametrize("key", ["model", "model_ema"])
def test_deit_distilled_checkpoint_loads_model_or_ema(tmp_path, key):
    timm = import_reference("timm")
    ref = perturbed(timm.create_model("deit_base_distilled_patch16_224", **SMALL))
    ema = perturbed(timm.create_model("deit_base_distilled_patch16_224", **SMALL))
    obj = {key: ref.state_dict(), "args": argparse.Namespace(distillation_type="hard")}
    if key == "model":  # a training checkpoint holds both: the model is what is read
        obj["model_ema"] = ema.state_dict()
    torch.save(obj, tmp_path / "deit.pth")
    _check(tmp_path / "deit.pth", ref)


def test_other_python_objects_in_a_pth_are_still_refused(tmp_path):
    args = argparse.Namespace(output_dir=pathlib.PurePosixPath("/runs"))  # a path object
    torch.save({"model": {}, "args": args}, tmp_path / "bad.pth")
    with pytest.raises(VitkitError, match="refused to unpickle.*PurePosixPath"):
        read_checkpoint(tmp_path / "bad.pth")
