"""A pruned model (prune_intermediate_layers) saves and loads as itself: its config follows
the pruning, drawn at random over the switches that decide the head and the norms; a model
whose weights no longer match its config is refused before anything is written."""

from __future__ import annotations

import random

import pytest
import torch
from references import perturbed

import vitkit
from vitkit.errors import VitkitError

TINY = dict(image_size=32, patch_size=8, width=32, depth=4, num_heads=2, mlp_dim=64)
POOLS = ("token", "gap", "avgmax", "max", "token_gap", "map")


def draw(rng: random.Random) -> dict:
    """One valid setting of the head's switches (invalid draws are redrawn)."""
    while True:
        pool = rng.choice(POOLS)
        s = dict(
            pool=pool,
            num_classes=rng.choice((0, 5)),
            fc_norm=rng.random() < 0.4,
            final_norm=rng.random() < 0.7,
            representation_size=rng.choice((None, None, 24)),
            dist_token=pool == "token" and rng.random() < 0.4,
            class_token=rng.choice((None, True)) if pool not in ("token", "token_gap") else None,
            num_reg_tokens=rng.choice((0, 0, 2)),
        )
        try:
            vitkit.create_model("Ti/16", **TINY, **s)
        except VitkitError:
            continue
        return s


@pytest.mark.parametrize("seed", range(32))
def test_pruned_model_saves_and_loads_as_itself(tmp_path, seed):
    rng = random.Random(seed)
    settings = draw(rng)
    torch.manual_seed(seed)
    model = perturbed(vitkit.create_model("Ti/16", **TINY, **settings)).eval()
    indices = rng.choice((1, 2, [0, 2], [-2]))
    prune_norm, prune_head = rng.random() < 0.5, rng.random() < 0.7
    kept = model.prune_intermediate_layers(indices, prune_norm=prune_norm, prune_head=prune_head)
    x = torch.randn(2, 3, 32, 32)
    what = f"{settings}, indices={indices}, prune_norm={prune_norm}, prune_head={prune_head}"
    if prune_head:  # no pooling left: every token comes out, as from timm's pruned model
        with torch.no_grad():
            assert model(x).shape[:2] == (2, model.cfg.num_prefix_tokens + 16), what
    vitkit.save_checkpoint(tmp_path / "ckpt", model)
    loaded = vitkit.load(tmp_path / "ckpt").eval()
    assert loaded.cfg == model.cfg, what
    want = model.forward_intermediates(x, kept, norm=True, return_prefix_tokens=True)
    got = loaded.forward_intermediates(x, kept, norm=True, return_prefix_tokens=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0, msg=what)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0, msg=what)


def test_a_hand_changed_model_is_refused_and_the_old_file_kept(tmp_path):
    model = vitkit.create_model("Ti/16", num_classes=5, **TINY)
    vitkit.save_checkpoint(tmp_path / "ckpt", model)
    before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    model.blocks = model.blocks[:2]  # surgery the config does not know of
    with pytest.raises(VitkitError, match=r"ckpt: not written: .*missing keys: blocks\.2\."):
        vitkit.save_checkpoint(tmp_path / "ckpt", model)
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    model.head = torch.nn.Linear(32, 7)  # a new head without num_classes=7
    model.cfg = model.cfg.replace(depth=2)
    with pytest.raises(
        VitkitError,
        match=r"shape mismatches: head\.bias: \(7,\) in the model, \(5,\) in the config.s",
    ):
        vitkit.save_checkpoint(tmp_path / "other", model)
    assert not (tmp_path / "other").exists()


def test_a_pruned_map_head_pools_nothing_on_a_naflex_batch_too():
    """NaFlex pools in its own function: without its MAP head it averaged the valid patches
    and their maximum, unsaid; pruned, it returns every token as the unpacked forward does."""
    from vitkit.models.naflex_packing import pack

    model = vitkit.create_model(
        "Ti/16", **{**TINY, "patch_size": 16}, pool="map", naflex=True, naflex_grid=(2, 2)
    ).eval()
    images = [torch.randn(3, 32, 48), torch.randn(3, 16, 16)]
    batch = pack(images, (16, 16))
    with torch.no_grad():
        assert model(batch).shape == (2, 1000)
        model.prune_intermediate_layers(1)
        assert model(batch).shape == (2, 6, 32)  # (the packed length: 2 x 3 patches at most)
        assert model.forward_intermediates(batch, [0], output_fmt="NLC")[1][0].shape[0] == 2
