"""``arch=`` on a bare timm state dict trained at another input size: the grid is a free
setting of a name, as ``timm.create_model(name, img_size=...)`` takes it, so such weights load
and equal timm's; a square grid read off the rows and a patch other than the name's are each
said in one line, and a table that fills no grid is refused naming the rows and the patch."""

from __future__ import annotations

import warnings

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import save_file

import vitkit
from vitkit.errors import AssumptionWarning, VitkitError

NAME = "vit_tiny_patch16_224"
SMALL = {"depth": 2, "num_classes": 5}


def _bare(tmp_path, **kw):
    timm = import_reference("timm")
    ref = perturbed(timm.create_model(NAME, **SMALL, **kw))
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return ref, path


def _load(path, **kw):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = vitkit.load(path, arch=NAME, **kw)
    return model, [str(w.message) for w in seen if issubclass(w.category, AssumptionWarning)]


def _same(ours, ref, shape):
    x = torch.randn(2, 3, *shape)
    with torch.no_grad():
        a, b = ours(x), ref(x)
    assert (a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max()))


def test_weights_at_another_size_load_as_timm_builds_them(tmp_path):
    ref, path = _bare(tmp_path, img_size=64)
    ours, said = _load(path)  # the grid from the rows: square, said
    assert ours.cfg.image_size == (64, 64) and ours.pretrained_cfg["input_size"] == (3, 64, 64)
    assert any("4x4 grid, not vit_tiny_patch16_224's 14x14: read at 64x64 px" in s for s in said)
    _same(ours, ref, (64, 64))
    ours, said = _load(path, image_size=64)  # the size given: nothing assumed
    assert not any("grid" in s for s in said)
    _same(ours, ref, (64, 64))


def test_a_non_square_grid_needs_saying(tmp_path):
    ref, path = _bare(tmp_path, img_size=(32, 64))
    with pytest.raises(VitkitError, match=r"1 prefix rows .* leave 8 for the patches, which fill "
                       r"no square grid; give grid="):  # fmt: skip
        vitkit.load(path, arch=NAME)
    ours, said = _load(path, grid=(2, 4))
    assert ours.cfg.image_size == (32, 64)
    _same(ours, ref, (32, 64))
    ours, _ = _load(path, image_size=(32, 64))
    _same(ours, ref, (32, 64))


def test_a_patch_other_than_the_names_is_the_cause_said(tmp_path):
    ref, path = _bare(tmp_path, img_size=32, patch_size=8)
    ours, said = _load(path)
    assert any("the weights' patch is 8x8, the name's 16x16" in s for s in said), said
    assert not any("pos_prefix" in s for s in said)
    _same(ours, ref, (32, 32))
    with pytest.raises(VitkitError, match=r"not a 3x3 grid; the weights' patch is 8x8, the name's"):
        vitkit.load(path, arch=NAME, grid=(3, 3))


def test_a_folder_whose_size_the_rows_contradict_names_the_cause(tmp_path):
    """A timm folder's config fixes its input size: rows that do not fit it are refused, saying
    the rows, the grid and the real cause (another size, or another patch than the name's)."""
    import json

    for kw, cause in (
        (dict(img_size=64), "trained at another input size"),
        (dict(img_size=32, patch_size=8), "the weights' patch is 8x8, the name's 16x16"),
    ):
        _, path = _bare(tmp_path, **kw)
        folder = tmp_path / f"folder{len(kw)}"
        folder.mkdir()
        path.rename(folder / "model.safetensors")
        config = {"architecture": NAME, "num_classes": 5, "model_args": {"img_size": 224}}
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(VitkitError, match=r"pos_embed: 17 rows, not the entry's 1 prefix \+ "
                           rf"\d+x\d+ patches of a 224x224 input .*{cause}"):  # fmt: skip
            vitkit.load(folder)
