"""The ViT model: pinned sizes, attention paths, initialisation, options and invariances."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitkit
from vitkit.errors import VitkitError
from vitkit.models.vit import Attention
from vitkit.registry.model_config import SIZES, STANDARD_MODELS, ViTConfig, model_config, parse_name

# Parameter counts at 224 px with a 1000-class head, from vit_jax's models_test.py.
PINNED_PARAMS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "S/32": 22_878_952,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "B/8": 86_576_872,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
}


def tiny(**changes) -> ViTConfig:
    base = dict(
        image_size=16, patch_size=4, width=24, depth=2, num_heads=3, mlp_dim=40, num_classes=5
    )
    base.update(changes)
    return ViTConfig(**base)


def build(cfg: ViTConfig, seed: int = 0, randomize: bool = True, dtype=torch.float32):
    """A model whose every parameter is random (the official init zeroes the head, the class
    token and the attention biases, which would make many comparisons vacuous)."""
    torch.manual_seed(seed)
    model = vitkit.create_model(cfg).to(dtype)
    if randomize:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def images(cfg: ViTConfig, batch: int = 2, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, *cfg.image_size, generator=g, dtype=dtype)


def to_patches(x: torch.Tensor, patch: tuple[int, int]) -> torch.Tensor:
    """[B, C, H, W] → [B, N, C, ph, pw], patches in row-major order."""
    b, c, h, w = x.shape
    ph, pw = patch
    x = x.reshape(b, c, h // ph, ph, w // pw, pw).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // ph) * (w // pw), c, ph, pw)


def from_patches(p: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    b, n, c, ph, pw = p.shape
    gh, gw = grid
    x = p.reshape(b, gh, gw, c, ph, pw).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, gh * ph, gw * pw)


# ---------------------------------------------------------------------------- parameter counts


def test_every_variant_has_a_pinned_count():
    missing = sorted(set(STANDARD_MODELS) - set(PINNED_PARAMS))
    assert not missing, f"standard models without a pinned parameter count: {missing}"
    pinned_sizes = {parse_name(name)[0] for name in PINNED_PARAMS}
    unpinned = sorted(set(SIZES) - pinned_sizes)
    assert not unpinned, f"sizes without a pinned parameter count: {unpinned}"


@pytest.mark.parametrize("name", sorted(PINNED_PARAMS))
def test_pinned_parameter_counts(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == PINNED_PARAMS[name]


def test_parameter_count_formula_tiny():
    # Independent count for a tiny model with every option that adds parameters.
    cfg = tiny(image_size=(16, 24), patch_size=(4, 8), in_chans=1, representation_size=7)
    d, m, n_cls, r = 24, 40, 5, 7
    patch = 1 * 4 * 8 * d + d
    block = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d)
    expected = patch + d + (12 + 1) * d + 2 * block + 2 * d + (d * r + r) + (r * n_cls + n_cls)
    model = vitkit.create_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize(
    "layers,wf,image,patch",
    [((2,), 0.5, 32, 1), ((1, 1, 2), 0.5, 64, 1), ((), 1.0, (16, 24), 2), ((3, 4, 9), 1.0, 224, 1)],
)
def test_hybrid_parameter_count_and_grid(layers, wf, image, patch):
    from vitkit.registry.counts import count_params

    cfg = vitkit.ViTConfig(
        image_size=image, patch_size=patch, width=64, depth=1, num_heads=2, mlp_dim=64,
        resnet_layers=layers, resnet_width_factor=wf,
    )  # fmt: skip
    model = vitkit.create_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    x = torch.randn(1, 3, *cfg.image_size)
    with torch.no_grad():
        tokens = model.forward_features(x)
    assert tokens.shape[1] == cfg.seq_len == 1 + cfg.grid_size[0] * cfg.grid_size[1]
    stride = 4 * 2 ** max(len(layers) - 1, 0)
    assert cfg.grid_size == (
        cfg.image_size[0] // stride // patch,
        cfg.image_size[1] // stride // patch,
    )


# ---------------------------------------------------------------------------- attention paths


def grads(out: torch.Tensor, weight: torch.Tensor, wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    return torch.autograd.grad((out * weight).sum(), wrt, retain_graph=True)


def test_fused_and_explicit_attention_agree_with_gradients():
    cfg = tiny(width=32, num_heads=4, qkv_bias=True)
    torch.manual_seed(0)
    attn = Attention(cfg).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)  # random biases too (the official init zeroes them)
    assert attn.qkv.bias is not None and attn.qkv.bias.abs().min() > 0
    x = torch.randn(3, 11, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 11, 32, dtype=torch.float64)
    wrt = [x, *attn.parameters()]
    fused = attn(x)
    explicit, weights = attn.forward_explicit(x)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-10)
    assert weights.shape == (3, 4, 11, 11)
    for gf, ge in zip(grads(fused, w, wrt), grads(explicit, w, wrt), strict=True):
        assert gf.abs().max() > 0
        torch.testing.assert_close(gf, ge, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("batch", "tokens", "fused_calls"), [(16, 17, 0), (16, 129, 1), (15, 17, 1), (1, 50, 1)]
)
def test_cpu_attention_routes_short_sequences_over_many_rows_to_plain_matmuls(
    monkeypatch, batch, tokens, fused_calls
):
    """Eager CPU attention: 16 x 4 heads of 17 tokens take the explicit softmax (faster there),
    129 tokens or fewer than 64 rows the fused kernel; the two agree with gradients."""
    cfg = tiny(width=32, num_heads=4, qkv_bias=True)
    torch.manual_seed(0)
    attn = Attention(cfg).double()
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    x = torch.randn(batch, tokens, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(batch, tokens, 32, dtype=torch.float64)
    wrt = [x, *attn.parameters()]
    out = attn(x)
    assert len(calls) == fused_calls
    q, k, v = attn._split_heads(x, None)
    reference = attn._merge_heads(sdpa(q, k, v))  # the fused kernel itself
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-10)
    for ga, gr in zip(grads(out, w, wrt), grads(reference, w, wrt), strict=True):
        torch.testing.assert_close(ga, gr, rtol=0, atol=1e-10)


def test_exported_attention_keeps_the_fused_call_for_any_batch():
    """The CPU routing is eager only: an export at a batch it would route (32 x 4 heads of 17
    tokens) keeps the fused kernel and its batch dynamic, down to batch 1."""
    attn = Attention(tiny(width=32, num_heads=4)).eval()
    x = torch.randn(32, 17, 32)
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(attn, (x,), dynamic_shapes={"x": {0: batch}})
    assert "scaled_dot_product_attention" in str(ep.graph)
    one = torch.randn(1, 17, 32)
    torch.testing.assert_close(ep.module()(one), attn(one))


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_whole_model_fused_equals_explicit(pool):
    cfg = tiny(width=32, num_heads=4, depth=2, pool=pool, representation_size=16)
    model = build(cfg, dtype=torch.float64).eval()
    x = images(cfg, dtype=torch.float64).requires_grad_(True)
    wrt = [x, *model.parameters()]
    logits = model(x)
    features = model.forward_features(x)
    inter = model.forward_with_attentions(x)
    torch.testing.assert_close(logits, inter.logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(features, inter.features, rtol=0, atol=1e-10)
    w_logits = torch.randn_like(logits)
    w_feat = torch.randn_like(features)
    for a, b in zip(grads(logits, w_logits, wrt), grads(inter.logits, w_logits, wrt), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    g_fused = grads(features, w_feat, [x])[0]
    g_explicit = grads(inter.features, w_feat, [x])[0]
    assert g_fused.abs().max() > 0
    torch.testing.assert_close(g_fused, g_explicit, rtol=0, atol=1e-10)


def test_intermediates_shapes_and_attention_rows():
    cfg = tiny(depth=3, num_heads=3)
    model = build(cfg).eval()
    x = images(cfg, batch=2)
    inter = model.forward_with_attentions(x)
    t = cfg.seq_len
    assert len(inter.attentions) == cfg.depth
    assert len(inter.hidden_states) == cfg.depth + 1
    for a in inter.attentions:
        assert a.shape == (2, cfg.num_heads, t, t)
        assert (a >= 0).all()
        torch.testing.assert_close(a.sum(-1), torch.ones(2, cfg.num_heads, t))
    for h in inter.hidden_states:
        assert h.shape == (2, t, cfg.width)
    torch.testing.assert_close(inter.hidden_states[0], model.embed(x), rtol=0, atol=0)
    # Each hidden state is the previous one through its block.
    for i, block in enumerate(model.blocks):
        torch.testing.assert_close(inter.hidden_states[i + 1], block(inter.hidden_states[i]))
    torch.testing.assert_close(inter.features, model.norm(inter.hidden_states[-1]))
    assert inter.logits.shape == (2, cfg.num_classes)


def naive_attention(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention written head by head from the fused qkv weights."""
    d = x.shape[-1]
    h = attn.num_heads
    hd = d // h
    wq, wk, wv = attn.qkv.weight.split(d, dim=0)
    bq, bk, bv = attn.qkv.bias.split(d)
    heads, maps = [], []
    for i in range(h):
        s = slice(i * hd, (i + 1) * hd)
        q = x @ wq[s].T + bq[s]
        k = x @ wk[s].T + bk[s]
        v = x @ wv[s].T + bv[s]
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        heads.append(a @ v)
        maps.append(a)
    out = torch.cat(heads, dim=-1) @ attn.proj.weight.T + attn.proj.bias
    return out, torch.stack(maps, dim=1)


