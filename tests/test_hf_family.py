"""Hugging Face's ViT family classes (DeiT, Dinov2 with and without registers, ViTMAE, CLIP's
vision tower) ↔ vitkit: live transformers models built tiny with random weights, read through
``vitkit.load``, written back through ``write_checkpoint`` and loaded by transformers again."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from references import import_reference

from vitkit.checkpoints import load_model, read_checkpoint, write_checkpoint
from vitkit.checkpoints.description import format_description
from vitkit.checkpoints.formats import describe
from vitkit.errors import VitkitError
from vitkit.models.vit import build_model
from vitkit.registry.counts import count_params

TOL = 1e-4  # float32
TOL64 = 1e-12  # float64: the same operations in the same order
SMALL = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)

# name: (config class, model class, config settings, the output vitkit's model(x) equals)
CASES = {
    "deit-teacher": (
        "DeiTConfig",
        "DeiTForImageClassificationWithTeacher",
        dict(intermediate_size=128, num_labels=5),
        "logits",
    ),
    "deit-classifier": (
        "DeiTConfig",
        "DeiTForImageClassification",
        dict(intermediate_size=128, num_labels=5, hidden_act="gelu_pytorch_tanh"),
        "logits",
    ),
    "deit-model": (
        "DeiTConfig",
        "DeiTModel",
        dict(intermediate_size=96, pooler_output_size=48),
        "pooler_output",
    ),
    "dinov2-classifier": (
        "Dinov2Config",
        "Dinov2ForImageClassification",
        dict(mlp_ratio=2, layerscale_value=0.5, num_labels=5),
        "logits",
    ),
    "dinov2-swiglu": (
        "Dinov2Config",
        "Dinov2Model",
        dict(mlp_ratio=2, use_swiglu_ffn=True),
        "pooler_output",
    ),
    "dinov2-reg-classifier": (
        "Dinov2WithRegistersConfig",
        "Dinov2WithRegistersForImageClassification",
        dict(mlp_ratio=2, num_register_tokens=2, num_labels=5),
        "logits",
    ),
    "dinov2-reg": (
        "Dinov2WithRegistersConfig",
        "Dinov2WithRegistersModel",
        dict(mlp_ratio=2, num_register_tokens=3),
        "pooler_output",
    ),
    "clip": ("CLIPVisionConfig", "CLIPVisionModel", dict(intermediate_size=128), "pooler_output"),
    "clip-projection": (
        "CLIPVisionConfig",
        "CLIPVisionModelWithProjection",
        dict(intermediate_size=128, projection_dim=16),
        "image_embeds",
    ),
    "mae": ("ViTMAEConfig", "ViTMAEModel", dict(intermediate_size=128, mask_ratio=0.0), "mae"),
    "mae-pretraining": (
        "ViTMAEConfig",
        "ViTMAEForPreTraining",
        dict(
            intermediate_size=128,
            decoder_hidden_size=32,
            decoder_num_hidden_layers=1,
            decoder_num_attention_heads=2,
            decoder_intermediate_size=64,
            mask_ratio=0.0,
        ),
        "mae",
    ),
}


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its init (zero tokens and unit scales would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def reference(name: str):
    transformers = import_reference("transformers")
    cfg_cls, cls, kw, _ = CASES[name]
    cfg = getattr(transformers, cfg_cls)(**{**SMALL, **kw})
    return transformers, perturbed(getattr(transformers, cls)(cfg))


def hf_outputs(ref, x: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the output vitkit's ``model(x)`` equals, the last hidden state)."""
    with torch.no_grad():
        if what == "mae":  # identity noise: no patch is shuffled or dropped (mask_ratio 0)
            n = (x.shape[-1] // 8) ** 2
            noise = torch.arange(n, dtype=x.dtype).expand(x.shape[0], n)
            encoder = getattr(ref, "vit", ref)
            hidden = encoder(x, noise=noise).last_hidden_state
            return hidden[:, 0], hidden
        out = ref(x, output_hidden_states=True)
        hidden = getattr(out, "last_hidden_state", None)
        if hidden is None:  # the classifiers: the base model's last hidden state
            base = next(m for m in ref.children() if hasattr(m, "embeddings"))
            hidden = base(x).last_hidden_state
        return getattr(out, what), hidden


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _hf_load_quietly(cls, path: Path, caplog, **kw):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model, info = cls.from_pretrained(path, output_loading_info=True, **kw)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    return model.eval()


@pytest.mark.parametrize("name", CASES)
def test_family_class_reads_exactly_and_writes_back(tmp_path, caplog, name):
    transformers, ref = reference(name)
    ref.save_pretrained(tmp_path / "hf")
    model, ckpt = load_model(tmp_path / "hf")
    assert ckpt.format == "hf"
    assert count_params(model.cfg) == sum(p.numel() for p in model.parameters())
    what = CASES[name][3]
    x = images()
    out, hidden = hf_outputs(ref, x, what)
    with torch.no_grad():
        assert diff(model(x), out) <= TOL
        assert diff(model.forward_features(x), hidden) <= TOL
    # float64 weights read as they are (Dinov2-reg's class token + E_pos row is folded in them)
    ref.double().save_pretrained(tmp_path / "hf64")
    ckpt64 = read_checkpoint(tmp_path / "hf64")
    model64 = build_model(ckpt64.model_config).double().eval()
    model64.load_state_dict(ckpt64.state_dict)
    with torch.no_grad():
        out64, _ = hf_outputs(ref, x.double(), what)
        assert diff(model64(x.double()), out64) <= TOL64
    assert "hf" in format_description(describe(ckpt))

    # vitkit -> Hugging Face -> vitkit
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    arch = json.loads((tmp_path / "back" / "config.json").read_text())["architectures"][0]
    if name.startswith("mae"):
        assert arch == "ViTModel"  # MAE's encoder is a plain ViT
    else:
        assert arch == CASES[name][1]
    kw = {"add_pooling_layer": False} if arch == "ViTModel" else {}
    again = _hf_load_quietly(getattr(transformers, arch), tmp_path / "back", caplog, **kw)
    with torch.no_grad():
        if arch == "ViTModel":
            assert diff(again(x).last_hidden_state, hidden) <= TOL
        else:
            assert diff(hf_outputs(again, x, what)[0], model(x)) <= TOL
    back = read_checkpoint(tmp_path / "back")
    assert back.model_config == ckpt.model_config
    assert sorted(back.state_dict) == sorted(ckpt.state_dict)
    for k, v in ckpt.state_dict.items():
        assert torch.equal(back.state_dict[k], v), k


def test_a_whole_clip_model_reads_as_its_vision_tower_with_the_projection(tmp_path):
    transformers = import_reference("transformers")
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    vision = {**SMALL, "intermediate_size": 128}
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    ref = perturbed(transformers.CLIPModel(cfg))
    ref.save_pretrained(tmp_path / "clip")
    model, ckpt = load_model(tmp_path / "clip")
    assert ckpt.model_config.num_classes == 16 and ckpt.model_config.norm_pre
    x = images()
    with torch.no_grad():
        embeds = ref.get_image_features(pixel_values=x)  # (5.x: an output, projected pooler)
        assert diff(model(x), getattr(embeds, "pooler_output", embeds)) <= TOL
    write_checkpoint(ckpt, tmp_path / "tower", "hf")  # written as the tower it is
    hub = json.loads((tmp_path / "tower" / "config.json").read_text())
    assert hub["architectures"] == ["CLIPVisionModelWithProjection"]


def test_family_folders_convert_and_inspect_from_the_command_line(tmp_path, capsys):
    from vitkit.cli import main

    _, ref = reference("dinov2-reg-classifier")
    ref.save_pretrained(tmp_path / "hf")
    assert main(["inspect", str(tmp_path / "hf")]) == 0
    shown = capsys.readouterr().out
    assert "num_reg_tokens" in shown and "token_gap" in shown
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "timm"), "--to", "timm"]) == 2
    assert "token_gap" in capsys.readouterr().err  # timm has no such pooling: one line
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ours"), "--to", "vitkit"]) == 0
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "back"), "--to", "hf"]) == 0
    x = images()
    with torch.no_grad():
        assert diff(load_model(tmp_path / "back")[0](x), ref(x).logits) <= TOL


