"""E_pos at another input size is resampled with the kernel of the checkpoint's source
(vitkit.checkpoints.posemb_kernels): timm's antialiased bicubic for everything read from timm,
each Hugging Face class's own, vitkit's recorded one. Live timm and transformers on identical
random weights at a second input size (a 2x2 patch grid to 3x4), on the fly (timm's
``dynamic_img_size``, transformers' ``interpolate_pos_encoding``) and at load time (timm's
``create_model(pretrained=True, img_size=...)`` through its checkpoint filter, against
``vitkit.load(..., image_size=...)``). The two bicubics differ by ~1e-3, so each check fails
with the other kernel (asserted too)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from references import import_reference, perturbed
from safetensors.torch import save_file

import vitkit
from vitkit.checkpoints import load_state_dict_strict, read_checkpoint, write_checkpoint
from vitkit.cli import main
from vitkit.data import DataInfo
from vitkit.errors import AssumptionWarning, VitkitError
from vitkit.models.posemb_resample import (
    RESAMPLE_MODES,
    Resample,
    antialias_matrix,
    antialiased,
    resample_pos_embed,
)
from vitkit.models.vit import build_model
from vitkit.train.setup import init_checkpoint
from vitkit.train.train_config import TrainConfig

AA: Resample = "bicubic-antialias"
OWN, SECOND = (32, 32), (48, 64)  # 16 px patches: a 2x2 grid, then 3x4
TINY = dict(img_size=32, patch_size=16, embed_dim=64, depth=2, num_heads=2, num_classes=5)
TIMM_NAMES = [
    "vit_base_patch16_224",  # the paper's layout: class token, E_pos over it
    "vit_base_patch16_reg4_gap_256",  # registers, E_pos on the patches only, average pool
    "deit3_small_patch16_224",  # DeiT-III: layer scale, E_pos on the patches only
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def pixels(size: tuple[int, int], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2), dtype=dtype)


def quiet_read(path: Path, **kw: Any) -> tuple[torch.nn.Module, list[str]]:
    """vitkit's float64 model of ``path`` and the AssumptionWarning lines said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(path, **kw)
    model = build_model(ckpt.model_config).double().eval()
    load_state_dict_strict(model, ckpt.state_dict, source=str(path))
    said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    # (one warning: a summary line, then a line a setting, here each with the file's name)
    said = [f"{path}: {s.strip()}" for block in said for s in block.splitlines()[1:]]
    return model, said


def timm_files(tmp_path: Path, name: str, **kw: Any) -> tuple[Any, Path, Path]:
    """A small timm ``name`` (float32 random weights, so float64 copies of them agree
    exactly), its ``save_for_hf`` folder and its bare state dict."""
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    ref = perturbed(timm.create_model(name, **{**TINY, **kw}))
    folder = tmp_path / "hub"
    save_for_hf(ref, str(folder), safe_serialization=True)
    bare = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(bare))
    return ref, folder, bare


def timm_at(name: str, path: Path, size: tuple[int, int], **kw: Any) -> torch.nn.Module:
    """timm's ``name`` built for ``size`` from the weights file ``path``: its checkpoint
    filter resamples E_pos (as ``create_model(..., pretrained=True, img_size=...)`` does)."""
    timm = import_reference("timm")
    overlay = dict(file=str(path), num_classes=TINY["num_classes"])
    args = {**TINY, **kw, "img_size": size}
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **args)
    return model.double().eval()


