"""Preprocessing as the source says (issue 24): a Hugging Face preprocessor config and timm's
pretrained_cfg give exactly their own libraries' model input on a real photo, and 16-bit,
32-bit integer and float images are scaled by their range, not clipped to white."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from references import import_reference, perturbed

from vitkit.checkpoints import load_model
from vitkit.checkpoints.hf.vit_model import hf_preprocess, vit_to_hf_preprocess
from vitkit.checkpoints.timm.vision_transformer import timm_hub_preprocess
from vitkit.data.folder import ImageFolderDataset
from vitkit.data.images import load_images
from vitkit.data.transforms import normalize
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

CFG = ViTConfig(
    image_size=(224, 224), patch_size=(16, 16), width=32, depth=1, num_heads=2, mlp_dim=64
)


def photo(tmp_path: Path, name: str) -> Path:
    """scikit-image's astronaut (512 x 512) or chelsea (451 x 300) as a PNG."""
    skimage_data = pytest.importorskip("skimage.data")
    path = tmp_path / f"{name}.png"
    if not path.exists():
        Image.fromarray(getattr(skimage_data, name)()).save(path)
    return path


def model_input(pre: PreprocessConfig, *paths: Path) -> torch.Tensor:
    """What predict, eval and explain feed the model for these files."""
    factor = getattr(pre, "rescale_factor", 1 / 255)  # (getattr: the test runs on older code too)
    return normalize(load_images(list(paths), pre).float(), pre.mean, pre.std, factor)


# (processor class, its settings): transformers writes the rest of the config
PROCESSORS = {
    "vit-no-normalize": ("ViTImageProcessor", {"do_normalize": False}),
    "vit-no-rescale": ("ViTImageProcessor", {"do_rescale": False}),
    "vit-384-bicubic": (
        "ViTImageProcessor",
        {"size": {"height": 384, "width": 384}, "resample": 3},
    ),
    "clip": ("CLIPImageProcessor", {}),
    "bit-256-crop-224-factor": (
        "BitImageProcessor",
        {"size": {"shortest_edge": 256}, "rescale_factor": 1 / 127.5, "image_mean": [1.0] * 3},
    ),
    "deit-squash-256-crop-224": (
        "ViTImageProcessor",
        {"size": {"height": 256, "width": 256}, "do_center_crop": True, "crop_size": 224},
    ),
    "no-resize-crop": (
        "ViTImageProcessor",
        {"do_resize": False, "do_center_crop": True, "crop_size": {"height": 256, "width": 320}},
    ),
}


@pytest.mark.parametrize("name", ["chelsea", "astronaut"])
@pytest.mark.parametrize("case", list(PROCESSORS))
def test_model_input_is_transformers_pixel_values(tmp_path, case, name):
    transformers = import_reference("transformers")
    cls, settings = PROCESSORS[case]
    processor = getattr(transformers, f"{cls}Pil")(**settings)  # PIL's resize, as vitkit's
    path = photo(tmp_path, name)
    ref = processor(Image.open(path), return_tensors="pt")["pixel_values"]
    pre = hf_preprocess(processor.to_dict(), CFG)
    got = model_input(pre, path)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-6)  # measured: <= 1.2e-7
    assert hf_preprocess(vit_to_hf_preprocess(pre), CFG) == pre  # written, it reads back


@pytest.mark.parametrize("case", ["vit-no-normalize", "clip", "deit-squash-256-crop-224"])
def test_torchvision_backed_processors_differ_by_at_most_one_8_bit_level(tmp_path, case):
    """transformers 5's default processors resize with torch, not PIL: their rounding moves
    a pixel by at most one level of 255 (measured) against the PIL processors and vitkit."""
    transformers = import_reference("transformers")
    cls, settings = PROCESSORS[case]
    processor = getattr(transformers, cls)(**settings)
    path = photo(tmp_path, "chelsea")
    ref = processor(Image.open(path), return_tensors="pt")["pixel_values"]
    pre = hf_preprocess(processor.to_dict(), CFG)
    std = torch.tensor(pre.std).view(1, -1, 1, 1)
    levels = (model_input(pre, path) - ref).abs() * std / pre.rescale_factor
    assert float(levels.max()) <= 1.0 + 1e-3


def test_a_pixel_changing_key_vitkit_does_not_read_is_refused_in_one_line(tmp_path):
    transformers = import_reference("transformers")
    folder = tmp_path / "hf"
    hf = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=3,
    )  # fmt: skip
    transformers.ViTForImageClassification(hf).save_pretrained(folder)
    pp = {**transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}).to_dict()}
    harmless = {"processor_class": "ViTProcessor", "do_reduce_labels": True, "do_pad": False}
    (folder / "preprocessor_config.json").write_text(json.dumps({**pp, **harmless}))
    load_model(folder)  # bookkeeping and a step switched off: fine
    (folder / "preprocessor_config.json").write_text(json.dumps({**pp, "do_pad": True}))
    with pytest.raises(VitkitError) as e:
        load_model(folder)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{folder / 'preprocessor_config.json'}: do_pad=True")