def test_attention_equals_naive_reference():
    cfg = tiny(width=24, num_heads=3)
    torch.manual_seed(0)
    attn = Attention(cfg).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    ref_out, ref_maps = naive_attention(attn, x)
    out, maps = attn.forward_explicit(x)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(maps, ref_maps, rtol=0, atol=1e-12)
    torch.testing.assert_close(attn(x), ref_out, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- initialisation


@pytest.fixture(scope="module")
def s16():
    """S/16 at 224 px (196 patches, width 384), two blocks to keep it quick; official init."""
    torch.manual_seed(0)
    return vitkit.create_model("S/16", depth=2, representation_size=192)


def test_init_head_cls_and_biases(s16):
    assert (s16.head.weight == 0).all() and (s16.head.bias == 0).all()
    assert (s16.cls_token == 0).all()
    assert (s16.patch_embed.proj.bias == 0).all()
    for block in s16.blocks:
        assert (block.attn.qkv.bias == 0).all()
        assert (block.attn.proj.bias == 0).all()
        for fc in (block.mlp.fc1, block.mlp.fc2):
            assert fc.bias.abs().max() < 1e-5
            assert (fc.bias != 0).any()
            assert fc.bias.std().item() == pytest.approx(1e-6, rel=0.25)
        for norm in (block.norm1, block.norm2):
            assert (norm.weight == 1).all() and (norm.bias == 0).all()
    assert (s16.norm.weight == 1).all() and (s16.norm.bias == 0).all()
    dense = s16.pre_logits[0]
    assert (dense.bias == 0).all()
    std = math.sqrt(1 / 384)  # lecun normal, fan_in = width
    assert dense.weight.std().item() == pytest.approx(std, rel=0.03)


def test_init_pos_embed(s16):
    pe = s16.pos_embed
    assert pe.shape == (1, 197, 384)
    assert pe.std().item() == pytest.approx(0.02, rel=0.03)
    assert abs(pe.mean().item()) < 1e-3
    assert pe.abs().max() > 3 * 0.02  # a plain normal, not truncated at 2 sigma


def test_init_patch_embedding_lecun_normal(s16):
    w = s16.patch_embed.proj.weight
    fan_in = 3 * 16 * 16
    std = math.sqrt(1 / fan_in)
    bound = 2 * std / 0.87962566103423978  # flax: N(0, 1) truncated to ±2, rescaled to std
    assert w.std().item() == pytest.approx(std, rel=0.03)
    assert abs(w.mean().item()) < 0.02 * std
    assert w.abs().max().item() <= bound * (1 + 1e-6)
    assert w.abs().max().item() > 0.98 * bound


def test_init_xavier_uniform_dense_kernels(s16):
    d, m = 384, 1536

    def check_uniform(w, fan_in, fan_out):
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert w.abs().max().item() <= bound * (1 + 1e-6)
        assert w.abs().max().item() > 0.99 * bound
        assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.03)

    for block in s16.blocks:
        q, k, v = block.attn.qkv.weight.split(d, dim=0)
        for part in (q, k, v):  # each its own D x D kernel, as in the official code
            check_uniform(part, d, d)
        check_uniform(block.attn.proj.weight, d, d)
        check_uniform(block.mlp.fc1.weight, d, m)
        check_uniform(block.mlp.fc2.weight, m, d)