def test_the_antialiased_bicubic_is_pytorchs_and_timms_and_not_the_plain_one():
    timm = import_reference("timm")
    from timm.layers import resample_abs_pos_embed

    assert RESAMPLE_MODES == ("bicubic", "bicubic-antialias", "bilinear", "zoom")
    pos = torch.randn(1, 1 + 16, 8, generator=torch.Generator().manual_seed(0))
    for new in [(6, 8), (3, 3), (2, 5)]:  # larger, smaller (the support widens), mixed
        got = resample_pos_embed(pos, (4, 4), new, 1, AA)
        assert torch.equal(got, resample_abs_pos_embed(pos, list(new), [4, 4], 1))  # timm's
        grid = pos[:, 1:].reshape(1, 4, 4, 8).permute(0, 3, 1, 2)
        want = F.interpolate(grid, size=new, mode="bicubic", antialias=True)
        assert torch.equal(got[:, 1:], want.permute(0, 2, 3, 1).reshape(1, -1, 8))
        plain = resample_pos_embed(pos, (4, 4), new, 1, "bicubic")
        assert rel(plain, got) > 1e-3  # two kernels
    for mode in RESAMPLE_MODES:
        assert resample_pos_embed(pos, (4, 4), (4, 4), 1, mode) is pos  # its own grid
    assert timm.__version__ == "1.0.31"  # (the module's source lines are this version's)


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_on_the_fly_equals_dynamic_img_size(tmp_path, name):
    """timm's ``dynamic_img_size`` forward resamples E_pos with antialiasing; vitkit reading
    its folder or its bare state dict does the same at the second size: logits and features
    exact in float64."""
    timm = import_reference("timm")
    ref, folder, bare = timm_files(tmp_path, name)
    dynamic = timm.create_model(name, **TINY, dynamic_img_size=True).double().eval()
    dynamic.load_state_dict(ref.state_dict())
    x = pixels(SECOND)
    with torch.no_grad():
        want, want_features = dynamic(x), dynamic.forward_features(x)
    for path, kw in ((folder, {}), (bare, {"num_heads": 2})):
        model, _ = quiet_read(path, **kw)
        assert model.resample == AA and model.cfg.pos_resample == AA
        with torch.no_grad():
            assert rel(model(x), want) <= 1e-12  # measured 0
            assert rel(model.forward_features(x), want_features) <= 1e-12
            model.resample = "bicubic"  # the kernel it had: the check can fail
            assert rel(model(x), want) > 1e-6


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_at_load_time_equals_its_checkpoint_filter(tmp_path, name):
    ref, folder, bare = timm_files(tmp_path, name)
    x = pixels(SECOND)
    with torch.no_grad():
        want = timm_at(name, folder / "model.safetensors", SECOND)(x)
    for path, kw in ((folder, {}), (bare, {"num_heads": 2})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AssumptionWarning)
            model = vitkit.load(path, image_size=SECOND, **kw).double()
            plain = vitkit.load(path, image_size=SECOND, resample="bicubic", **kw).double()
        assert model.cfg.grid_size == (3, 4) and model.cfg.pos_resample == AA
        with torch.no_grad():
            assert rel(model(x), want) <= 1e-12  # measured 0
            assert rel(plain(x), want) > 1e-6  # a mode given is the mode used
            assert plain.cfg.pos_resample == AA  # (and the model's own stays the source's)


def test_timm_flexivit_and_radio_filters_resample_bilinearly_at_load_time(tmp_path):
    """timm's FlexiViT and RADIO entries filter their checkpoints bilinearly (RADIO base v3
    with the corners aligned: vitkit's zoom, computed in float64, timm's in float32); their
    ``dynamic_img_size`` forward is still the antialiased bicubic."""
    timm = import_reference("timm")
    x = pixels(SECOND)
    for name, tol in (("flexivit_small", 1e-12), ("vit_base_patch16_radio_v3", 1e-6)):
        ref, folder, _ = timm_files(tmp_path / name, name)
        with torch.no_grad():
            want = timm_at(name, folder / "model.safetensors", SECOND)(x)
        model = vitkit.load(folder, image_size=SECOND).double()
        with torch.no_grad():
            assert rel(model(x), want) <= tol  # measured 0 and 4.8e-10
        dynamic = timm.create_model(name, **TINY, dynamic_img_size=True).double().eval()
        dynamic.load_state_dict(ref.state_dict())
        model, _ = quiet_read(folder)
        with torch.no_grad():
            assert model.resample == AA and rel(model(x), dynamic(x)) <= 1e-12


HF_CASES = {  # class: (config class, settings, the kernel its interpolate_pos_encoding uses)
    "ViTModel": ("ViTConfig", dict(intermediate_size=128), "bicubic"),
    "DeiTModel": ("DeiTConfig", dict(intermediate_size=128), "bicubic"),
    "Dinov2Model": ("Dinov2Config", dict(mlp_ratio=2), "bicubic"),
    "Dinov2WithRegistersModel": (
        "Dinov2WithRegistersConfig",
        dict(mlp_ratio=2, num_register_tokens=2),
        AA,
    ),
    "CLIPVisionModel": ("CLIPVisionConfig", dict(intermediate_size=128), "bicubic"),
    "SiglipVisionModel": ("SiglipVisionConfig", dict(intermediate_size=128), "bicubic"),
}
HF_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32)
HF_SECOND = (24, 40)  # 8 px patches: a 4x4 grid, then 3x5