def test_what_cannot_be_one_input_size_is_refused():
    with pytest.raises(VitkitError, match="its own size"):
        hf_preprocess({"size": {"shortest_edge": 224}, "do_center_crop": False}, CFG)
    with pytest.raises(VitkitError, match="longest_edge"):
        hf_preprocess({"size": {"longest_edge": 224}}, CFG)


def test_hf_predict_gives_transformers_logits_with_do_normalize_false(tmp_path, capsys):
    """End to end: a folder written by transformers, ``vitkit predict`` on a real photo."""
    from vitkit.cli import main

    transformers = import_reference("transformers")
    hf = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=10,
    )  # fmt: skip
    ref = perturbed(transformers.ViTForImageClassification(hf), seed=1)
    ref.save_pretrained(tmp_path / "hf")
    processor = transformers.ViTImageProcessorPil(
        size={"height": 32, "width": 32}, do_normalize=False
    )
    processor.save_pretrained(tmp_path / "hf")
    path = photo(tmp_path, "chelsea")
    with torch.no_grad():
        logits = ref(**processor(Image.open(path), return_tensors="pt")).logits
    model, ckpt = load_model(tmp_path / "hf")
    with torch.no_grad():
        ours = model(model_input(ckpt.preprocess, path))
    torch.testing.assert_close(ours, logits, atol=1e-4, rtol=1e-4)
    capsys.readouterr()
    assert main(["predict", str(path), "--from", str(tmp_path / "hf"), "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top_k"]
    probs = logits.softmax(-1)[0]
    assert [q["index"] for q in top] == probs.topk(5).indices.tolist()
    assert [q["prob"] for q in top] == pytest.approx(probs.topk(5).values.tolist(), abs=1e-4)


# ---------------------------------------------------------------------------------------------
# timm


TIMM_CFGS = {
    "defaults": {},  # timm: ImageNet's mean and std, bicubic, crop_pct 0.875, "center"
    "crop-0.85-bilinear": {"crop_pct": 0.85, "interpolation": "bilinear", "mean": [0.5] * 3},
    "squash-0.9": {"crop_pct": 0.9, "crop_mode": "squash", "std": [0.5] * 3},
    "crop-1": {"crop_pct": 1.0, "interpolation": "bicubic"},
}


@pytest.mark.parametrize("name", ["chelsea", "astronaut"])
@pytest.mark.parametrize("case", list(TIMM_CFGS))
def test_timm_pretrained_cfg_is_timms_own_eval_transform(tmp_path, case, name):
    """chelsea at crop_pct 0.85 is 395 x 263 before its crop: an offset of 85.5, which
    torchvision's CenterCrop rounds half to even (86), where floor gives 85."""
    timm = import_reference("timm")
    from timm.data import create_transform, resolve_data_config

    pretrained = {"input_size": (3, 224, 224), **TIMM_CFGS[case]}
    transform = create_transform(**resolve_data_config(pretrained_cfg=pretrained))
    path = photo(tmp_path, name)
    ref = transform(Image.open(path).convert("RGB")).unsqueeze(0)
    pre = timm_hub_preprocess({"pretrained_cfg": pretrained}, CFG)
    torch.testing.assert_close(model_input(pre, path), ref, atol=1e-5, rtol=1e-6)
    del timm


def test_timm_border_crop_mode_is_refused():
    with pytest.raises(VitkitError, match="crop_mode='border'"):
        timm_hub_preprocess({"pretrained_cfg": {"crop_mode": "border"}}, CFG)


# ---------------------------------------------------------------------------------------------
# 16-bit, 32-bit integer and float images


def write_png16(path: Path, rgb: np.ndarray) -> None:
    """A 16-bit RGB PNG (colour type 2, bit depth 16), written by hand."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    h, w, _ = rgb.shape
    rows = b"".join(b"\0" + rgb[y].astype(">u2").tobytes() for y in range(h))
    header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
    path.write_bytes(png + chunk(b"IEND", b""))


def wide_copies(tmp_path: Path) -> tuple[Path, Path, dict[str, Path]]:
    """chelsea as 8-bit RGB and gray PNGs, and its wide copies with the same pixels."""
    rgb = np.asarray(Image.open(photo(tmp_path, "chelsea")))
    gray = np.asarray(Image.open(photo(tmp_path, "chelsea")).convert("L"))
    Image.fromarray(gray).save(tmp_path / "gray8.png")
    wide = {
        "gray16.png": Image.fromarray(gray.astype(np.uint16) * 257),  # mode I;16
        "gray_i.tif": Image.fromarray(gray.astype(np.int32) * 257),  # mode I
        "gray_f.tif": Image.fromarray(gray.astype(np.float32) / 255),  # mode F
    }
    for file, img in wide.items():
        img.save(tmp_path / file)
    write_png16(tmp_path / "rgb16.png", rgb.astype(np.uint16) * 257)  # PIL cannot write one
    paths = {file: tmp_path / file for file in (*wide, "rgb16.png")}
    return tmp_path / "chelsea.png", tmp_path / "gray8.png", paths


def test_16_bit_and_float_images_give_their_8_bit_copys_input(tmp_path):
    rgb8, gray8, wide = wide_copies(tmp_path)
    modes = {f: Image.open(p).mode for f, p in wide.items()}
    assert modes == {
        "gray16.png": "I;16",
        "gray_i.tif": "I",
        "gray_f.tif": "F",
        "rgb16.png": "RGB",
    }  # fmt: skip  (as this PIL reads them)
    pre = PreprocessConfig(image_size=(224, 224))
    for file, path in wide.items():
        eight = rgb8 if file.startswith("rgb") else gray8
        delta = (model_input(pre, path) - model_input(pre, eight)).abs().max()
        assert float(delta) * pre.std[0] <= 1 / 255 + 1e-6, file  # measured: 0 (exact)


def test_an_image_folder_scales_16_bit_images_too(tmp_path):
    _, gray8, wide = wide_copies(tmp_path)
    (tmp_path / "data" / "cat").mkdir(parents=True)
    for name, src in (("a.png", gray8), ("b.png", wide["gray16.png"])):
        (tmp_path / "data" / "cat" / name).write_bytes(src.read_bytes())
    data = ImageFolderDataset(tmp_path / "data", 64)
    (a, _), (b, _) = data[0], data[1]  # type: ignore[misc]
    assert torch.equal(a, b) and int(b.float().mean()) > 20 and int(b.max()) < 255


def test_float_pixels_with_no_range_to_scale_by_are_refused(tmp_path):
    Image.fromarray(np.full((8, 8), -1.0, np.float32)).save(tmp_path / "neg.tif")
    with pytest.raises(VitkitError, match="neg.tif: cannot read image .*no range"):
        load_images([tmp_path / "neg.tif"], PreprocessConfig(image_size=(8, 8)))


def test_eval_on_an_image_folder_feeds_what_predict_feeds(tmp_path):
    """``vitkit eval``'s data path: the checkpoint's own resize, crop and rescaling too (a
    folder's default transform crops at 0.875 and divides by 255)."""
    from vitkit.checkpoints import Checkpoint
    from vitkit.eval.checkpoint_eval import _prepare, checkpoint_dataset

    pp = {"size": {"height": 64, "width": 48}, "do_rescale": False, "image_mean": [0.2] * 3}
    pre = hf_preprocess(pp, CFG)
    ckpt = Checkpoint(tmp_path / "ckpt", CFG.replace(num_classes=2), pre, {})
    paths = []
    for i, name in enumerate(("chelsea", "astronaut")):
        (tmp_path / "data" / f"c{i}").mkdir(parents=True)
        paths.append(tmp_path / "data" / f"c{i}" / f"{name}.png")
        paths[-1].write_bytes(photo(tmp_path, name).read_bytes())
    data = checkpoint_dataset(ckpt, str(tmp_path / "data"), "all", None, check_classes=False)
    batch = torch.stack([data[i][0] for i in range(len(data))])
    torch.testing.assert_close(_prepare(ckpt)(batch), model_input(pre, *paths))


def test_no_resize_and_no_crop_is_said_as_transformers_refuses_other_sizes(tmp_path, capsys):
    """``do_resize: false`` without a crop: transformers feeds an image as it is and refuses one
    that is not the model's size; vitkit crops (or pads) it to the size without a word. Now the
    difference is said when the folder is read, with the override; a crop is not affected."""
    from vitkit.cli import main
    from vitkit.errors import AssumptionWarning

    transformers = import_reference("transformers")
    folder = tmp_path / "hf"
    hf = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=3,
    )  # fmt: skip
    model = transformers.ViTForImageClassification(hf).eval()
    model.save_pretrained(folder)
    processor = transformers.ViTImageProcessorPil(do_resize=False)
    (folder / "preprocessor_config.json").write_text(json.dumps(processor.to_dict()))
    img = tmp_path / "big.png"
    Image.fromarray(np.zeros((48, 48, 3), dtype=np.uint8)).save(img)
    with pytest.raises(ValueError, match="doesn't match"):  # transformers refuses the image
        model(processor(Image.open(img), return_tensors="pt")["pixel_values"])
    with pytest.warns(AssumptionWarning, match=r"resize='none' assumed .* 32x32 px") as said:
        load_model(folder)
    assert "resize='squash'" in str(said[0].message)
    assert main(["predict", str(img), "--from", str(folder), "-o", "resize=squash"]) == 0
    assert "assumed" not in capsys.readouterr().err  # stated: nothing said
    crop = transformers.ViTImageProcessorPil(do_resize=False, do_center_crop=True, crop_size=32)
    (folder / "preprocessor_config.json").write_text(json.dumps(crop.to_dict()))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", AssumptionWarning)
        load_model(folder)  # a crop to the size: transformers' own pixels, nothing to say
