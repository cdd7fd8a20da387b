"""Hugging Face's DINOv3 ViT (``DINOv3ViTModel``) ↔ vitkit: pooled output and tokens equal to
live transformers models in float64 on identical random weights (at the model's size and at
another aspect ratio), both directions, round trips bitwise, the CLI, refusals."""

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
    num_attention_heads=2,  # head_dim 16: four RoPE periods per axis
    image_size=32,
    patch_size=8,
)
VARIANTS = {
    "plain": dict(num_register_tokens=2),  # q / v biases (DINOv3's default), GELU MLP
    "gated": dict(use_gated_mlp=True, hidden_act="silu", key_bias=True, num_register_tokens=4),
    "nobias": dict(query_bias=False, value_bias=False, rope_theta=10000.0),
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_dinov3(**kw):
    transformers = import_reference("transformers")
    cfg = transformers.DINOv3ViTConfig(**{**SMALL, **kw})
    return perturbed(transformers.DINOv3ViTModel(cfg))


def saved(tmp_path, **kw):
    ref = hf_dinov3(**kw)
    ref.save_pretrained(tmp_path / "hf")
    return ref, tmp_path / "hf"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dinov3_vit_model_reads_and_writes_exactly(tmp_path, variant):
    transformers = import_reference("transformers")
    ref, folder = saved(tmp_path, **VARIANTS[variant])
    ckpt = read_checkpoint(folder)
    cfg = ckpt.model_config
    assert (cfg.rope, cfg.rope_half, cfg.rope_hf, cfg.abs_pos_embed) == ("dinov3", 1, 1, 0)
    assert cfg.num_reg_tokens == VARIANTS[variant].get("num_register_tokens", 0)
    model = vitkit.load(folder).double()
    ref64 = ref.double()
    g = torch.Generator().manual_seed(1)
    # the model's size, and another aspect ratio (RoPE follows the grid: 3 x 5 patches)
    for shape in ((2, 3, 32, 32), (1, 3, 24, 40)):
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        with torch.no_grad():
            out = ref64(pixel_values=x)
            pooled, tokens = (
                rel(model(x), out.pooler_output),
                rel(model.forward_features(x), out.last_hidden_state),
            )
        assert pooled <= 1e-12 and tokens <= 1e-12, (shape, pooled, tokens)
    # vitkit → Hugging Face: transformers loads it with no missing / unexpected keys
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    again, info = transformers.DINOv3ViTModel.from_pretrained(
        tmp_path / "back", output_loading_info=True
    )
    assert not any(info.values()), info
    x = torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64)
    with torch.no_grad():
        assert rel(again.double().eval()(pixel_values=x).pooler_output, model(x)) <= 1e-12
    theirs = load_file(folder / "model.safetensors")
    ours = load_file(tmp_path / "back" / "model.safetensors")
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours if k != "embeddings.mask_token")
    assert read_checkpoint(tmp_path / "back").model_config == cfg