def test_numerics_defaults():
    model = vitkit.create_model(tiny())
    norms = [mod for mod in model.modules() if isinstance(mod, nn.LayerNorm)]
    gelus = [mod for mod in model.modules() if isinstance(mod, nn.GELU)]
    assert len(norms) == 2 * 2 + 1 and len(gelus) == 2
    assert all(n.eps == 1e-6 for n in norms)
    assert all(g.approximate == "tanh" for g in gelus)
    exact = vitkit.create_model(tiny(gelu="none"))
    assert all(g.approximate == "none" for g in exact.modules() if isinstance(g, nn.GELU))
    # And the tanh approximation is what the MLP computes.
    mlp = model.blocks[0].mlp
    h = torch.randn(4, 24)
    a = mlp.fc1(h)
    expected = mlp.fc2(0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))))
    torch.testing.assert_close(mlp(h), expected)


# ---------------------------------------------------------------------------- options


def test_gap_pool():
    cfg = tiny(pool="gap")
    model = build(cfg).eval()
    assert model.cls_token is None
    assert cfg.seq_len == cfg.num_patches == 16
    assert model.pos_embed.shape == (1, 16, 24)
    x = images(cfg, batch=3)
    tokens = model.forward_features(x)
    assert tokens.shape == (3, 16, 24)
    out = model(x)
    assert out.shape == (3, 5)
    torch.testing.assert_close(out, model.head(tokens.mean(dim=1)))