def _saved(tmp_path: Path, name: str) -> tuple[Path, dict]:
    _, ref = reference(name)
    ref.save_pretrained(tmp_path / name)
    from safetensors.torch import load_file

    return tmp_path / name, load_file(str(tmp_path / name / "model.safetensors"))


def test_family_checkpoints_that_do_not_fit_are_refused_naming_the_key(tmp_path):
    from safetensors.torch import save_file

    path, sd = _saved(tmp_path, "dinov2-reg")
    save_file({**sd, "extra.weight": torch.zeros(1)}, str(path / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"dinov2_with_registers .*not understood: extra\.weight"):
        read_checkpoint(path)
    del sd["encoder.layer.1.layer_scale2.lambda1"]
    save_file(sd, str(path / "model.safetensors"))
    with pytest.raises(VitkitError, match=r"missing 'encoder\.layer\.1\.layer_scale2\.lambda1'"):
        read_checkpoint(path)
    path, sd = _saved(tmp_path, "clip")
    hub = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**hub, "intermediate_size": 96}))
    with pytest.raises(VitkitError, match=r"mlp_dim 96 \(the weights: 128\)"):
        read_checkpoint(path)
    (path / "config.json").write_text(json.dumps({**hub, "hidden_act": "relu"}))
    with pytest.raises(VitkitError, match=r"config\.json.*hidden_act 'relu'"):
        read_checkpoint(path)


