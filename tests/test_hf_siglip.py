"""Hugging Face SigLIP image towers (``SiglipVisionModel``, the image tower of ``SiglipModel``)
↔ vitkit's ``pool="map"``: logits equal to live transformers models on identical random
weights, both directions, and round trips bitwise."""

from __future__ import annotations

import json

import pytest
import torch
from references import import_reference, perturbed
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
)


def images(dtype=torch.float32) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=dtype)


def hf_tower(**kw):
    transformers = import_reference("transformers")
    cfg = transformers.SiglipVisionConfig(**{**SMALL, **kw})
    return perturbed(transformers.SiglipVisionModel(cfg))


@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "gelu", "quick_gelu"])
def test_siglip_vision_model_reads_and_writes_exactly(tmp_path, act):
    transformers = import_reference("transformers")
    ref = hf_tower(hidden_act=act)
    ref.save_pretrained(tmp_path / "hf")
    x = images()
    ckpt = read_checkpoint(tmp_path / "hf")
    cfg = ckpt.model_config
    assert (cfg.pool, cfg.has_class_token, cfg.num_classes) == ("map", False, 0)
    assert cfg.gelu == {"gelu_pytorch_tanh": "tanh", "gelu": "none", "quick_gelu": "quick"}[act]
    model = vitkit.load(tmp_path / "hf")
    with torch.no_grad():
        out = ref(pixel_values=x)
        pooled = (model(x) - out.pooler_output).abs().max().item()
        tokens = (model.forward_features(x) - out.last_hidden_state).abs().max().item()
    assert pooled <= 1e-5 and tokens <= 1e-5, (pooled, tokens)
    # float64: the same maths to rounding
    ref64, model64 = ref.double(), model.double()
    with torch.no_grad():
        diff = (model64(x.double()) - ref64(pixel_values=x.double()).pooler_output).abs().max()
    assert diff <= 1e-12, diff
    # vitkit → Hugging Face: transformers loads it (no missing / unexpected keys), same output
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    again, info = transformers.SiglipVisionModel.from_pretrained(
        tmp_path / "back", output_loading_info=True
    )
    assert not any(info.values()), info
    with torch.no_grad():
        diff = (again.eval()(pixel_values=x).pooler_output - model.float()(x)).abs().max()
    assert diff <= 1e-5, diff
    theirs, ours = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(tmp_path / "back" / "model.safetensors"),
    )
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in ours)
    assert read_checkpoint(tmp_path / "back").model_config == cfg


def test_a_whole_siglip_reads_its_image_tower_and_a_headless_tower_is_gap(tmp_path):
    """SiglipModel keys (vision_model.*, text_model.*, logit_scale/bias) give the image tower;
    vision_use_head=False is the paper's GAP over the post-normed tokens."""
    ref = hf_tower()
    sd = {f"vision_model.{k}": v for k, v in ref.state_dict().items()}
    sd.update({"text_model.embeddings.token_embedding.weight": torch.zeros(10, 32)})
    sd.update(logit_scale=torch.zeros(1), logit_bias=torch.zeros(1))
    (tmp_path / "whole").mkdir()
    save_file(sd, tmp_path / "whole" / "model.safetensors")
    hf = {"model_type": "siglip", "vision_config": {**SMALL, "model_type": "siglip_vision_model"}}
    (tmp_path / "whole" / "config.json").write_text(json.dumps(hf))
    x = images()
    with torch.no_grad():
        diff = (vitkit.load(tmp_path / "whole")(x) - ref(pixel_values=x).pooler_output).abs()
    assert diff.max() <= 1e-5
    headless = hf_tower(vision_use_head=False)
    headless.save_pretrained(tmp_path / "gap")
    model = vitkit.load(tmp_path / "gap")
    assert model.cfg.pool == "gap"
    with torch.no_grad():
        hidden = headless(pixel_values=x).last_hidden_state
        diff = (model(x) - hidden.mean(1)).abs().max()
    assert diff <= 1e-5


def test_bad_siglip_checkpoints_and_unwritable_models_are_refused(tmp_path):
    ref = hf_tower()
    ref.save_pretrained(tmp_path / "hf")
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    del sd["head.probe"]
    save_file(sd, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(VitkitError, match=r"hf: SigLIP checkpoint is missing 'head.probe'"):
        read_checkpoint(tmp_path / "hf")
    sd["head.probe"], sd["head.extra"] = torch.zeros(1, 1, 32), torch.zeros(1)
    save_file(sd, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(VitkitError, match="keys not understood: head.extra"):
        read_checkpoint(tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**hf, "hidden_act": "relu"}))
    with pytest.raises(VitkitError, match="config.json: hidden_act 'relu'"):
        read_checkpoint(tmp_path / "hf")
    cfg = vitkit.ViTConfig(
        image_size=32, patch_size=8, width=32, depth=1, num_heads=4, mlp_dim=64, pool="map"
    )
    for i, (c, match) in enumerate(
        [
            (cfg, "Hugging Face's SiglipVisionModel has no classifier"),
            (
                cfg.replace(num_classes=0, num_reg_tokens=2),
                "Hugging Face's SigLIP cannot hold num_reg_tokens",
            ),
        ]
    ):
        sd = vitkit.create_model(c).state_dict()
        ckpt = Checkpoint(tmp_path / "mem", c, PreprocessConfig.for_model(c), sd)
        with pytest.raises(VitkitError, match=f"^{match}"):
            write_checkpoint(ckpt, tmp_path / f"out{i}", "hf")