def test_embedding_is_eq1():
    cfg = tiny()
    model = build(cfg).eval()
    x = images(cfg, batch=3)
    z0 = model.embed(x)
    assert z0.shape == (3, 17, 24)
    pos = model.pos_embed[0]
    # The class token comes first, then the patches in row-major order.
    torch.testing.assert_close(z0[:, 0], (model.cls_token[0, 0] + pos[0]).expand(3, -1))
    torch.testing.assert_close(z0[:, 1:], model.patch_embed(x) + pos[1:])


def test_token_pool_uses_class_token():
    cfg = tiny()
    model = build(cfg).eval()
    x = images(cfg, batch=3)
    tokens = model.forward_features(x)
    assert tokens.shape == (3, 17, 24)
    torch.testing.assert_close(model(x), model.head(tokens[:, 0]))


def test_representation_size_adds_tanh_pre_logits():
    cfg = tiny(representation_size=7)
    model = build(cfg).eval()
    dense, act = model.pre_logits
    assert isinstance(dense, nn.Linear) and isinstance(act, nn.Tanh)
    assert (dense.in_features, dense.out_features) == (24, 7)
    assert model.head.in_features == 7
    x = images(cfg, batch=3)
    tokens = model.forward_features(x)
    feats = model.forward_head(tokens, pre_logits=True)
    assert feats.shape == (3, 7)
    assert feats.abs().max() <= 1
    torch.testing.assert_close(feats, torch.tanh(tokens[:, 0] @ dense.weight.T + dense.bias))
    torch.testing.assert_close(model(x), feats @ model.head.weight.T + model.head.bias)


