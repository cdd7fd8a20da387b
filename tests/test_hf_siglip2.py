"""Hugging Face's SigLIP 2 NaFlex tower (``Siglip2VisionModel``, the image tower of
``Siglip2Model``) ↔ vitkit's NaFlex: images of three aspect ratios packed in one batch give
transformers' pooled output and tokens in float64 on identical random weights, both directions,
round trips bitwise, the CLI, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.errors import AssumptionWarning, VitkitError
from vitkit.models.naflex_packing import attention_mask, embed, pack

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    patch_size=4,
    num_patches=16,  # E_pos on a 4 x 4 grid
)
# three aspect ratios: 2 x 6, 3 x 5 and 4 x 4 patches (the last is E_pos's own grid)
SIZES = ((8, 24), (12, 20), (16, 16))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_tower(**kw):
    transformers = import_reference("transformers")
    cfg = transformers.Siglip2VisionConfig(**{**SMALL, **kw})
    return perturbed(transformers.Siglip2VisionModel(cfg))


def saved(tmp_path, **kw):
    ref = hf_tower(**kw)
    ref.save_pretrained(tmp_path / "hf")
    return ref, tmp_path / "hf"


def batch(dtype=torch.float64, seed=1, sizes=SIZES, max_seq_len=18):
    g = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, h, w, generator=g, dtype=dtype) for h, w in sizes]
    packed = pack(images, (4, 4), max_seq_len)  # (padding: 18 > 16 patches)
    shapes = torch.tensor([(h // 4, w // 4) for h, w in sizes])
    hf_inputs = dict(
        pixel_values=packed["patches"],
        pixel_attention_mask=packed["patch_valid"].long(),
        spatial_shapes=shapes,
    )
    return packed, hf_inputs


def tokens(model, packed):
    """vitkit's final-normed NaFlex tokens (what transformers returns as last_hidden_state)."""
    x = embed(model, packed["patches"], packed["patch_coord"])
    mask = attention_mask(packed["patch_valid"], 0, x.dtype)
    for block in model.blocks:
        x = block(x, bias=mask)
    return model.norm(x)


@pytest.mark.parametrize("head", [True, False])
def test_three_aspect_ratios_in_one_batch_give_transformers_outputs(tmp_path, head):
    transformers = import_reference("transformers")
    ref, folder = saved(tmp_path, vision_use_head=head)
    ckpt = read_checkpoint(folder)
    cfg = ckpt.model_config
    assert (cfg.naflex, cfg.naflex_grid, cfg.naflex_interp, cfg.pool) == (
        True,
        (4, 4),
        "bilinear",
        "map" if head else "gap",
    )
    model = vitkit.load(folder).double()
    ref64 = ref.double()
    packed, hf_inputs = batch()
    valid = packed["patch_valid"]
    with torch.no_grad():
        out = ref64(**hf_inputs)
        ours = tokens(model, packed)
        assert rel(ours[valid], out.last_hidden_state[valid]) <= 1e-12
        if head:
            assert rel(model(packed), out.pooler_output) <= 1e-12
        else:  # no head: the masked mean of the valid tokens (Siglip2ForImageClassification's)
            keep = valid[..., None].double()
            mean = (out.last_hidden_state * keep).sum(1) / keep.sum(1)
            assert rel(model(packed), mean) <= 1e-12
        # an image tensor is one image on its full grid
        x = torch.randn(1, 3, 12, 20, dtype=torch.float64)
        one = pack([x[0]], (4, 4))
        shapes = torch.tensor([(3, 5)])
        mask = one["patch_valid"].long()
        one_hf = ref64(
            pixel_values=one["patches"], pixel_attention_mask=mask, spatial_shapes=shapes
        )
        assert rel(model.forward_features(x), one_hf.last_hidden_state) <= 1e-12
    if not head:
        return
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    again, info = transformers.Siglip2VisionModel.from_pretrained(
        tmp_path / "back", output_loading_info=True
    )
    assert not any(info.values()), info
    theirs = load_file(folder / "model.safetensors")
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert theirs.keys() == back.keys() and all(torch.equal(theirs[k], back[k]) for k in back)
    assert read_checkpoint(tmp_path / "back").model_config == cfg