def hf_model(cls: str, dtype: torch.dtype) -> Any:
    transformers = import_reference("transformers")
    cfg_cls, kw, _ = HF_CASES[cls]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_cls)(**HF_SMALL, patch_size=8, **kw)
    return perturbed(getattr(transformers, cls)(config).to(dtype))


def hf_features(ref: Any, x: torch.Tensor) -> torch.Tensor:
    """The last hidden state at ``x``'s size (the Dinov2 classes always interpolate)."""
    flag = {} if "Dinov2" in type(ref).__name__ else {"interpolate_pos_encoding": True}
    with torch.no_grad():
        return ref(x, **flag).last_hidden_state


@pytest.mark.parametrize("cls", list(HF_CASES))
def test_hugging_face_classes_kernels_on_the_fly_and_at_load_time(tmp_path, cls):
    """float32, where every class resamples in float32 as vitkit does: exact."""
    ref = hf_model(cls, torch.float32)
    ref.save_pretrained(tmp_path / "hf")
    kernel = HF_CASES[cls][2]
    x = pixels(HF_SECOND, torch.float32)
    want = hf_features(ref, x)
    model = vitkit.load(tmp_path / "hf")
    assert model.resample == kernel
    loaded = vitkit.load(tmp_path / "hf", image_size=HF_SECOND)
    assert loaded.cfg.grid_size == (3, 5)
    with torch.no_grad():
        assert rel(model.forward_features(x), want) <= 1e-7  # measured 0
        assert rel(loaded.forward_features(x), want) <= 1e-7  # measured 0
        model.resample = AA if kernel == "bicubic" else "bicubic"  # the other: it differs
        assert rel(model.forward_features(x), want) > 1e-5


@pytest.mark.parametrize("cls", ["Dinov2Model", "Dinov2WithRegistersModel"])
def test_dinov2_classes_in_float64(tmp_path, cls):
    """The Dinov2 classes resample in float32 and cast back, as vitkit: exact in float64 too
    (ViT, DeiT, CLIP and SigLIP resample in the model's dtype: 3e-8 to 6e-8 apart in float64,
    float32's rounding of the table)."""
    ref = hf_model(cls, torch.float64)
    ref.save_pretrained(tmp_path / "hf")
    model, said = quiet_read(tmp_path / "hf")
    assert not [s for s in said if "pos_resample" in s]  # a class says its kernel
    x = pixels(HF_SECOND)
    with torch.no_grad():
        assert rel(model.forward_features(x), hf_features(ref, x)) <= 1e-12


def test_a_bare_timm_state_dict_says_the_kernel_it_assumed(tmp_path):
    ref, folder, bare = timm_files(tmp_path, "vit_base_patch16_224")
    _, said = quiet_read(bare, num_heads=2)
    (line,) = [s for s in said if "pos_resample" in s]
    assert line.startswith(f"{bare}: pos_resample='bicubic-antialias' assumed (timm's kernel")
    assert "-o pos_resample=bicubic" in line and "\n" not in line
    model, said = quiet_read(bare, num_heads=2, overrides={"pos_resample": "bicubic"})
    assert not [s for s in said if "pos_resample" in s] and model.resample == "bicubic"
    ckpt = read_checkpoint(folder)  # a folder names its timm architecture: nothing assumed
    assert ckpt.provenance.sources["pos_resample"] == "name"
    assert ckpt.model_config.pos_resample == AA