def test_without_representation_pre_logits_is_the_pooled_token():
    cfg = tiny()
    model = build(cfg).eval()
    tokens = model.forward_features(images(cfg))
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 0])


def test_num_classes_zero_returns_features():
    cfg = tiny(num_classes=0)
    model = build(cfg).eval()
    assert model.head is None
    x = images(cfg, batch=3)
    out = model(x)
    assert out.shape == (3, 24)
    torch.testing.assert_close(out, model.forward_features(x)[:, 0])


def test_non_square_images():
    cfg = tiny(image_size=(32, 48), patch_size=8)
    assert cfg.grid_size == (4, 6) and cfg.num_patches == 24
    model = build(cfg).eval()
    assert model.pos_embed.shape == (1, 25, 24)
    x = images(cfg, batch=2)
    assert model.patch_embed(x).shape == (2, 24, 24)
    assert model(x).shape == (2, 5)
    # A transposed image runs on the transposed grid (6 x 4 patches, E_pos interpolated).
    assert model.forward_features(x.transpose(-1, -2)).shape == (2, 25, 24)


def test_single_channel_input():
    cfg = tiny(in_chans=1)
    model = build(cfg).eval()
    assert model.patch_embed.proj.weight.shape == (24, 1, 4, 4)
    assert model(images(cfg, batch=2)).shape == (2, 5)


def test_wrong_input_size_names_both_sizes():
    model = build(tiny(image_size=(32, 48), patch_size=8)).eval()
    with pytest.raises(VitkitError) as err:
        model(torch.randn(1, 3, 40, 52))  # 52 is not a multiple of the patch
    msg = str(err.value)
    for size in ("32x48", "40x52", "width 52", "patch width 8"):
        assert size in msg


# ---------------------------------------------------------------------------- dropout and modes


def _outputs_differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not torch.allclose(a, b, rtol=0, atol=1e-6)


def test_eval_is_deterministic_and_ignores_dropout():
    cfg = tiny(dropout=0.3, attn_dropout=0.3, drop_path=0.3)
    model = build(cfg).eval()
    plain = build(cfg.replace(dropout=0.0, attn_dropout=0.0, drop_path=0.0)).eval()
    plain.load_state_dict(model.state_dict())
    x = images(cfg)
    a, b = model(x), model(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, plain(x))
    torch.testing.assert_close(model.forward_with_attentions(x).logits, plain(x))


@pytest.mark.parametrize(
    "changes", [dict(dropout=0.3), dict(attn_dropout=0.3), dict(drop_path=0.5)]
)
def test_train_mode_applies_each_kind_of_dropout(changes):
    cfg = tiny(depth=2, **changes)
    model = build(cfg)
    x = images(cfg, batch=4)
    model.eval()
    ref = model(x)
    ref_explicit = model.forward_with_attentions(x).logits
    model.train()
    torch.manual_seed(1)
    a = model(x)
    b = model(x)
    assert _outputs_differ(a, b)
    assert _outputs_differ(a, ref)
    c = model.forward_with_attentions(x).logits
    assert _outputs_differ(c, ref_explicit)


def test_dropout_after_position_embeddings():
    cfg = tiny(dropout=0.5)
    model = build(cfg)
    x = images(cfg, batch=4)
    clean = model.eval().embed(x)
    torch.manual_seed(0)
    dropped = model.train().embed(x)
    kept = dropped != 0
    assert 0.4 < kept.float().mean().item() < 0.6
    torch.testing.assert_close(dropped[kept], 2 * clean[kept])