def test_the_resampling_switches_matter(tmp_path):
    """Parity needs transformers' resampling: bicubic is far off; with weights that are float64
    beyond float32's precision, the table unresampled at its own grid (timm's shortcut) differs
    from transformers' float32 round trip. The tolerance above catches both."""
    ref = perturbed(hf_tower().double(), seed=5)  # (float64 noise: not float32-representable)
    ref.save_pretrained(tmp_path / "hf")
    folder = tmp_path / "hf"
    packed, hf_inputs = batch(seed=2)
    from vitkit.models.vit import build_model

    def load64(**kw):  # (float64 parameters first: loading keeps the weights' precision)
        ckpt = read_checkpoint(folder, overrides=kw)
        model = build_model(ckpt.model_config).double()
        model.load_state_dict(ckpt.state_dict)
        return model.eval()

    with torch.no_grad():
        want = ref(**hf_inputs).pooler_output
        exact = rel(load64()(packed), want)
        own = rel(load64(naflex_resample_own=False)(packed), want)
        cubic = rel(load64(naflex_interp="bicubic")(packed), want)
    assert exact <= 1e-12 and 1e-12 < own < 1e-5 and cubic > 1e-3, (exact, own, cubic)


def test_a_whole_siglip2_model_reads_its_image_tower(tmp_path):
    transformers = import_reference("transformers")
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    cfg = transformers.Siglip2Config(
        vision_config=SMALL, text_config={**text, "vocab_size": 50, "max_position_embeddings": 8}
    )
    whole = perturbed(transformers.Siglip2Model(cfg))
    whole.save_pretrained(tmp_path / "whole")
    model = vitkit.load(tmp_path / "whole").double()
    packed, hf_inputs = batch(seed=3)
    with torch.no_grad():
        want = whole.double().vision_model(**hf_inputs).pooler_output
        assert rel(model(packed), want) <= 1e-12


def test_siglip2_converts_and_inspects_from_the_command_line(tmp_path, capsys):
    from vitkit.cli import main

    ref, folder = saved(tmp_path)
    processor = import_reference("transformers").Siglip2ImageProcessor(patch_size=4)
    processor.save_pretrained(folder)
    with pytest.warns(AssumptionWarning, match="max_num_patches=256.*--max-seq-len 256"):
        assert main(["inspect", str(folder)]) == 0
    shown = capsys.readouterr().out
    assert "naflex" in shown
    for to, dst in (("vitkit", "ours"), ("timm", "timm")):
        assert main(["convert", str(folder), str(tmp_path / dst), "--to", to]) == 0
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "back"), "--to", "hf"]) == 0
    a, b = (load_file(f / "model.safetensors") for f in (folder, tmp_path / "back"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    pp = json.loads((tmp_path / "back" / "preprocessor_config.json").read_text())
    assert pp["image_processor_type"] == "Siglip2ImageProcessor" and pp["patch_size"] == 4
    packed, hf_inputs = batch(seed=4, sizes=((8, 24), (12, 20)), dtype=torch.float32)
    with torch.no_grad():
        want = ref(**hf_inputs).pooler_output
        assert rel(vitkit.load(tmp_path / "back")(packed), want) <= 1e-5
        assert rel(vitkit.load(tmp_path / "timm")(packed), want) <= 1e-5


def test_what_siglip2_cannot_hold_is_refused(tmp_path):
    ref, folder = saved(tmp_path)
    hub = json.loads((folder / "config.json").read_text())
    for change, match in (
        ({"num_patches": 15}, "num_patches=15 is not a square"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"patch_size": [4, 4]}, "square patches"),
    ):
        (folder / "config.json").write_text(json.dumps({**hub, **change}))
        with pytest.raises(VitkitError, match=match):
            read_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(hub))
    sd = load_file(folder / "model.safetensors")
    save_file({**sd, "extra.weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"extra\.weight .*Siglip2VisionModel"):
        read_checkpoint(folder)
    save_file(sd, str(folder / "model.safetensors"))
    ckpt = read_checkpoint(folder, overrides={"naflex_interp": "bicubic"})
    with pytest.raises(VitkitError, match="NaFlex tower .* resampling other than bilinear"):
        write_checkpoint(ckpt, tmp_path / "cubic", "hf")


def test_a_processor_for_other_patches_is_refused(tmp_path):
    ref, folder = saved(tmp_path)
    processor = import_reference("transformers").Siglip2ImageProcessor(patch_size=16)
    processor.save_pretrained(folder)
    with pytest.raises(VitkitError, match="patch_size=16 is not the model's 4"):
        read_checkpoint(folder)