def test_what_no_family_class_can_hold_is_refused_by_name(tmp_path):
    from vitkit.checkpoints import Checkpoint
    from vitkit.registry.model_config import PreprocessConfig, ViTConfig

    def write(**kw):
        base = dict(image_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64)
        cfg = ViTConfig(**base, **kw)
        sd = {k: v + 0.5 for k, v in build_model(cfg).state_dict().items()}  # (no zero head)
        ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(sd))
        write_checkpoint(ckpt, tmp_path / "out", "hf", overwrite=True)

    with pytest.raises(VitkitError, match="DeiTModel does not average"):
        write(dist_token=True, num_classes=0)
    with pytest.raises(VitkitError, match="token_gap"):
        write(layer_scale_init=1.0, num_classes=3)  # Dinov2's classifier reads two tokens
    with pytest.raises(VitkitError, match="visual_projection has no bias"):
        write(norm_pre=True, patch_bias=False, fc_norm=True, num_classes=3)
    with pytest.raises(VitkitError, match="no Hugging Face class holds qk_norm"):
        write(qk_norm=True)
    with pytest.warns(UserWarning, match="mlp_ratio .* is 1.5; transformers 5"):
        write(layer_scale_init=1.0, mlp="swiglu", num_classes=0)  # 2 x 32 of SwiGLU at width 32


def test_clip_and_dinov2_processors_give_their_crop(tmp_path):
    """DINOv2's processor (BitImageProcessor): shorter side 256, centre crop 224, ImageNet mean
    and std, bicubic; the crop is what the model sees, and writing keeps it."""
    _, ref = reference("dinov2-classifier")
    ref.save_pretrained(tmp_path / "hf")
    processor = {
        "image_processor_type": "BitImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": 256},
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "resample": 3,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(processor))
    pre = read_checkpoint(tmp_path / "hf").preprocess
    assert pre.image_size == (224, 224) and pre.crop_pct == 224 / 256
    assert pre.interpolation == "bicubic" and pre.mean == (0.485, 0.456, 0.406)
    write_checkpoint(read_checkpoint(tmp_path / "hf"), tmp_path / "back", "hf")
    assert read_checkpoint(tmp_path / "back").preprocess == pre


