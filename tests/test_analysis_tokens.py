"""Analysis of the family's extra tokens: DeiT's distillation token, DINOv2's registers and
SigLIP's MAP head. Maps cover the patch grid only and sum to 1; the prefix tokens' attention is
reported apart (and with the patches sums to 1); a MAP model's pooled map is its probe's
attention. ``vitkit analyze`` and ``vitkit explain`` run end to end on all three."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitkit.analysis import (
    attention_outputs,
    attention_rollout,
    explain,
    patch_map,
    pooled_row,
    prefix_attention_share,
    prefix_rollout_share,
)
from vitkit.checkpoints import Checkpoint, write_checkpoint
from vitkit.cli import main
from vitkit.data import make_shapes
from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer, create_model
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

BASE = dict(image_size=32, patch_size=8, num_classes=6, width=32, depth=2, num_heads=2, mlp_dim=64)
FAMILY = {
    "deit-distilled": (dict(dist_token=True), {"class token", "distillation token"}),
    "dinov2-reg": (
        dict(num_reg_tokens=4, layer_scale_init=1e-5, pos_embed_prefix=False),
        {"class token", "registers"},
    ),
    "siglip-map": (dict(pool="map"), set()),
}


def family_model(name: str) -> VisionTransformer:
    model = create_model(ViTConfig(**{**BASE, **FAMILY[name][0]}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random weights, large enough that attention is not uniform
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    assert isinstance(model, VisionTransformer)
    return model.eval()


def test_pooled_row_reads_what_the_output_reads():
    """DeiT: the mean of the class and distillation rows; GAP: the patch rows only (not the
    class token's nor the registers'); MAP: the patch rows weighted by the probe's attention."""
    g = torch.Generator().manual_seed(0)
    deit = ViTConfig(**{**BASE, "dist_token": True})
    m = torch.rand(2, deit.seq_len, deit.seq_len, generator=g)
    torch.testing.assert_close(pooled_row(m, deit), (m[:, 0] + m[:, 1]) / 2)
    gap = ViTConfig(**{**BASE, "pool": "gap", "class_token": True, "num_reg_tokens": 2})
    m = torch.rand(2, gap.seq_len, gap.seq_len, generator=g)
    torch.testing.assert_close(pooled_row(m, gap), m[:, 3:].mean(dim=1))
    siglip = ViTConfig(**{**BASE, "pool": "map"})
    m = torch.rand(2, 3, siglip.seq_len, siglip.seq_len, generator=g)  # [B, heads, T, T]
    probe = torch.zeros(2, 2, siglip.num_patches)
    probe[:, 0, 5], probe[:, 1, 7] = 1.0, 1.0  # head 0 reads patch 5, head 1 patch 7
    torch.testing.assert_close(pooled_row(m, siglip, probe), (m[..., 5, :] + m[..., 7, :]) / 2)
    torch.testing.assert_close(pooled_row(m, siglip), m.mean(dim=-2))  # no probe: the patches
    with pytest.raises(VitkitError, match="MAP attention"):
        pooled_row(m, siglip, torch.zeros(2, 2, 3))


@pytest.mark.parametrize("name", FAMILY)
def test_maps_cover_the_patch_grid_and_prefix_tokens_are_reported_apart(name):
    model = family_model(name)
    cfg, groups = model.cfg, FAMILY[name][1]
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    found = explain(model, x)
    assert found.rollout.shape == (3, 4, 4) and found.layer_maps.shape == (3, 2, 2, 4, 4)
    torch.testing.assert_close(found.rollout_maps.sum((-2, -1)), torch.ones(3, 2))
    torch.testing.assert_close(found.layer_maps.sum((-2, -1)), torch.ones(3, 2, 2))
    assert set(found.prefix_attention) == groups | {"patches"} == set(found.prefix_rollout)
    total = sum(found.prefix_attention.values())
    torch.testing.assert_close(total, torch.ones(3, 2))  # every patch query's attention
    torch.testing.assert_close(sum(found.prefix_rollout.values()), torch.ones(3))
    attentions, _, pool = attention_outputs(model, x)
    if "registers" in groups:  # the registers' share is their columns' mass from patch rows
        a = attentions[1][:, :, cfg.num_prefix_tokens :, 1:5]
        registers = found.prefix_attention["registers"]
        torch.testing.assert_close(registers[:, 1], a.sum(-1).mean((1, 2)))
        assert 0 < float(found.prefix_attention["registers"].min()) < 1
    if cfg.pool == "map":
        assert pool is not None and found.pool_maps is not None
        assert found.pool_maps.shape == (3, 2, 4, 4)
        torch.testing.assert_close(found.pool_maps.sum((-2, -1)), torch.ones(3, 2))
        torch.testing.assert_close(found.pool_maps.flatten(2), pool)
        # the pooled map: the rollout's patch rows, weighted by the probe (heads averaged)
        rolled = attention_rollout(attentions)
        want = torch.einsum("bn,bnt->bt", pool.mean(1), rolled[:, :, :])
        want = want / want.sum(-1, keepdim=True)
        torch.testing.assert_close(found.rollout, want.reshape(3, 4, 4))
        assert not torch.allclose(found.rollout, patch_map(rolled, cfg), atol=1e-4)
    else:
        assert found.pool_maps is None
    shares = prefix_rollout_share(attention_rollout(attentions), cfg, pool)
    torch.testing.assert_close(shares["patches"], found.prefix_rollout["patches"])
    with pytest.raises(VitkitError, match="tokens"):
        prefix_attention_share([a[..., 1:, 1:] for a in attentions], cfg)


def write_tiny_checkpoint(name: str, dst: Path) -> Path:
    model = family_model(name)
    cfg = model.cfg
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    return write_checkpoint(ckpt, dst, "vitkit")


@pytest.mark.parametrize("name", FAMILY)
def test_analyze_and_explain_commands_run_on_the_family(tmp_path, name, capsys):
    ckpt = write_tiny_checkpoint(name, tmp_path / name)
    groups = FAMILY[name][1]
    out = tmp_path / "analysis"
    args = ["analyze", "--from", str(ckpt), "--data", "shapes", "--num-images", "6"]
    assert main([*args, "--examples", "2", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    numbers = json.loads((out / "analysis.json").read_text())
    assert numbers["attention_distance"]["images"] == 6
    page = (out / "report.html").read_text()
    if groups:
        assert set(numbers["prefix_tokens"]) == groups | {"patches"}
        for share in numbers["prefix_tokens"].values():
            assert len(share["attention_share_per_layer"]) == 2
        assert ">Prefix tokens</h2>" in page
        shown = "registers" if "registers" in groups else "distillation token"
        assert f"attention share on the {shown} by layer" in stdout
    else:
        assert "prefix_tokens" not in numbers and ">Prefix tokens</h2>" not in page
        assert "weighted by the MAP head" in page  # the rollout is read through the probe
    image = tmp_path / "img.png"
    Image.fromarray(make_shapes("test", n=1).images[0].permute(1, 2, 0).numpy()).save(image)
    ex = tmp_path / "explain"
    assert main(["explain", str(image), "--from", str(ckpt), "--out", str(ex), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert Path(record["rollout_png"]).is_file() and Path(record["layers_png"]).is_file()
    if name == "siglip-map":
        assert Path(record["pool_png"]).is_file() and "prefix_rollout_share" not in record
    else:
        assert set(record["prefix_rollout_share"]) == groups and "pool_png" not in record
