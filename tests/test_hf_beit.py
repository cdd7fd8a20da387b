"""Hugging Face's BEiT (``BeitModel``, ``BeitForImageClassification``) ↔ vitkit: logits and
pooled output equal to live transformers models in float64 on identical random weights (a
relative position bias per layer or shared, layer scale or none, mean pooling or the class
token, E_pos or none), both directions, round trips bitwise, the CLI, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.errors import VitkitError

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
)
VARIANTS = {
    # BEiT's fine-tuned classifiers: a bias per layer, layer scale, mean pooling + norm
    "relpos": dict(use_relative_position_bias=True, num_labels=3),
    # BEiT's pre-trained layout: one shared bias, E_pos, the class token, no layer scale
    "shared": dict(
        use_shared_relative_position_bias=True,
        use_absolute_position_embeddings=True,
        use_mean_pooling=False,
        layer_scale_init_value=0.0,
        use_mask_token=True,
    ),
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def saved(tmp_path, variant, **more):
    transformers = import_reference("transformers")
    kw = {**VARIANTS[variant], **more}
    cfg = transformers.BeitConfig(**SMALL, **kw)
    cls = (
        transformers.BeitForImageClassification if kw.get("num_labels") else transformers.BeitModel
    )
    ref = perturbed(cls(cfg))
    ref.save_pretrained(tmp_path / "hf")
    return cls, ref, tmp_path / "hf"


def output(ref, x):
    out = ref(pixel_values=x)
    return out.logits if hasattr(out, "logits") else out.pooler_output


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_beit_reads_and_writes_exactly(tmp_path, variant):
    cls, ref, folder = saved(tmp_path, variant)
    ckpt = read_checkpoint(folder)
    cfg = ckpt.model_config
    assert (cfg.rel_pos, cfg.k_bias, cfg.has_class_token) == ("bias", False, True)
    assert cfg.rel_pos_shared == (variant == "shared")
    assert cfg.num_classes == VARIANTS[variant].get("num_labels", 0)
    model = vitkit.load(folder).double()
    ref64 = ref.double()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        assert rel(model(x), output(ref64, x)) <= 1e-12
        hidden = (ref64.beit if hasattr(ref64, "beit") else ref64)(pixel_values=x)
        # (mean pooling: the last tokens are not normed, in both; else the final norm's)
        assert rel(model.forward_features(x), hidden.last_hidden_state) <= 1e-12
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    again, info = cls.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        assert rel(output(again.double().eval(), x), model(x)) <= 1e-12
    theirs = load_file(folder / "model.safetensors")
    ours = load_file(tmp_path / "back" / "model.safetensors")
    mask = {k for k in theirs if k.endswith("mask_token")}
    assert theirs.keys() - mask == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)
    assert read_checkpoint(tmp_path / "back").model_config == cfg


def test_transformers_5_module_names_read_as_the_saved_ones(tmp_path):
    _, ref, folder = saved(tmp_path, "relpos")
    renames = (
        (".encoder.layer.", ".layers."),
        (".attention.attention.query.", ".attention.q_proj."),
        (".attention.attention.key.", ".attention.k_proj."),
        (".attention.attention.value.", ".attention.v_proj."),
        (".attention.output.dense.", ".attention.o_proj."),
        (".intermediate.dense.", ".mlp.fc1."),
        (".output.dense.", ".mlp.fc2."),
        (".attention.attention.relative_position_bias.", ".relative_position_bias."),
    )
    sd = load_file(folder / "model.safetensors")
    five = {}
    for k, v in sd.items():
        for old, new in renames:
            k = k.replace(old, new)
        five[k] = v
    assert five.keys() != sd.keys()
    save_file(five, str(folder / "model.safetensors"))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert rel(vitkit.load(folder)(x), output(ref, x)) <= 1e-5


def test_beit_converts_to_timm_and_back_from_the_command_line(tmp_path, capsys):
    from vitkit.cli import main

    _, ref, folder = saved(tmp_path, "relpos", layer_norm_eps=1e-6)  # (timm's BEiT's epsilon)
    assert main(["inspect", str(folder)]) == 0
    assert "rel_pos" in capsys.readouterr().out
    assert main(["convert", str(folder), str(tmp_path / "timm"), "--to", "timm"]) == 0
    assert main(["convert", str(tmp_path / "timm"), str(tmp_path / "back"), "--to", "hf"]) == 0
    a, b = (load_file(f / "model.safetensors") for f in (folder, tmp_path / "back"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(vitkit.load(tmp_path / "timm")(x), output(ref, x)) <= 1e-5
    import numpy as np
    from PIL import Image

    image = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), np.uint8)).save(image)
    capsys.readouterr()
    assert main(["predict", str(image), "--from", str(folder), "--json", "--top-k", "3"]) == 0
    assert len(json.loads(capsys.readouterr().out)["top_k"]) == 3


def test_what_beit_cannot_hold_or_does_not_say_is_refused(tmp_path):
    _, ref, folder = saved(tmp_path, "relpos")
    hub = json.loads((folder / "config.json").read_text())
    for change, match in (
        ({"use_shared_relative_position_bias": True}, "one or the other"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"patch_size": [8, 8]}, "needs an int"),
    ):
        (folder / "config.json").write_text(json.dumps({**hub, **change}))
        with pytest.raises(VitkitError, match=match):
            read_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(hub))
    sd = load_file(folder / "model.safetensors")
    save_file({**sd, "extra.weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"not understood: extra\.weight"):
        read_checkpoint(folder)
    del sd["beit.encoder.layer.1.lambda_2"]
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"missing 'beit\.encoder\.layer\.1\.lambda_2'"):
        read_checkpoint(folder)
    # another input size: the table belongs to its grid (transformers resamples it its way)
    (folder / "config.json").write_text(json.dumps(hub))
    ref.save_pretrained(folder)
    with pytest.raises(VitkitError, match="learned for a 4x4 patch grid"):
        vitkit.load(folder)(torch.randn(1, 3, 40, 40))
    # a pooling BEiT has no: refused by name
    from vitkit.checkpoints import Checkpoint
    from vitkit.registry.model_config import PreprocessConfig

    model = vitkit.create_model(
        "Ti/8",
        image_size=32,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        num_classes=2,
        rel_pos="bias",
        k_bias=False,
        class_token=True,
        pool="gap",
    )
    cfg = model.cfg
    ckpt = Checkpoint(tmp_path / "src", cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    with pytest.raises(VitkitError, match="BEiT cannot hold a pooling other than"):
        write_checkpoint(ckpt, tmp_path / "gap", "hf")


def test_bare_beit_weights_ask_for_their_folder(tmp_path):
    """A classifier's bare weights (keys under ``beit.``) are known as Hugging Face's."""
    from vitkit.checkpoints.formats import detect_format

    _, _, folder = saved(tmp_path, "relpos")
    (tmp_path / "bare").mkdir()
    bare = (folder / "model.safetensors").rename(tmp_path / "bare" / "model.safetensors")
    assert detect_format(bare) == "hf"
    with pytest.raises(VitkitError, match="Hugging Face weights need their folder"):
        read_checkpoint(bare)