def test_a_vitkit_checkpoint_keeps_its_sources_kernel(tmp_path):
    """Converted from timm, saved as vitkit, read back: still timm's kernel (recorded in its
    config.json), so its logits at another size stay timm's; a config written without the
    field gets the kernel of the format it says it was converted from."""
    timm = import_reference("timm")
    name = "vit_base_patch16_224"
    ref, folder, _ = timm_files(tmp_path, name)
    write_checkpoint(read_checkpoint(folder), tmp_path / "vk", "vitkit")
    config = json.loads((tmp_path / "vk" / "config.json").read_text())
    assert config["model"]["pos_resample"] == AA
    dynamic = timm.create_model(name, **TINY, dynamic_img_size=True).double().eval()
    dynamic.load_state_dict(ref.state_dict())
    model, said = quiet_read(tmp_path / "vk")
    x = pixels(SECOND)
    with torch.no_grad():
        assert said == [] and rel(model(x), dynamic(x)) <= 1e-12
    del config["model"]["pos_resample"]  # a config that does not hold one
    (tmp_path / "vk" / "config.json").write_text(json.dumps(config))
    assert read_checkpoint(tmp_path / "vk").model_config.pos_resample == AA  # converted_from
    assert vitkit.load_checkpoint(tmp_path / "vk").model_config.pos_resample == AA
    del config["meta"]["converted_from"]
    (tmp_path / "vk" / "config.json").write_text(json.dumps(config))
    assert read_checkpoint(tmp_path / "vk").model_config.pos_resample == "bicubic"
    model = vitkit.create_model("Ti/16", image_size=32, depth=1)  # vitkit's own: plain
    assert model.resample == "bicubic"
    model.resample = "zoom"  # the config's: a saved checkpoint keeps it
    vitkit.save_checkpoint(tmp_path / "own", model)
    assert read_checkpoint(tmp_path / "own").model_config.pos_resample == "zoom"


def test_convert_and_finetune_take_the_sources_kernel_unless_given(tmp_path, capsys):
    ref, folder, _ = timm_files(tmp_path, "vit_base_patch16_224")
    want = timm_at("vit_base_patch16_224", folder / "model.safetensors", SECOND).pos_embed
    to = ["--to", "vitkit", "--image-size", "48", "64"]
    assert main(["convert", str(folder), str(tmp_path / "out"), *to]) == 0
    got = read_checkpoint(tmp_path / "out").state_dict["pos_embed"]
    assert rel(got.double(), want) == 0  # timm's filter, exactly
    plain = tmp_path / "plain"
    args = ["convert", str(folder), str(plain), *to]
    assert main([*args, "--resample", "bicubic"]) == 0
    assert rel(read_checkpoint(plain).state_dict["pos_embed"].double(), want) > 1e-4
    assert main([*args, "--overwrite", "--resample", "lanczos"]) == 2
    assert "invalid choice: 'lanczos' (choose from 'bicubic', 'bicubic-antialias'" in (
        capsys.readouterr().err
    )
    info = DataInfo("folder", 3, ("a", "b", "c"), 3, SECOND, True)  # fine-tuning's init
    for mode, same in ((None, True), ("bicubic", False)):  # None: the source's kernel
        cfg = TrainConfig(data="x", init_from=str(folder), init_resample=mode)
        got = init_checkpoint(cfg, info).state_dict["pos_embed"].double()
        assert (rel(got, want) == 0) is same
    with pytest.raises(VitkitError, match="init_resample must be one of bicubic, bicubic-anti"):
        TrainConfig(data="x", init_resample="lanczos")  # type: ignore[arg-type]


def test_each_source_records_where_its_kernel_came_from(tmp_path):
    transformers = import_reference("transformers")
    ref = hf_model("Dinov2WithRegistersModel", torch.float32)
    ref.save_pretrained(tmp_path / "reg")
    ckpt = read_checkpoint(tmp_path / "reg")
    assert ckpt.model_config.pos_resample == AA
    assert ckpt.provenance.sources["pos_resample"] == "format"
    assert "dinov2_with_registers" in ckpt.provenance.notes["pos_resample"]
    vit = transformers.ViTModel(transformers.ViTConfig(**HF_SMALL, patch_size=8))
    vit.save_pretrained(tmp_path / "vit")
    assert read_checkpoint(tmp_path / "vit").model_config.pos_resample == "bicubic"
    with pytest.raises(VitkitError, match="pos_resample must be one of"):
        read_checkpoint(tmp_path / "vit", overrides={"pos_resample": "lanczos"})


