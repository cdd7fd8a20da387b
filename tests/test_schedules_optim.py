"""Learning-rate schedules (pure step -> lr functions) and the optimizer's parameter groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import vitkit
from vitkit.errors import VitkitError
from vitkit.models.block_parts import LayerScale
from vitkit.train.optim import build_optimizer, param_groups
from vitkit.train.schedules import warmup_decay

# ---------------------------------------------------------------------------- schedules


def values(schedule, total: int) -> list[float]:
    return [schedule(s) for s in range(total + 1)]


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_linear_warmup_then_monotone_decay(decay):
    base, total, warmup = 0.3, 50, 8
    lrs = values(warmup_decay(base, total, warmup, decay, end_lr=0.01), total)
    assert lrs[0] == pytest.approx(base / warmup, rel=1e-12)
    for s in range(warmup):  # linear ramp: lr(s) = base * (s + 1) / warmup
        assert lrs[s] == pytest.approx(base * (s + 1) / warmup, rel=1e-12)
    assert lrs[warmup - 1] == pytest.approx(base, rel=1e-12)
    assert lrs[warmup] == pytest.approx(base, rel=1e-12)  # decay starts from the peak
    assert all(a <= b for a, b in zip(lrs[:warmup], lrs[1:warmup]))
    assert all(a > 0 for a in lrs[:warmup]), "no update may use lr 0 during warmup"
    assert all(a >= b for a, b in zip(lrs[warmup - 1 :], lrs[warmup:]))
    assert max(lrs) == pytest.approx(base, rel=1e-12)


def test_cosine_matches_the_closed_form():
    base, end, total, warmup = 0.5, 0.02, 40, 10
    lr = warmup_decay(base, total, warmup, "cosine", end_lr=end)
    for s in range(warmup, total + 1):
        t = (s - warmup) / (total - warmup)
        expected = end + 0.5 * (base - end) * (1 + math.cos(math.pi * t))
        assert lr(s) == pytest.approx(expected, rel=1e-12, abs=1e-15), s
    assert lr(total) == pytest.approx(end, abs=1e-15)
    assert lr(warmup + (total - warmup) // 2) == pytest.approx((base + end) / 2, rel=1e-12)
    assert lr(total + 100) == pytest.approx(end, abs=1e-15)  # stays at the end afterwards
    zero_end = warmup_decay(1.0, 20, 0)
    assert zero_end(10) == pytest.approx(0.5, rel=1e-12) and zero_end(20) == 0.0


def test_linear_decay_has_equal_steps():
    base, end, total, warmup = 1.0, 0.1, 30, 5
    lr = warmup_decay(base, total, warmup, "linear", end_lr=end)
    lrs = [lr(s) for s in range(warmup, total + 1)]
    step = (base - end) / (total - warmup)
    for a, b in zip(lrs, lrs[1:]):
        assert a - b == pytest.approx(step, rel=1e-9)
    assert lrs[0] == pytest.approx(base) and lrs[-1] == pytest.approx(end, abs=1e-12)
    assert lr(warmup + 10) == pytest.approx(base - 10 * step, rel=1e-12)


def test_constant_stays_at_base_and_no_warmup_starts_at_base():
    lr = warmup_decay(0.2, 25, 0, "constant", end_lr=0.0)
    assert all(lr(s) == 0.2 for s in range(30))
    lr = warmup_decay(0.2, 25, 5, "constant")
    assert [lr(s) for s in range(5)] == pytest.approx([0.04, 0.08, 0.12, 0.16, 0.2])
    assert all(lr(s) == pytest.approx(0.2) for s in range(5, 30))
    for decay in ("cosine", "linear"):
        assert warmup_decay(0.2, 25, 0, decay)(0) == pytest.approx(0.2)


def test_warmup_over_all_steps():
    lr = warmup_decay(1.0, 4, 4, "cosine", end_lr=0.5)
    assert [lr(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize(
    "args",
    [
        dict(total_steps=0),
        dict(total_steps=-5),
        dict(total_steps=10, warmup_steps=-1),
        dict(total_steps=10, warmup_steps=11),
        dict(total_steps=10, decay="exponential"),
        dict(total_steps=10, decay="Cosine"),
    ],
)
def test_invalid_schedule_arguments(args):
    with pytest.raises(VitkitError):
        warmup_decay(0.1, **args)


def test_schedule_is_a_pure_function_of_the_step():
    lr = warmup_decay(0.1, 100, 10, "cosine", end_lr=1e-4)
    forward = [lr(s) for s in range(101)]
    order = list(range(101))[::-1] + [50, 3, 99, 0, 50]
    shuffled = {s: lr(s) for s in order}
    assert all(shuffled[s] == forward[s] for s in range(101))
    again = warmup_decay(0.1, 100, 10, "cosine", end_lr=1e-4)
    assert [again(s) for s in range(101)] == forward


# ---------------------------------------------------------------------------- parameter groups


def tiny(**overrides) -> nn.Module:
    cfg = dict(image_size=16, in_chans=1, num_classes=3, width=32, depth=2, num_heads=2, mlp_dim=64)
    model = vitkit.create_model("Ti/4", **{**cfg, **overrides})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # nonzero everywhere, so shrinking is visible
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def expected_split(model: nn.Module) -> tuple[set[str], set[str]]:
    """Decay / no-decay parameter names, decided by module type rather than by shape."""
    decay, no_decay = set(), set()
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            if isinstance(module, (nn.LayerNorm, LayerScale)) or p_name == "bias":
                no_decay.add(name)
            elif isinstance(module, (nn.Linear, nn.Conv2d)) and p_name == "weight":
                decay.add(name)
            elif name in ("pos_embed", "cls_token", "dist_token", "reg_token"):
                no_decay.add(name)
            else:
                raise AssertionError(f"unclassified parameter {name}")
    return decay, no_decay


def names_of(model: nn.Module, params) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for p in params]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(representation_size=16, qkv_bias=False),
        dict(pool="gap"),
        dict(dist_token=True, num_reg_tokens=2, layer_scale_init=1e-5, norm_pre=True, qk_norm=True),
    ],
)
def test_param_groups_partition_decay_and_no_decay(overrides):
    model = tiny(**overrides)
    decay_group, no_decay_group = param_groups(model, weight_decay=0.05)
    assert decay_group["weight_decay"] == 0.05 and no_decay_group["weight_decay"] == 0.0
    decay = names_of(model, decay_group["params"])
    no_decay = names_of(model, no_decay_group["params"])
    want_decay, want_no_decay = expected_split(model)
    assert set(decay) == want_decay
    assert set(no_decay) == want_no_decay
    assert len(decay) == len(set(decay)) and len(no_decay) == len(set(no_decay))
    assert len(decay) + len(no_decay) == len(list(model.parameters()))
    assert not set(decay) & set(no_decay)
    # Spot checks, in case expected_split itself were wrong.
    assert {"patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "head.weight"} <= set(decay)
    assert {"pos_embed", "norm.weight", "blocks.1.norm2.bias", "patch_embed.proj.bias"} <= set(
        no_decay
    )
    assert ("cls_token" in no_decay) == (model.cfg.pool == "token")
    assert all(p.ndim >= 2 for p in decay_group["params"])
    cfg = model.cfg
    n_layernorms = 2 * cfg.depth * (1 + cfg.qk_norm) + 1 + cfg.norm_pre
    n_layernorms += 2 * cfg.depth if cfg.layer_scale_init else 0  # the layer scales' gammas
    n_biases = sum(1 for n, _ in model.named_parameters() if n.endswith(".bias"))
    n_embeddings = 1 + cfg.has_class_token + cfg.dist_token + (cfg.num_reg_tokens > 0)
    assert len(no_decay) == n_biases + n_layernorms + n_embeddings


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_adamw_decays_only_the_decay_group_decoupled():
    model = tiny()
    lr, wd = 0.1, 0.05
    opt = build_optimizer(model, "adamw", lr=lr, weight_decay=wd)
    assert isinstance(opt, torch.optim.AdamW)
    before = snapshot(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # the Adam update is exactly zero: only decay remains
    opt.step()
    want_decay, _ = expected_split(model)
    for name, p in model.named_parameters():
        if name in want_decay:
            expected = before[name] * (1 - lr * wd)
            assert torch.equal(p.detach(), expected), name  # p * (1 - lr * wd), exactly
            assert not torch.equal(p.detach(), before[name]), name
        else:
            assert torch.equal(p.detach(), before[name]), f"{name} must not be decayed"


def test_adamw_passes_lr_and_betas():
    model = tiny()
    opt = build_optimizer(model, "adamw", lr=3e-4, weight_decay=0.1, betas=(0.8, 0.95))
    assert len(opt.param_groups) == 2
    for group in opt.param_groups:
        assert group["lr"] == 3e-4 and tuple(group["betas"]) == (0.8, 0.95)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def wide() -> nn.Module:
    """1.05 M parameters: past vitkit's threshold for fused AdamW on the CPU."""
    return nn.Sequential(nn.Linear(1024, 1024), nn.LayerNorm(1024))


