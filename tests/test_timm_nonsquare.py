"""A non-square timm input: vitkit's eval transform equals timm's own (ResizeKeepRatio, the
centre crop) on random image sizes; ``--to hf`` refuses what no HF processor computes; a
``crop_pct`` of 0 is read as timm reads it, and said."""

from __future__ import annotations

import json
import random
import warnings

import pytest
import torch
from PIL import Image
from references import import_reference
from safetensors.torch import save_file

from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.data.images import eval_transform
from vitkit.data.transforms import PilEvalTransform
from vitkit.errors import AssumptionWarning, VitkitError


def test_eval_transform_equals_timms_on_random_sizes():
    timm = import_reference("timm")
    from timm.data import create_transform

    rng = random.Random(0)
    for _ in range(300):
        size = (rng.randint(8, 64), rng.randint(8, 64))
        crop_pct = rng.choice([0.875, 0.9, 0.95, 1.0, rng.uniform(0.5, 1.0)])
        interp = rng.choice(["bilinear", "bicubic", "nearest"])
        w, h = rng.randint(1, 160), rng.randint(1, 160)
        img = Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3))
        theirs = create_transform(size, crop_pct=crop_pct, interpolation=interp, is_training=False)
        ours = PilEvalTransform(size, 3, crop_pct, interp, "shortest_edge", "round")
        want = theirs(img)
        got = ours(img).float() / 255
        mean = torch.tensor(timm.data.IMAGENET_DEFAULT_MEAN).view(3, 1, 1)
        std = torch.tensor(timm.data.IMAGENET_DEFAULT_STD).view(3, 1, 1)
        torch.testing.assert_close(
            (got - mean) / std, want, rtol=0, atol=1e-6, msg=str((size, img.size, crop_pct))
        )


def _folder(tmp_path, pretrained_cfg):
    timm = import_reference("timm")
    args = {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 8, "img_size": [32, 24],
            "num_classes": 3}  # fmt: skip
    ref = timm.create_model("vit_tiny_patch16_224", **args)
    d = tmp_path / "ns"
    d.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in ref.state_dict().items()}, str(d / "model.safetensors")
    )
    hub = {"architecture": "vit_tiny_patch16_224", "num_classes": 3, "model_args": args,
           "pretrained_cfg": {"input_size": [3, 32, 24], **pretrained_cfg}}  # fmt: skip
    (d / "config.json").write_text(json.dumps(hub))
    return d


def test_timm_folder_preprocessing_is_timms(tmp_path):
    import_reference("timm")
    from timm.data import create_transform, resolve_data_config

    d = _folder(tmp_path, {"crop_pct": 0.875})
    ckpt = read_checkpoint(d)
    tf = eval_transform(ckpt.preprocess)
    theirs = create_transform(
        **resolve_data_config(
            {}, pretrained_cfg=json.loads((d / "config.json").read_text())["pretrained_cfg"]
        )
    )
    # 31 wide, 97 high: timm 27x84
    img = Image.frombytes("RGB", (31, 97), random.Random(1).randbytes(31 * 97 * 3))
    assert tf.resized_size(*img.size) == (27, 84)
    mean = torch.tensor(ckpt.preprocess.mean).view(3, 1, 1)
    std = torch.tensor(ckpt.preprocess.std).view(3, 1, 1)
    torch.testing.assert_close((tf(img).float() / 255 - mean) / std, theirs(img), rtol=0, atol=1e-6)


def test_crop_pct_zero_is_read_as_timm_reads_it_and_said(tmp_path):
    d = _folder(tmp_path, {"crop_pct": 0})
    with pytest.warns(AssumptionWarning, match="crop_pct=0 read as 0.875"):
        ckpt = read_checkpoint(d)
    assert ckpt.preprocess.crop_pct == 0.875
    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumptionWarning)
        assert (
            read_checkpoint(_folder(tmp_path / "b", {"crop_pct": 0.9})).preprocess.crop_pct == 0.9
        )


def test_non_square_aspect_keeping_to_hf_is_refused(tmp_path):
    d = _folder(tmp_path, {"crop_pct": 0.875})
    with pytest.raises(VitkitError, match="non-square input 32x24"):
        write_checkpoint(read_checkpoint(d), tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()
