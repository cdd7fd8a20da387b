"""Code written for timm runs unchanged on vitkit: one user script (feature_info walks, a
ViTDet-style simple feature pyramid, forward_intermediates' arguments, a layer-decay optimizer
from timm's factory, a training step with gradient checkpointing, head surgery) is driven
against timm's model and against vitkit's loaded from timm's saved folder, on identical random
weights (the build line the only change); every value, type and length it records must agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from references import import_reference, perturbed
from torch import nn

import vitkit

ARGS = dict(
    img_size=32,
    patch_size=8,
    embed_dim=32,
    depth=4,
    num_heads=2,
    num_classes=10,
    dynamic_img_size=True,
)  # (vitkit runs any multiple of the patch: timm so)
MODELS = {  # the timm arguments, and the pooling the script's head surgery asks for
    "vit_tiny_patch16_224": ({}, "avg"),  # the paper's ViT: class token, E_pos over it
    "vit_small_patch14_reg4_dinov2": (dict(mlp_ratio=2), "avg"),  # registers, E_pos on patches
    "deit_tiny_distilled_patch16_224": ({}, "token"),  # two prefix tokens, two heads
}


def user_script(timm, model: nn.Module, features_only, pool: str = "avg") -> dict:
    """What a dense / training codebase written for timm does with a ViT; returns what it saw.
    ``features_only(out_indices)`` is the codebase's features-only build call."""
    seen: dict = {}
    model = model.double().eval()
    attrs = ("embed_dim", "num_features", "head_hidden_size", "num_prefix_tokens",
             "num_reg_tokens", "has_class_token", "no_embed_class", "global_pool",
             "num_classes", "in_chans", "pool_include_prefix", "grad_checkpointing",
             "dynamic_img_size")  # fmt: skip
    seen["attrs"] = {a: getattr(model, a) for a in attrs}
    pe = model.patch_embed
    seen["patch_embed"] = (pe.patch_size, pe.grid_size, pe.num_patches, pe.img_size,
                           pe.dynamic_feat_size((48, 64)), pe.feat_ratio())  # fmt: skip
    seen["feature_info"] = [dict(d) for d in model.feature_info]
    seen["data_config"] = timm.data.resolve_model_data_config(model)
    seen["no_weight_decay"] = model.no_weight_decay()
    seen["group_matcher"] = model.group_matcher()
    heads = model.get_classifier()
    seen["classifier"] = [
        type(h).__name__ for h in (heads if isinstance(heads, tuple) else [heads])
    ]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 32, 48, generator=g, dtype=torch.float64)
    with torch.no_grad():
        seen["logits"] = model(x)
        seen["pre_logits"] = model.forward_head(model.forward_features(x), pre_logits=True)
        final, maps = model.forward_intermediates(x, indices=np.array([1, -1]))
        seen["intermediates"] = (final, maps)
        seen["np_ints"] = model.forward_intermediates(
            x, [np.int64(0), np.int32(2)], output_fmt="NLC", intermediates_only=True
        )
        seen["prefix"] = model.forward_intermediates(
            x, 2, return_prefix_tokens=True, norm=True, intermediates_only=True
        )
        seen["dict"] = model.forward_intermediates(x, (0, 3), output_dict=True)
        seen["dict_prefix"] = model.forward_intermediates(
            x, [2], output_dict=True, return_prefix_tokens=True, intermediates_only=True
        )
        t = model.num_prefix_tokens + 4 * 6
        keep = torch.rand(2, 1, t, t, generator=g) > 0.3
        keep |= torch.eye(t, dtype=torch.bool)  # every token sees itself
        seen["bool_mask"] = model.forward_intermediates(
            x, [1, 3], attn_mask=keep, intermediates_only=True
        )
        soft = torch.randn(1, 2, t, t, generator=g, dtype=torch.float64)
        seen["float_mask"] = model.forward_intermediates(x, 1, attn_mask=soft, stop_early=True)
        seen["causal"] = model.forward_intermediates(x, [0, 2], is_causal=True)
        seen["masked_forward"] = (model(x, attn_mask=keep), model.forward_features(x, soft))
        seen["dino"] = model.get_intermediate_layers(x, n=2, reshape=True)

        # ViTDet's simple feature pyramid from the last block's map: strides r/2, r, 2r
        torch.manual_seed(1)
        d, r = model.embed_dim, model.feature_info[-1]["reduction"]
        up = nn.ConvTranspose2d(d, d, 2, 2).double()
        last = maps[-1]
        seen["pyramid"] = {r // 2: up(last), r: last, 2 * r: nn.functional.max_pool2d(last, 2)}

    # features-only: timm's FeatureInfo, walked as detection code does
    backbone = features_only((1, 3)).double().eval()
    fi = backbone.feature_info
    seen["fi"] = {
        "len": len(fi),
        "out_indices": fi.out_indices,
        "channels": fi.channels(),
        "reduction": fi.reduction(),
        "modules": fi.module_name(),
        "dicts": fi.get_dicts(),
        "keys": fi.get_dicts(keys=["num_chs", "module"]),
        "idx": fi.get_dicts(idx=[0, 2]),
        "one": (fi.channels(0), fi.module_name(-1), fi.reduction([1, 2]), fi.get("index", 3)),
        "getitem": (fi[0], fi[-1]),
        "other": (fi.from_other(2).out_indices, fi.from_other((0,)).module_name()),
        "net_out_indices": backbone.out_indices,
        "fmt": (str(backbone.output_fmt), backbone.output_fmt == "NCHW"),
        "blocks": len(backbone.model.blocks),
        "data_config": timm.data.resolve_model_data_config(backbone),
    }
    with torch.no_grad():
        seen["fi"]["maps"] = backbone(x)

    # a layer-decay optimizer from timm's factory, one training step with checkpointing
    model.train()
    model.set_grad_checkpointing(True)
    names = {id(p): n for n, p in model.named_parameters()}
    from timm.optim import create_optimizer_v2

    opt = create_optimizer_v2(model, "adamw", lr=1e-2, weight_decay=0.05, layer_decay=0.75)
    seen["groups"] = sorted(
        (
            round(grp["lr"], 12),
            grp["weight_decay"],
            tuple(sorted(names[id(p)] for p in grp["params"])),
        )
        for grp in opt.param_groups
    )
    calls = []
    hook = model.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    y = torch.tensor([3, 7])
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    hook.remove()
    seen["train"] = {
        "loss": loss.detach(),
        "block0_calls": len(calls),  # 2: the forward, then its recomputation in backward
        # by name: a block's LayerScale parameters come after its MLP's in vitkit (timm: after
        # each branch); a saved run's optimizer state is positional, so the order stays
        "weights": dict(sorted((n, p.detach().clone()) for n, p in model.named_parameters())),
    }

    # a new input size, then the forward at it
    model.eval()
    model.set_input_size(img_size=(48, 64))
    pe = model.patch_embed
    with torch.no_grad():
        z = torch.randn(1, 3, 48, 64, generator=g, dtype=torch.float64)
        seen["resized"] = (pe.img_size, pe.grid_size, pe.num_patches, model.pos_embed, model(z))
    seen["resized_data_config"] = timm.data.resolve_model_data_config(model)

    # head surgery
    torch.manual_seed(2)
    model.reset_classifier(5)
    heads = model.get_classifier()
    heads = heads if isinstance(heads, tuple) else (heads,)
    seen["new_head"] = (model.num_classes, [h.weight.detach().clone() for h in heads])
    model.reset_classifier(0, pool)
    model.eval()
    with torch.no_grad():
        seen["headless"] = (model.global_pool, model.num_classes, model(x))
    return seen


def assert_same(a, b, path="seen"):
    """Equal values, types and lengths; tensors to 1e-9 (relative, float64)."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, path
        scale = max(b.abs().max().item(), 1e-30) if b.numel() else 1.0
        assert a.numel() == 0 or (a - b).abs().max().item() <= 1e-9 * scale, path
        return
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs timm's {type(b).__name__}"
    if isinstance(b, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs timm's {list(b)}"
        for k in b:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} vs timm's {len(b)}"
        for i, (u, v) in enumerate(zip(a, b)):
            assert_same(u, v, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs timm's {b!r}"


@pytest.fixture(scope="module")
def timm():
    return import_reference("timm")


def _built(timm, name, tmp_path):
    """timm's model (random weights) and its saved folder: timm's build line and vitkit's."""
    from timm.models._hub import save_for_hf

    kw = {**ARGS, **MODELS[name][0], "pretrained_cfg_overlay": {"input_size": (3, 32, 32)}}
    torch.manual_seed(0)
    ref = perturbed(timm.create_model(name, **kw))
    save_for_hf(ref, str(tmp_path / "m"), safe_serialization=True)
    # timm's user of the folder builds from it (its pretrained_cfg then holds the JSON's lists)
    ref = timm.create_model(f"local-dir:{tmp_path / 'm'}", pretrained=True, dynamic_img_size=True)

    def timm_features(out_indices):
        return timm.create_model(
            f"local-dir:{tmp_path / 'm'}", pretrained=True, features_only=True,
            out_indices=out_indices, dynamic_img_size=True,
        )  # fmt: skip

    return ref, timm_features, tmp_path / "m"


@pytest.mark.parametrize("name", MODELS)
def test_the_same_script_sees_the_same(timm, tmp_path, name):
    ref, timm_features, folder = _built(timm, name, tmp_path)
    pool = MODELS[name][1]
    want = user_script(timm, ref, timm_features, pool)
    got = user_script(  # vitkit's build line: the folder timm saved
        timm,
        vitkit.load(folder),
        lambda oi: vitkit.load(folder, features_only=True, out_indices=oi),
        pool,
    )
    assert got["train"]["block0_calls"] == 2
    assert_same(got, want)


def test_a_difference_is_caught(timm, tmp_path):
    """The comparison can fail: one weight moved in vitkit's copy, or a length changed."""
    ref, timm_features, folder = _built(timm, "vit_tiny_patch16_224", tmp_path)
    ours = vitkit.load(folder)
    with torch.no_grad():
        ours.blocks[3].mlp.fc2.bias[0] += 1e-6
    want = user_script(timm, ref, timm_features)
    got = user_script(
        timm, ours, lambda oi: vitkit.load(folder, features_only=True, out_indices=oi)
    )
    with pytest.raises(AssertionError, match="logits"):
        assert_same(got, want)
    with pytest.raises(AssertionError, match="length"):
        assert_same({"fi": [1, 2]}, {"fi": [1, 2, 3]})
    with pytest.raises(AssertionError, match="list vs timm's tuple"):
        assert_same([1, 3], (1, 3))


def test_feature_info_is_timms(timm):
    """vitkit's FeatureInfo answers every call as timm's on the same list: an int, negative
    and listed out_indices, keys= and idx= (int, list, tuple), from_other, the 'index' added
    to the given dicts; a list that is not a feature list is refused."""
    from timm.models._features import FeatureInfo as TimmInfo

    from vitkit.models.features import FeatureInfo

    def info():
        return [{"module": f"blocks.{i}", "num_chs": 8 * (i + 1), "reduction": 4 * 2 ** (i // 2)}
                for i in range(5)]  # fmt: skip

    def calls(fi):
        return {
            "out": fi.out_indices, "len": len(fi), "items": (fi[1], fi[-1], fi[1:3]),
            "get": (fi.get("num_chs"), fi.get("module", 2), fi.get("reduction", [4, 0])),
            "dicts": (fi.get_dicts(), fi.get_dicts(keys=["index"]), fi.get_dicts(idx=3),
                      fi.get_dicts(keys=("num_chs",), idx=(0, 1))),
            "acc": (fi.channels(), fi.reduction(1), fi.module_name([2, 3])),
            "other": (fi.from_other(1).channels(), fi.from_other([0, -1]).out_indices),
        }  # fmt: skip

    for out in (2, (0, 3), [1, -1], (-2,)):
        mine, theirs = info(), info()
        assert_same(calls(FeatureInfo(mine, out)), calls(TimmInfo(theirs, out)))
        assert_same(mine, theirs)  # ('index' added to the caller's dicts, as timm does)
    with pytest.raises(vitkit.VitkitError, match="must not shrink"):
        FeatureInfo(info()[::-1], 1)


def test_what_vitkit_does_not_do_is_refused():
    """Where vitkit's model cannot answer as timm's, it says so instead of another answer."""
    tiny = dict(image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64)
    model = vitkit.create_model("Ti/16", **tiny, num_classes=3)
    with pytest.raises(vitkit.VitkitError, match="patch kernel"):
        model.set_input_size(img_size=32, patch_size=4)
    with pytest.raises(vitkit.VitkitError, match="not a positive multiple"):
        model.set_input_size(img_size=(30, 32))
    with pytest.raises(vitkit.VitkitError, match="MAP head"):
        model.reset_classifier(0, "map")
    deit = vitkit.create_model("Ti/16", **tiny, num_classes=3, dist_token=True)
    with pytest.raises(vitkit.VitkitError, match="distillation"):
        deit.reset_classifier(5, "avg")
    with pytest.raises(vitkit.VitkitError, match="17 x 17 tokens"):
        model.forward_intermediates(torch.randn(1, 3, 32, 32), attn_mask=torch.ones(5, 5) > 0)
    assert model.patch_embed.dynamic_feat_size((48, 64)) == (6, 8)
    with pytest.raises(vitkit.VitkitError, match="multiple"):
        model.patch_embed.dynamic_feat_size((50, 64))  # (timm's floors it, then fails)
