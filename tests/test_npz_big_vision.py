"""big_vision ``.npz`` with the MAP head (SigLIP): written from vitkit in big_vision's naming
(scan-stacked blocks, top-level ``pos_embedding``, ``MAPHead_0``), loaded by timm's own npz
loader with equal logits in float64, and read back bitwise; big_vision's two-tower files and
unstacked blocks read the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from references import import_reference

import vitkit
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.checkpoints.google.npz import read_npz
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

CFG = ViTConfig(
    image_size=32, patch_size=8, num_classes=5, width=32, depth=2, num_heads=4, mlp_dim=64,
    pool="map",
)  # fmt: skip


def siglip_model(cfg: ViTConfig = CFG) -> torch.nn.Module:
    model = vitkit.create_model(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def write_npz(model: torch.nn.Module, path: Path) -> Path:
    cfg = model.cfg
    ckpt = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    return write_checkpoint(ckpt, path, "npz")


def test_written_big_vision_npz_loads_in_timm_and_reads_back_bitwise(tmp_path):
    timm = import_reference("timm")
    from timm.models.vision_transformer import _load_weights

    model = siglip_model()
    path = write_npz(model, tmp_path / "siglip.npz")
    arrays = read_npz(path)
    assert "pos_embedding" in arrays and "MAPHead_0/probe" in arrays
    assert arrays["Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"].shape == (2, 32, 64)
    assert not any(k.startswith("Transformer/encoderblock_") for k in arrays)
    ref = timm.create_model(
        "vit_base_patch16_siglip_224",
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0,
        num_classes=5, act_layer="gelu_tanh",
    )  # fmt: skip
    _load_weights(ref, str(path))
    ref, ours = ref.double().eval(), model.double()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        diff = (ref(x) - ours(x)).abs().max().item()
    assert diff <= 1e-12, diff
    back = read_checkpoint(path)
    assert back.model_config == CFG.replace(pos_resample="zoom")  # big_vision's kernel
    sd = model.float().state_dict()
    assert back.state_dict.keys() == sd.keys()
    assert all(torch.equal(back.state_dict[k], v) for k, v in sd.items())


def test_two_tower_files_and_unstacked_blocks_read_the_same(tmp_path):
    model = siglip_model()
    arrays = read_npz(write_npz(model, tmp_path / "siglip.npz"))
    towers = {f"params/img/{k}": v for k, v in arrays.items()}
    towers.update({"params/txt/Embed_0/embedding": np.zeros((10, 32), np.float32)})
    towers.update({"params/t": np.zeros(1, np.float32), "params/b": np.zeros(1, np.float32)})
    np.savez(tmp_path / "two_towers.npz", **towers)
    unstacked = {k: v for k, v in arrays.items() if not k.startswith("Transformer/encoderblock/")}
    for k, v in arrays.items():
        if k.startswith("Transformer/encoderblock/"):
            for i in range(v.shape[0]):
                unstacked[k.replace("encoderblock/", f"encoderblock_{i}/")] = v[i]
    np.savez(tmp_path / "unstacked.npz", **unstacked)
    want = model.state_dict()
    for name in ("two_towers.npz", "unstacked.npz"):
        got = read_checkpoint(tmp_path / name)
        assert got.model_config == CFG.replace(pos_resample="zoom")
        assert all(torch.equal(got.state_dict[k], v) for k, v in want.items())


def test_bad_map_heads_are_refused(tmp_path):
    arrays = read_npz(write_npz(siglip_model(), tmp_path / "siglip.npz"))
    missing = {k: v for k, v in arrays.items() if k != "MAPHead_0/LayerNorm_0/scale"}
    np.savez(tmp_path / "missing.npz", **missing)
    with pytest.raises(VitkitError, match=r"missing.npz: .*MAPHead_0/LayerNorm_0/scale"):
        read_checkpoint(tmp_path / "missing.npz")
    extra = {**arrays, "MAPHead_0/extra": np.zeros(3, np.float32)}
    np.savez(tmp_path / "extra.npz", **extra)
    with pytest.raises(VitkitError, match=r"extra.npz: .*not understood: MAPHead_0/extra"):
        read_checkpoint(tmp_path / "extra.npz")
    other = {**arrays, "head_0/kernel": np.zeros((32, 5), np.float32)}
    np.savez(tmp_path / "other.npz", **other)
    with pytest.raises(VitkitError, match=r"other.npz: unsupported head 'head_0'"):
        read_checkpoint(tmp_path / "other.npz")
    regs = siglip_model(CFG.replace(num_reg_tokens=2))
    with pytest.raises(VitkitError, match="cannot hold num_reg_tokens"):
        write_npz(regs, tmp_path / "regs.npz")


@pytest.mark.parametrize("pool", ["gap", "token", "map"])
def test_a_pooling_the_file_does_not_say_is_said(tmp_path, pool):
    """Without a class token or MAP head an .npz may be vit_jax's / big_vision's average pool
    or big_vision's pool_type="0" (the first patch token): the mean is assumed in one line,
    which an explicit ``pool`` silences; a class token or a MAP head says its pooling."""
    import warnings

    from vitkit.errors import AssumptionWarning

    model = vitkit.create_model(CFG.replace(pool=pool))
    path = write_npz(model, tmp_path / "m.npz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = read_checkpoint(path)
        stated = read_checkpoint(path, overrides={"pool": "gap"}) if pool == "gap" else None
    said = [str(w.message) for w in caught if issubclass(w.category, AssumptionWarning)]
    # (one warning: a summary line, then a line a setting, here each with the file's name)
    said = [f"{path}: {s.strip()}" for block in said for s in block.splitlines()[1:]]
    assert ckpt.model_config.pool == pool
    if pool != "gap":
        assert said == []
        return
    (line,) = said  # the stated read says nothing
    assert line.startswith(f"{path}: pool='gap' assumed (no class token and no MAP head")
    assert "pool_type='0'" in line and "\n" not in line
    assert stated is not None and stated.provenance.sources["pool"] == "given"