@pytest.mark.parametrize(
    ("name", "make", "impl"),
    [
        ("adamw", tiny, "foreach"),
        ("sgd", tiny, "foreach"),
        ("adamw", wide, "fused"),
        ("sgd", wide, "foreach"),
    ],
)
def test_cpu_optimizers_skip_the_one_tensor_at_a_time_default_with_the_same_steps(name, make, impl):
    """PyTorch's CPU default runs one parameter at a time (slower); vitkit asks for for-each,
    or fused AdamW for a model of 1 M parameters or more, whose steps are the same numbers."""
    torch.manual_seed(0)
    model, reference = make(), make()
    reference.load_state_dict(model.state_dict())
    opt = build_optimizer(model, name, lr=1e-2, weight_decay=0.05)
    assert all(g[impl] is True for g in opt.param_groups)
    single = build_optimizer(reference, name, lr=1e-2, weight_decay=0.05, fused=False)
    for g in single.param_groups:
        g["foreach"] = False
    for _ in range(3):
        grads = [torch.randn_like(p) for p in model.parameters()]
        for m, o in ((model, opt), (reference, single)):
            for p, g in zip(m.parameters(), grads, strict=True):
                p.grad = g.clone()
            o.step()
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)


def test_sgd_uses_momentum_0_9():
    model = tiny()
    lr = 0.01
    opt = build_optimizer(model, "sgd", lr=lr, weight_decay=0.0)
    assert isinstance(opt, torch.optim.SGD)
    assert all(g["momentum"] == 0.9 and g["lr"] == lr for g in opt.param_groups)
    before = snapshot(model)
    grads = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
    for _ in range(2):
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        opt.step()
    # Heavy-ball momentum, two steps with a constant gradient g: p - lr*g - lr*(0.9 g + g).
    for n, p in model.named_parameters():
        expected = before[n] - lr * 0.5 - lr * (0.9 * 0.5 + 0.5)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-6, msg=n)


def test_frozen_parameters_are_left_out():
    model = tiny()
    model.patch_embed.requires_grad_(False)
    groups = param_groups(model, 0.1)
    names = names_of(model, groups[0]["params"] + groups[1]["params"])
    assert not any(n.startswith("patch_embed.") for n in names)
    assert len(names) == sum(1 for p in model.parameters() if p.requires_grad)


def test_unknown_optimizer_is_a_vitkit_error():
    with pytest.raises(VitkitError, match="lamb"):
        build_optimizer(tiny(), "lamb", lr=0.1, weight_decay=0.0)