def test_npz_takes_the_official_codes_zoom(tmp_path):
    """A Google ``.npz`` at another size: what vit_jax's ``load_pretrained`` and big_vision's
    ``resample_posemb`` do to the file's table (``scipy.ndimage.zoom(grid, ..., order=1)``),
    at load time and on the fly; a vitkit file converted from one before the kernel was
    recorded gets it too. (Plain bicubic, vitkit's earlier choice, is 1e-2 away.)"""
    import numpy as np
    from scipy import ndimage

    path = Path(__file__).parent / "fixtures" / "vit_jax" / "vit_token_p4.npz"
    ckpt = read_checkpoint(path)
    assert ckpt.model_config.pos_resample == "zoom"
    assert ckpt.provenance.sources["pos_resample"] == "format"
    assert "scipy.ndimage.zoom" in ckpt.provenance.notes["pos_resample"]
    table = torch.from_numpy(np.load(path)["Transformer/posembed_input/pos_embedding"])
    want = ndimage.zoom(table[0, 1:].reshape(8, 8, -1).numpy(), (12 / 8, 12 / 8, 1), order=1)
    loaded = vitkit.load(path, image_size=48)  # patch 4: 8x8 -> 12x12
    got = loaded.pos_embed.detach()
    assert torch.equal(got[:, :1], table[:, :1])  # the class token's row kept apart
    assert (got[0, 1:].reshape(12, 12, -1) - torch.from_numpy(want)).abs().max() <= 1e-6
    plain = resample_pos_embed(table, (8, 8), (12, 12), 1, "bicubic")
    assert (plain - got).abs().max() > 1e-3
    native = vitkit.load(path).eval()
    x = pixels((48, 48), torch.float32)
    with torch.no_grad():
        assert rel(native(x), loaded.eval()(x)) <= 1e-5  # on the fly: the same kernel
    main(["convert", str(path), str(tmp_path / "vk"), "--to", "vitkit"])
    config = json.loads((tmp_path / "vk" / "config.json").read_text())
    assert config["model"]["pos_resample"] == "zoom"
    del config["model"]["pos_resample"]  # as written before the kernel was recorded
    (tmp_path / "vk" / "config.json").write_text(json.dumps(config))
    assert read_checkpoint(tmp_path / "vk").model_config.pos_resample == "zoom"


# Grid sides of 2 and more: an export's range starts at 2 patches a side (PyTorch's own
# antialiased kernel computes a 14x1 -> 24x1 grid unlike its 14x2 -> 24x2 one's columns).
SIDES = [2, 3, 5, 7, 8, 12, 14, 16, 24, 37, 64]


@pytest.mark.parametrize("kind", ["bicubic", "bilinear"])
def test_the_antialias_matrices_are_pytorchs_antialiased_interpolate(kind: str) -> None:
    """An export of any size resamples an antialiased E_pos as two matrix products
    (OpenVINO's antialiased Resize is not PyTorch's): equal to F.interpolate(antialias=True) up
    and down, square or not, to float32 rounding; the plain kernel is not (so this can fail)."""
    g = torch.Generator().manual_seed(0)
    worst, plain = 0.0, 0.0
    for n, (old_h, old_w) in enumerate([(14, 14), (7, 5), (16, 16), (37, 24), (2, 3)]):
        grid = torch.randn(1, 16, old_h, old_w, generator=g)
        for h in SIDES:
            w = SIDES[(SIDES.index(h) + 3 + n) % len(SIDES)]  # non-square, up and down
            want = F.interpolate(grid, size=(h, w), mode=kind, align_corners=False, antialias=True)
            got = antialiased(grid, [h, w], kind)
            scale = want.abs().max()
            worst = max(worst, float((got - want).abs().max() / scale))
            other = F.interpolate(grid, size=(h, w), mode=kind, align_corners=False)
            plain = max(plain, float((other - want).abs().max() / scale))
    assert worst <= 2e-6, worst
    assert plain > 1e-2, plain  # shrinking: the antialiased kernel is another one
    rows = antialias_matrix(37, 8, kind)
    assert rows.shape == (8, 37) and torch.allclose(rows.sum(1), torch.ones(8))


def test_the_antialias_matrices_follow_a_traced_size() -> None:
    """The matrices are computed in the graph from the target size: one torch.export with a
    dynamic height and width equals F.interpolate at sizes it was not traced at."""

    class Resample(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return antialiased(self.grid, [x.shape[-2], x.shape[-1]], "bicubic")

    module = Resample()
    module.grid = torch.randn(1, 8, 14, 14)
    dims = {"x": {0: torch.export.Dim("h", min=2, max=64), 1: torch.export.Dim("w", min=2, max=64)}}
    program = torch.export.export(module, (torch.zeros(10, 20),), dynamic_shapes=dims)
    for h, w in [(3, 40), (28, 28), (7, 9), (64, 2)]:
        want = F.interpolate(module.grid, size=(h, w), mode="bicubic", antialias=True)
        got = program.module()(torch.zeros(h, w))
        assert float((got - want).abs().max() / want.abs().max()) <= 2e-6, (h, w)