def test_timms_rope_arithmetic_is_not_taken_for_transformers(tmp_path):
    """The rope switches must matter: timm's angle arithmetic (rope_hf=False) is float32-rounding
    away in float64, an interleaved or (x, y) RoPE is far off; the test above would fail."""
    ref, folder = saved(tmp_path, num_register_tokens=1)
    x = torch.randn(2, 3, 32, 40, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        want = ref.double()(pixel_values=x).pooler_output
        diffs = {
            o: rel(vitkit.load(folder, **{o: v}).double()(x), want)
            for o, v in (("rope_hf", False), ("rope_half", False), ("rope_xy", True))
        }
    assert 1e-10 < diffs["rope_hf"] < 1e-5, diffs
    assert diffs["rope_half"] > 1e-3 and diffs["rope_xy"] > 1e-3, diffs


def test_the_encoders_own_naming_reads_too(tmp_path):
    """transformers 5's module names (``model.layer.{i}``) read as the Hub's (``layer.{i}``)."""
    ref, folder = saved(tmp_path)
    sd = load_file(folder / "model.safetensors")
    save_file(
        {f"model.{k}" if k.startswith("layer.") else k: v for k, v in sd.items()},
        str(folder / "model.safetensors"),
    )
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(vitkit.load(folder)(x), ref(pixel_values=x).pooler_output) <= 1e-5


def test_dinov3_folders_convert_and_inspect_from_the_command_line(tmp_path, capsys):
    from vitkit.cli import main

    ref, folder = saved(tmp_path, num_register_tokens=2)
    assert main(["inspect", str(folder)]) == 0
    shown = capsys.readouterr().out
    assert "dinov3" in shown and "num_reg_tokens" in shown
    assert main(["convert", str(folder), str(tmp_path / "ours"), "--to", "vitkit"]) == 0
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "back"), "--to", "hf"]) == 0
    assert main(["convert", str(folder), str(tmp_path / "timm"), "--to", "timm"]) == 0
    a = load_file(folder / "model.safetensors")
    b = load_file(tmp_path / "back" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a if k != "embeddings.mask_token")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(pixel_values=x).pooler_output
        assert rel(vitkit.load(tmp_path / "back")(x), want) <= 1e-5
        assert rel(vitkit.load(tmp_path / "timm")(x), want) <= 1e-5  # (timm's LingBot entry)
    hub = json.loads((tmp_path / "timm" / "config.json").read_text())
    assert hub["architecture"] == "vit_small_patch16_lingbot"  # DINOv3's RoPE, class token
    assert main(["convert", str(tmp_path / "timm"), str(tmp_path / "again"), "--to", "hf"]) == 0
    c = load_file(tmp_path / "again" / "model.safetensors")
    assert all(torch.equal(a[k], c[k]) for k in a if k != "embeddings.mask_token")
    # timm's DINOv3 entries pool the mean patch: refused as DINOv3ViTModel unless told
    hub.update(architecture="vit_small_patch16_dinov3")
    hub["model_args"]["global_pool"] = "avg"
    (tmp_path / "timm" / "config.json").write_text(json.dumps(hub))
    assert main(["convert", str(tmp_path / "timm"), str(tmp_path / "gap"), "--to", "hf"]) == 2
    assert "load it with -o pool=token" in capsys.readouterr().err
    cmd = [
        "convert",
        str(tmp_path / "timm"),
        str(tmp_path / "tok"),
        "--to",
        "hf",
        "-o",
        "pool=token",
    ]
    assert main(cmd) == 0
    d = load_file(tmp_path / "tok" / "model.safetensors")
    assert all(torch.equal(a[k], d[k]) for k in a if k != "embeddings.mask_token")
    from PIL import Image

    image = tmp_path / "image.png"
    Image.new("RGB", (40, 32)).save(image)
    capsys.readouterr()  # DINOv3ViTModel has no classifier: predict says so in one line
    assert main(["predict", str(image), "--from", str(folder)]) == 2
    assert "no classification head" in capsys.readouterr().err


def test_what_dinov3_cannot_hold_or_does_not_say_is_refused(tmp_path):
    ref, folder = saved(tmp_path)
    hub = json.loads((folder / "config.json").read_text())
    for change, match in (
        ({"use_gated_mlp": True, "hidden_act": "gelu"}, "gated MLP with 'gelu'"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"key_bias": True, "query_bias": False, "value_bias": False}, "key_bias=True"),
        ({"mlp_bias": False}, "proj_bias and mlp_bias differ"),
    ):
        (folder / "config.json").write_text(json.dumps({**hub, **change}))
        with pytest.raises(VitkitError, match=match):
            read_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(hub))
    sd = load_file(folder / "model.safetensors")
    save_file({**sd, "extra.weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"not understood: extra\.weight"):
        read_checkpoint(folder)
    del sd["layer.1.layer_scale2.lambda1"]
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"missing 'layer\.1\.layer_scale2\.lambda1'"):
        read_checkpoint(folder)
    # a DINOv3 whose features are the mean patch (timm's) or that has a head: refused, named
    model = vitkit.create_model(
        "Ti/8",
        image_size=32,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        num_classes=0,
        rope="dinov3",
        rope_half=True,
        abs_pos_embed=False,
        class_token=True,
        pool="gap",
        layer_scale_init=1.0,
    )
    from vitkit.checkpoints import Checkpoint
    from vitkit.registry.model_config import PreprocessConfig

    cfg = model.cfg
    ckpt = Checkpoint(tmp_path / "src", cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    with pytest.raises(VitkitError, match="pool other than the class token"):
        write_checkpoint(ckpt, tmp_path / "gap", "hf")
    head = cfg.replace(pool="token", num_classes=3)
    sd = vitkit.create_model(head).state_dict()
    ckpt = Checkpoint(tmp_path / "src", head, PreprocessConfig.for_model(head), sd)
    with pytest.raises(VitkitError, match="a classifier head"):
        write_checkpoint(ckpt, tmp_path / "head", "hf")


def test_rope_hf_is_dinov3s_only():
    from vitkit.registry.model_config import ViTConfig

    with pytest.raises(VitkitError, match="rope_hf computes DINOv3's angles"):
        ViTConfig(width=32, num_heads=2, rope="axial", abs_pos_embed=False, rope_hf=True)
    with pytest.raises(VitkitError, match="rope_hf"):
        ViTConfig(width=32, num_heads=2, rope="dinov3", rope_half=True, rope_hf="yes")