def test_dropout_after_attention_projection():
    cfg = tiny(dropout=0.5)
    block = build(cfg).blocks[0]
    with torch.no_grad():  # silence the MLP branch so only the attention branch remains
        block.mlp.fc2.weight.zero_()
        block.mlp.fc2.bias.zero_()
    x = torch.randn(4, cfg.seq_len, cfg.width)
    branch = block.attn(block.norm1(x))
    block.train()
    torch.manual_seed(0)
    for dropped in (block(x) - x, block.forward_explicit(x)[0] - x):
        kept = dropped != 0
        assert 0.4 < kept.float().mean().item() < 0.6
        torch.testing.assert_close(dropped[kept], 2 * branch[kept])


def test_train_mode_without_dropout_equals_eval():
    cfg = tiny(dropout=0.0, attn_dropout=0.0, drop_path=0.0)
    model = build(cfg)
    x = images(cfg)
    train_out = model.train()(x)
    train_explicit = model.forward_with_attentions(x).logits
    eval_out = model.eval()(x)
    torch.testing.assert_close(train_out, eval_out)
    torch.testing.assert_close(train_explicit, eval_out)


# ---------------------------------------------------------------------------- patches and positions


def test_patch_embedding_is_flatten_then_linear():
    cfg = tiny(image_size=(16, 24), patch_size=(4, 8), in_chans=3)
    model = build(cfg)
    x = images(cfg, batch=2)
    conv = model.patch_embed.proj
    flat = to_patches(x, cfg.patch_size).flatten(2)  # each patch flattened in (C, ph, pw) order
    expected = flat @ conv.weight.reshape(cfg.width, -1).T + conv.bias
    assert expected.shape == (2, 12, 24)
    torch.testing.assert_close(model.patch_embed(x), expected, rtol=1e-5, atol=1e-5)
    # Sanity of the helper itself: the round trip is the identity.
    torch.testing.assert_close(from_patches(to_patches(x, (4, 8)), (4, 3)), x, rtol=0, atol=0)


def test_position_embeddings_break_permutation_symmetry():
    cfg = tiny(pool="gap", depth=2)
    model = build(cfg, dtype=torch.float64).eval()
    x = images(cfg, batch=2, dtype=torch.float64)
    perm = torch.randperm(cfg.num_patches, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(perm, torch.arange(cfg.num_patches))
    x_perm = from_patches(to_patches(x, cfg.patch_size)[:, perm], cfg.grid_size)
    assert _outputs_differ(model(x), model(x_perm))


@pytest.mark.parametrize("depth", [1, 2])
def test_without_position_embeddings_gap_is_permutation_invariant(depth):
    cfg = tiny(pool="gap", depth=depth)
    model = build(cfg, dtype=torch.float64).eval()
    with torch.no_grad():
        model.pos_embed.zero_()
    x = images(cfg, batch=2, dtype=torch.float64)
    perm = torch.randperm(cfg.num_patches, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(perm, torch.arange(cfg.num_patches))
    x_perm = from_patches(to_patches(x, cfg.patch_size)[:, perm], cfg.grid_size)
    assert _outputs_differ(x, x_perm)
    # Tokens are permuted along with the patches (equivariance) ...
    torch.testing.assert_close(
        model.forward_features(x_perm), model.forward_features(x)[:, perm], rtol=0, atol=1e-10
    )
    # ... so the average-pooled output does not change at all.
    out = model(x)
    assert out.abs().max() > 0
    torch.testing.assert_close(model(x_perm), out, rtol=0, atol=1e-10)


def test_create_model_from_config_and_overrides():
    cfg = tiny()
    model = vitkit.create_model(cfg, num_classes=3)
    assert model.cfg == cfg.replace(num_classes=3)
    assert model.head.out_features == 3
    named = vitkit.create_model("Ti/16", depth=1, image_size=32, num_classes=4)
    assert named.cfg == model_config("Ti/16", depth=1, image_size=32, num_classes=4)
    assert len(named.blocks) == 1 and named.pos_embed.shape == (1, 5, 192)