def test_timms_clip_tower_writes_as_hugging_faces(tmp_path, caplog):
    """timm's CLIP towers normalise every token (no fc_norm): the class token's normalised
    output is CLIP's pooled output, so the final norm becomes ``post_layernorm``."""
    import vitkit

    transformers = import_reference("transformers")
    clip = dict(norm_pre=True, patch_bias=False, gelu="quick", layer_norm_eps=1e-5)
    base = dict(image_size=32, patch_size=8, width=64, depth=2, num_heads=4, mlp_dim=128)
    model = perturbed(vitkit.create_model("Ti/8", **base, **clip, num_classes=0))
    from vitkit.checkpoints import Checkpoint
    from vitkit.registry.model_config import PreprocessConfig

    cfg = model.cfg
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), dict(model.state_dict()))
    write_checkpoint(ckpt, tmp_path / "hf", "hf")
    ref = _hf_load_quietly(transformers.CLIPVisionModel, tmp_path / "hf", caplog)
    x = images()
    with torch.no_grad():
        assert diff(ref(x).pooler_output, model(x)) <= TOL
    assert read_checkpoint(tmp_path / "hf").model_config == cfg.replace(fc_norm=True)


ROUND_TRIPS = {
    "deit-distilled": dict(dist_token=True),
    "deit-register": dict(num_reg_tokens=1),
    "deit-model-pooler": dict(num_reg_tokens=1, num_classes=0, representation_size=48),
    "dinov2": dict(layer_scale_init=0.5, num_classes=0),
    "dinov2-classifier": dict(layer_scale_init=0.5, pool="token_gap"),
    "dinov2-swiglu": dict(layer_scale_init=0.5, mlp="swiglu", mlp_dim=176, num_classes=0),
    "dinov2-reg": dict(
        layer_scale_init=1e-5, num_reg_tokens=2, pos_embed_prefix=False, num_classes=0
    ),
    "clip": dict(norm_pre=True, patch_bias=False, fc_norm=True, gelu="quick", num_classes=0),
    "clip-projection": dict(norm_pre=True, patch_bias=False, fc_norm=True, num_classes=16),
}


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_vitkit_to_hugging_face_to_vitkit_is_bitwise(tmp_path, name):
    from vitkit.checkpoints import Checkpoint
    from vitkit.registry.model_config import PreprocessConfig, ViTConfig

    base = dict(image_size=32, patch_size=8, width=64, depth=2, num_heads=4, mlp_dim=128)
    base.update(gelu="none", num_classes=5)
    cfg = ViTConfig(**{**base, **ROUND_TRIPS[name]})
    sd = dict(perturbed(build_model(cfg)).state_dict())
    if name == "clip-projection":
        sd["head.bias"] = torch.zeros(16)  # CLIP's projection has no bias
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), sd)
    write_checkpoint(ckpt, tmp_path / "hf", "hf")
    back = read_checkpoint(tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"]
    kernel = "bicubic-antialias" if written == "dinov2_with_registers" else "bicubic"
    assert back.model_config == cfg.replace(pos_resample=kernel)  # the class's kernel
    assert sorted(back.state_dict) == sorted(sd)
    for k, v in sd.items():
        assert torch.equal(back.state_dict[k], v), k


def test_a_class_whose_head_is_missing_from_the_weights_is_refused(tmp_path):
    from safetensors.torch import save_file

    path, sd = _saved(tmp_path, "deit-teacher")
    heads = ("cls_classifier.", "distillation_classifier.")
    save_file(
        {k: v for k, v in sd.items() if not k.startswith(heads)}, str(path / "model.safetensors")
    )
    with pytest.raises(VitkitError, match="names DeiTForImageClassificationWithTeacher but the"):
        read_checkpoint(path)


def test_timm_dinov2_with_registers_to_hugging_face_via_vitkit(tmp_path, caplog):
    """timm's DINOv2-reg (E_pos on the patches only) -> vitkit -> Dinov2WithRegistersModel."""
    timm = import_reference("timm")
    transformers = import_reference("transformers")
    small = dict(img_size=56, embed_dim=64, depth=2, num_heads=4, num_classes=0)
    ref = perturbed(timm.create_model("vit_small_patch14_reg4_dinov2", **small))
    torch.save(ref.state_dict(), tmp_path / "dinov2_reg.pth")
    ckpt = read_checkpoint(tmp_path / "dinov2_reg.pth", num_heads=4)
    write_checkpoint(ckpt, tmp_path / "hf", "hf")
    again = _hf_load_quietly(transformers.Dinov2WithRegistersModel, tmp_path / "hf", caplog)
    x = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert diff(again(x).pooler_output, ref(x)) <= TOL
