"""vitkit's checkpoint format: round trips, resolution, training state, strictness, corruption
and atomicity under a real SIGKILL."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import vitkit
from vitkit.checkpoints import (
    LATEST,
    atomic_write_text,
    config_diff,
    load_checkpoint,
    load_model,
    load_state_dict_strict,
    resolve_checkpoint,
    save_checkpoint,
)
from vitkit.checkpoints.native.safetensors_io import flatten_state, unflatten_state
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

TINY = dict(image_size=16, in_chans=1, num_classes=3, width=32, depth=2, num_heads=2, mlp_dim=64)
# Every option that changes the stored config or the parameter set, away from its default.
EXOTIC = dict(
    image_size=(16, 8),
    in_chans=3,
    num_classes=4,
    width=24,
    depth=1,
    num_heads=3,
    mlp_dim=40,
    pool="gap",
    representation_size=12,
    dropout=0.1,
    attn_dropout=0.1,
    drop_path=0.1,
    layer_norm_eps=1e-5,
    gelu="none",
    qkv_bias=False,
)


def tiny(seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny ViT whose every parameter is random (the official init zeroes the head and the
    class token, which would make equality checks vacuous)."""
    model = vitkit.create_model("Ti/4", **{**TINY, **overrides})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def images(model, batch: int = 2, seed: int = 1) -> torch.Tensor:
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, *cfg.image_size, generator=g)


def assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def strict_json(path: Path):
    """Parse as standard JSON (no NaN/Infinity extensions)."""

    def reject(token):
        raise ValueError(f"{path}: non-standard JSON constant {token}")

    return json.loads(path.read_text(), parse_constant=reject)


# ---------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("overrides", [{}, EXOTIC], ids=["tiny", "exotic"])
def test_save_then_load_model_round_trip(tmp_path, overrides):
    model = tiny(**overrides).train()
    c = model.cfg.in_chans
    preprocess = PreprocessConfig(
        model.cfg.image_size, c, (0.1,) * c, (0.3,) * c, "bicubic", crop_pct=0.875
    )
    names = tuple(f"class-{i}-ü" for i in range(model.cfg.num_classes))
    meta = {"epoch": 3, "note": "hello"}
    out = save_checkpoint(
        tmp_path / "ckpt", model, preprocess=preprocess, class_names=names, meta=meta
    )
    assert out == tmp_path / "ckpt"

    loaded, ckpt = load_model(tmp_path / "ckpt")
    assert ckpt.path == tmp_path / "ckpt"
    assert loaded.cfg == model.cfg
    assert ckpt.model_config == model.cfg
    assert ckpt.preprocess == preprocess
    assert ckpt.class_names == names
    assert ckpt.meta == meta
    assert ckpt.train_state is None
    assert not any(m.training for m in loaded.modules()), "load_model must return eval mode"
    assert_same_state(model.state_dict(), loaded.state_dict())
    assert_same_state(model.state_dict(), ckpt.state_dict)
    x = images(model)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), loaded(x))


def test_default_preprocess_follows_the_model(tmp_path):
    model = tiny()
    save_checkpoint(tmp_path / "c", model)
    ckpt = load_checkpoint(tmp_path / "c")
    assert ckpt.preprocess == PreprocessConfig.for_model(model.cfg)
    assert ckpt.preprocess.channels == 1 and ckpt.preprocess.image_size == (16, 16)
    assert ckpt.class_names == () and ckpt.meta == {}


def test_load_model_overrides_non_weight_fields(tmp_path):
    model = tiny()
    save_checkpoint(tmp_path / "c", model)
    loaded, ckpt = load_model(tmp_path / "c", dropout=0.25)
    assert loaded.cfg == model.cfg.replace(dropout=0.25)
    # the checkpoint's description has the stated value, and says who stated it
    assert ckpt.model_config == model.cfg.replace(dropout=0.25)
    assert ckpt.provenance.sources["dropout"] == "given"
    assert ckpt.provenance.sources["width"] == "file"
    assert_same_state(model.state_dict(), loaded.state_dict())
    with pytest.raises(VitkitError, match="does not fit"):
        load_model(tmp_path / "c", depth=3)


def test_resave_replaces_the_checkpoint_completely(tmp_path):
    path = tmp_path / "ckpt"
    first = tiny(seed=1)
    save_checkpoint(path, first, class_names=("a", "b", "c"), train_state={"step": 1})
    assert (path / "train_state.json").exists()
    (path / "stray.json").write_text("{}")  # anything in the old directory must go

    second = tiny(seed=2, depth=1, width=48, num_heads=3)
    save_checkpoint(path, second, meta={"v": 2})
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"], "no temporary or old siblings left"
    loaded, ckpt = load_model(path)
    assert ckpt.model_config == second.cfg
    assert ckpt.class_names == () and ckpt.meta == {"v": 2}
    assert_same_state(second.state_dict(), loaded.state_dict())
    with pytest.raises(VitkitError, match="no training state"):
        load_checkpoint(path, with_train_state=True)


# ---------------------------------------------------------------------------- resolving paths


def make_run(tmp_path: Path, step: int = 3) -> tuple[Path, Path, torch.nn.Module]:
    run = tmp_path / "run"
    model = tiny(seed=step)
    target = save_checkpoint(run / "checkpoints" / f"step_{step}", model)
    atomic_write_text(run / "checkpoints" / LATEST, f"step_{step}\n")
    return run, target, model


def test_resolve_checkpoint_accepts_every_documented_form(tmp_path):
    run, target, model = make_run(tmp_path)
    save_checkpoint(run / "checkpoints" / "step_1", tiny(seed=1))  # older, not LATEST
    assert resolve_checkpoint(target) == target
    assert resolve_checkpoint(str(target)) == target
    assert resolve_checkpoint(target / "model.safetensors") == target
    assert resolve_checkpoint(run) == target
    assert resolve_checkpoint(run / "checkpoints") == target
    for form in (run, run / "checkpoints", target / "model.safetensors"):
        assert_same_state(load_checkpoint(form).state_dict, model.state_dict())
    # LATEST moves: resolution follows it.
    atomic_write_text(run / "checkpoints" / LATEST, "step_1")
    assert resolve_checkpoint(run) == run / "checkpoints" / "step_1"


def test_atomic_write_text_replaces_and_leaves_no_temporaries(tmp_path):
    p = tmp_path / "LATEST"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert os.listdir(tmp_path) == ["LATEST"]


def expect_error(path, needle) -> str:
    with pytest.raises(VitkitError) as info:
        resolve_checkpoint(path)
    assert str(needle) in str(info.value), str(info.value)
    with pytest.raises(VitkitError):
        load_checkpoint(path)
    return str(info.value)


def test_resolve_checkpoint_errors_name_the_path(tmp_path):
    expect_error(tmp_path / "nope", tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    expect_error(tmp_path / "empty", tmp_path / "empty")
    only_weights = tmp_path / "only_weights"
    save_checkpoint(only_weights, tiny())
    (only_weights / "config.json").unlink()
    expect_error(only_weights, only_weights)
    expect_error(only_weights / "model.safetensors", only_weights)
    txt = tmp_path / "notes.txt"
    txt.write_text("hi")
    expect_error(txt, txt)


def test_latest_pointing_at_nothing_is_an_error(tmp_path):
    run, target, _ = make_run(tmp_path)
    atomic_write_text(run / "checkpoints" / LATEST, "step_9")
    message = expect_error(run, run / "checkpoints" / LATEST)
    assert "step_9" in message
    # A LATEST directly in the directory passed.
    bare = tmp_path / "bare"
    bare.mkdir()
    atomic_write_text(bare / LATEST, "missing")
    expect_error(bare, bare / LATEST)
    atomic_write_text(bare / LATEST, os.path.relpath(target, bare))
    assert resolve_checkpoint(bare).resolve() == target.resolve()


# ---------------------------------------------------------------------------- training state


def random_grads(model, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def step(model, opt, grads) -> None:
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    opt.step()


OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=1e-4),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_round_trip_resumes_bitwise(tmp_path, name):
    model = tiny()
    opt = OPTIMIZERS[name](model.parameters())
    for s in range(3):
        step(model, opt, random_grads(model, seed=s))
    save_checkpoint(tmp_path / "c", model, train_state={"optimizer": opt.state_dict(), "step": 3})

    restored, ckpt = load_model(tmp_path / "c")
    restored.train()
    assert ckpt.train_state is None  # only on request
    state = load_checkpoint(tmp_path / "c", with_train_state=True).train_state
    assert state["step"] == 3
    opt2 = OPTIMIZERS[name](restored.parameters())
    opt2.load_state_dict(state["optimizer"])

    original, loaded = opt.state_dict(), opt2.state_dict()
    assert original["param_groups"] == loaded["param_groups"]
    assert sorted(original["state"]) == sorted(loaded["state"])
    assert all(isinstance(k, int) for k in loaded["state"])
    for i in original["state"]:
        assert_same_state(original["state"][i], loaded["state"][i])

    grads = random_grads(model, seed=99)
    step(model, opt, grads)
    step(restored, opt2, grads)
    assert_same_state(model.state_dict(), restored.state_dict())
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), tiny().parameters())), (
        "the optimizer steps must have changed the weights"
    )


def test_rng_states_and_nested_structures_round_trip(tmp_path):
    saved_global = torch.get_rng_state()
    try:
        torch.manual_seed(1234)
        torch.rand(3)
        torch_rng = torch.get_rng_state()
        expected_torch = torch.rand(8)
        gen = torch.Generator().manual_seed(77)
        torch.randn(5, generator=gen)
        gen_state = gen.get_state()
        expected_gen = torch.randn(8, generator=gen)
        random.seed(5)
        py_state = random.getstate()
        expected_py = [random.random() for _ in range(4)]
        state = {
            "torch_rng": torch_rng,
            "generator": gen_state,
            "python_random": py_state,
            "nested": {1: {2: "two", 3: [None, 1.5, -0.0, "s"]}, 0: ("a", (1, 2.25))},
            "tuple_key": {(1, "x"): "tuple as key", None: "none as key"},
            "tensors": [
                torch.arange(6, dtype=torch.int64).reshape(2, 3),
                torch.tensor(2.5, dtype=torch.bfloat16),
                torch.zeros(0),
                torch.ones(3, dtype=torch.bool),
                torch.randn(4, 6).t(),  # not contiguous
            ],
            "floats": [0.1, 1e-300, 3.0, float("inf")],
            "flag": True,
            "count": 7,
            "empty": {},
        }
        save_checkpoint(tmp_path / "c", tiny(), train_state=state)
        back = load_checkpoint(tmp_path / "c", with_train_state=True).train_state

        torch.manual_seed(0)  # scramble, then restore from the checkpoint
        torch.set_rng_state(back["torch_rng"])
        assert torch.equal(torch.rand(8), expected_torch)
        gen2 = torch.Generator()
        gen2.set_state(back["generator"])
        assert torch.equal(torch.randn(8, generator=gen2), expected_gen)
        random.seed(0)
        random.setstate(back["python_random"])
        assert [random.random() for _ in range(4)] == expected_py
    finally:
        torch.set_rng_state(saved_global)

    assert back["nested"] == state["nested"]
    assert list(back["nested"]) == [1, 0] and list(back["nested"][1]) == [2, 3]
    assert isinstance(back["nested"][0], tuple) and isinstance(back["nested"][0][1], tuple)
    assert isinstance(back["nested"][1][3], list)
    assert str(back["nested"][1][3][2]) == "-0.0"
    assert back["tuple_key"] == state["tuple_key"]
    assert back["floats"] == state["floats"]
    assert back["flag"] is True and back["count"] == 7 and type(back["count"]) is int
    assert back["empty"] == {}
    assert len(back["tensors"]) == len(state["tensors"])
    for a, b in zip(state["tensors"], back["tensors"]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert set(back) == set(state)


def test_flatten_unflatten_are_inverse_without_a_checkpoint():
    obj = {"a": [torch.ones(2), {5: (None, "x")}], 2: 3.5}
    tensors, skeleton = flatten_state(obj)
    assert all(isinstance(t, torch.Tensor) for t in tensors.values()) and len(tensors) == 1
    json.dumps(skeleton)  # the skeleton is pure JSON
    back = unflatten_state(json.loads(json.dumps(skeleton)), tensors)
    assert list(back) == ["a", 2] and back[2] == 3.5
    assert torch.equal(back["a"][0], obj["a"][0]) and back["a"][1] == {5: (None, "x")}


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"bytes"], ids=["set", "object", "bytes"])
def test_unstorable_training_state_raises_type_error(tmp_path, bad):
    path = tmp_path / "c"
    with pytest.raises(TypeError, match=type(bad).__name__):
        flatten_state({"ok": 1, "bad": [bad]})
    with pytest.raises(TypeError, match=type(bad).__name__):
        save_checkpoint(path, tiny(), train_state={"ok": 1, "bad": [bad]})
    assert not path.exists()
    # A failed save leaves an existing checkpoint at that path as it was.
    model = tiny(seed=4)
    save_checkpoint(path, model, train_state={"step": 1})
    with pytest.raises(TypeError):
        save_checkpoint(path, tiny(seed=5), train_state={"bad": bad})
    ckpt = load_checkpoint(path, with_train_state=True)
    assert ckpt.train_state == {"step": 1}
    assert_same_state(ckpt.state_dict, model.state_dict())


# ---------------------------------------------------------------------------- no pickle


def test_checkpoint_is_only_safetensors_and_json_and_loads_without_pickle(tmp_path, monkeypatch):
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step(model, opt, random_grads(model, seed=0))
    save_checkpoint(
        tmp_path / "c",
        model,
        class_names=("a", "b", "c"),
        train_state={"optimizer": opt.state_dict(), "rng": torch.get_rng_state()},
    )
    files = sorted(os.listdir(tmp_path / "c"))
    assert files == [
        "config.json",
        "model.safetensors",
        "train_state.json",
        "train_state.safetensors",
    ]
    for f in files:
        assert (tmp_path / "c" / f).is_file()
        if f.endswith(".json"):
            strict_json(tmp_path / "c" / f)
        else:  # safetensors: 8-byte little-endian header length, then a JSON header
            raw = (tmp_path / "c" / f).read_bytes()
            n = int.from_bytes(raw[:8], "little")
            json.loads(raw[8 : 8 + n])
    assert strict_json(tmp_path / "c" / "config.json")["format"] == "vitkit"

    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoint loading must not unpickle")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    loaded, _ = load_model(tmp_path / "c")
    state = load_checkpoint(tmp_path / "c", with_train_state=True).train_state
    assert_same_state(loaded.state_dict(), model.state_dict())
    first = next(iter(model.parameters()))
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], opt.state[first]["exp_avg"])


# ---------------------------------------------------------------------------- strict loading


def test_strict_loading_reports_missing_unexpected_and_shapes():
    model = tiny(seed=0)  # depth 2, width 32
    before = {k: v.clone() for k, v in model.state_dict().items()}

    deeper = tiny(seed=1, depth=3).state_dict()
    with pytest.raises(VitkitError) as info:
        load_state_dict_strict(model, deeper, source="deeper.safetensors")
    msg = str(info.value)
    assert "deeper.safetensors" in msg
    assert "unexpected keys" in msg and "blocks.2.attn.qkv.weight" in msg
    assert "blocks.2.mlp.fc2.bias" in msg
    assert "missing keys" not in msg and "shape mismatches" not in msg

    other = tiny(seed=2, depth=1, width=48, num_heads=3).state_dict()
    other["extra.weight"] = torch.zeros(1)
    with pytest.raises(VitkitError) as info:
        load_state_dict_strict(model, other)
    msg = str(info.value)
    assert "missing keys" in msg and "blocks.1.mlp.fc1.weight" in msg
    assert "blocks.1.norm2.bias" in msg and "blocks.0.attn.qkv.weight" not in msg.split("|")[0]
    assert "unexpected keys" in msg and "extra.weight" in msg
    assert "shape mismatches" in msg
    assert "blocks.0.attn.qkv.weight: (144, 48) in checkpoint, (96, 32) in model" in msg
    assert "pos_embed: (1, 17, 48) in checkpoint, (1, 17, 32) in model" in msg

    assert_same_state(model.state_dict(), before)  # a failed load changes nothing

    gap = tiny(seed=3, pool="gap")
    with pytest.raises(VitkitError, match=r"unexpected keys: cls_token.*pos_embed: \(1, 17, 32\)"):
        load_state_dict_strict(gap, model.state_dict())


def test_ignore_head_by_name_loads_other_class_count():
    source = tiny(seed=1, num_classes=5)
    target = tiny(seed=2, num_classes=3)
    head_before = {k: v.clone() for k, v in target.state_dict().items() if k.startswith("head.")}
    with pytest.raises(VitkitError, match=r"head\.weight: \(5, 32\) in checkpoint, \(3, 32\)"):
        load_state_dict_strict(target, source.state_dict())
    load_state_dict_strict(target, source.state_dict(), ignore_prefixes=("head.",))
    own, src = target.state_dict(), source.state_dict()
    for k in own:
        if k.startswith("head."):
            assert torch.equal(own[k], head_before[k]), k
        else:
            assert torch.equal(own[k], src[k]), k
    # A features-only checkpoint (no head at all) also loads when the head is ignored.
    headless = tiny(seed=4, num_classes=0).state_dict()
    assert not any(k.startswith("head.") for k in headless)
    load_state_dict_strict(target, headless, ignore_prefixes=("head.",))
    assert torch.equal(target.state_dict()["pos_embed"], headless["pos_embed"])


def test_config_diff_lists_exactly_the_differing_fields():
    a = ViTConfig(**{**TINY, "patch_size": 4})
    assert config_diff(a, a) == []
    assert config_diff(a, ViTConfig(**{**TINY, "patch_size": 4})) == []
    b = a.replace(depth=3, width=48, num_heads=3, gelu="none")
    diff = config_diff(a, b)
    assert sorted(line.split(":")[0] for line in diff) == ["depth", "gelu", "num_heads", "width"]
    assert "depth: 2 != 3" in diff and "width: 32 != 48" in diff
    c = a.replace(image_size=(16, 8))
    assert [line.split(":")[0] for line in config_diff(a, c)] == ["image_size"]


# ---------------------------------------------------------------------------- corrupt files


def corrupt_cases(good: bytes) -> dict[str, bytes]:
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "header-only": good[:40],
        "garbage": b"\xff\x00not a checkpoint\x13" * 7,
    }


@pytest.mark.parametrize("case", ["empty", "truncated", "header-only", "garbage"])
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "train_state.safetensors"])
def test_corrupt_files_give_an_error_naming_the_file(tmp_path, name, case):
    path = save_checkpoint(tmp_path / "c", tiny(), train_state={"x": torch.ones(3)})
    f = path / name
    f.write_bytes(corrupt_cases(f.read_bytes())[case])
    with pytest.raises(VitkitError) as info:
        if name == "train_state.safetensors":
            load_checkpoint(path, with_train_state=True)
        else:
            load_model(path)
    assert str(f) in str(info.value), str(info.value)


def test_mismatched_weights_and_config_name_the_weights_file(tmp_path):
    path = save_checkpoint(tmp_path / "c", tiny())
    save_checkpoint(tmp_path / "d", tiny(width=48, num_heads=3))
    os.replace(tmp_path / "d" / "model.safetensors", path / "model.safetensors")
    with pytest.raises(VitkitError, match=r"width 32 \(the weights: 48\)") as info:
        load_model(path)  # (before a model is built: the declared size is checked first)
    assert str(path / "model.safetensors") in str(info.value)


def edit_config(path: Path, edit) -> None:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


GOOD_JSON_BAD_CONTENT = {
    "not-vitkit": lambda c: c.update(format="other"),
    "newer-version": lambda c: c.update(version=99),
    "no-model": lambda c: c.pop("model"),
    "model-null": lambda c: c.update(model=None),
    "preprocess-null": lambda c: c.update(preprocess=None),
}
# Well-formed JSON with bad contents: each must still be a VitkitError naming config.json
MORE_BAD_CONTENT = {
    "width-str": lambda c: c["model"].update(width="wide"),  # no file name
    "image-size-str": lambda c: c["model"].update(image_size="ab"),  # raw ValueError
    "image-size-3": lambda c: c["model"].update(image_size=[16, 16, 16]),  # no file name
    "unknown-field": lambda c: c["model"].update(colour="red"),  # no file name
    "version-str": lambda c: c.update(version="2"),  # raw TypeError
    "mean-str": lambda c: c["preprocess"].update(mean="x"),  # raw ValueError
    "class-names-int": lambda c: c.update(class_names=5),  # raw TypeError
    # fewer names than outputs: inspect passed it and predict raised IndexError
    "class-names-short": lambda c: c.update(class_names=c["class_names"][:1] or ["only"]),
    "class-names-long": lambda c: c.update(class_names=[str(i) for i in range(999)]),
}


def test_class_names_that_do_not_fit_the_head_are_not_written(tmp_path):
    with pytest.raises(VitkitError, match="2 class names for a head of"):
        save_checkpoint(tmp_path / "c", tiny(), class_names=["a", "b"])
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "case",
    list(GOOD_JSON_BAD_CONTENT) + list(MORE_BAD_CONTENT),
)
def test_malformed_config_contents_name_the_file(tmp_path, case):
    path = save_checkpoint(tmp_path / "c", tiny())
    edit_config(path, {**GOOD_JSON_BAD_CONTENT, **MORE_BAD_CONTENT}[case])
    with pytest.raises(VitkitError) as info:
        load_model(path)
    assert str(path / "config.json") in str(info.value), str(info.value)


# ---------------------------------------------------------------------------- atomicity
#
# Writers run in real processes and die by a real SIGKILL. A small supervisor script imports
# torch once and forks a fresh writer process for every request, so that each kill-and-restart
# round does not pay for another `import torch`.

SUPERVISOR = textwrap.dedent(
    """
    import json, os, shutil, signal, sys, time, traceback
    from pathlib import Path

    import torch

    torch.set_num_threads(1)  # before anything runs, so that forking is safe

    from vitkit.checkpoints import atomic_write_text, save_checkpoint
    from vitkit.models.vit import create_model

    ctl = Path(sys.argv[1])
    test_pid, supervisor = os.getppid(), os.getpid()
    # ~1.04 M parameters: a 4 MB model.safetensors.
    big = create_model("Ti/16", image_size=32, num_classes=10, depth=2)
    small = create_model("Ti/4", image_size=16, in_chans=1, num_classes=3, width=32, depth=2,
                         num_heads=2, mlp_dim=64)


    def write_forever(run, k):
        # Save step k with every weight = k, point LATEST at it, k += 1, forever.
        ckpts = Path(run) / "checkpoints"
        while os.getppid() == supervisor:
            with torch.no_grad():
                for p in big.parameters():
                    p.fill_(float(k))
            save_checkpoint(ckpts / f"step_{k}", big, meta={"step": k})
            atomic_write_text(ckpts / "LATEST", f"step_{k}")
            # Keep the disk small, as a trainer would; a directory is hidden before it is
            # deleted, so that every visible step_* is a checkpoint.
            for old in ckpts.glob("step_*"):
                if int(old.name[5:]) < k - 1:
                    old.rename(ckpts / f".trash-{old.name}")
            for trash in ckpts.glob(".trash-*"):
                shutil.rmtree(trash, ignore_errors=True)
            k += 1


    def kill_between_renames(run):
        # Re-save a checkpoint in place (a "keep only the last" trainer) and die right after
        # the old directory has been moved aside.
        ckpts = Path(run) / "checkpoints"
        save_checkpoint(ckpts / "last", small)
        atomic_write_text(ckpts / "LATEST", "last")
        real_rename = os.rename

        def rename_then_die(src, dst):
            real_rename(src, dst)
            if Path(src) == ckpts / "last":
                os.kill(os.getpid(), signal.SIGKILL)

        os.rename = rename_then_die
        save_checkpoint(ckpts / "last", small)


    COMMANDS = {"write_forever": write_forever, "kill_between_renames": kill_between_renames}
    i = 0
    while os.getppid() == test_pid:
        request = ctl / f"request_{i}"
        if not request.exists():
            time.sleep(0.005)
            continue
        cmd = json.loads(request.read_text())
        pid = os.fork()
        if pid == 0:
            try:
                COMMANDS[cmd["cmd"]](**cmd["args"])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        atomic_write_text(ctl / f"pid_{i}", str(pid))
        _, status = os.waitpid(pid, 0)
        atomic_write_text(ctl / f"exit_{i}", str(os.waitstatus_to_exitcode(status)))
        i += 1
    """
)


def subprocess_env() -> dict[str, str]:
    src = str(Path(vitkit.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env


class Writers:
    """Starts writer processes through the supervisor; ``start`` returns (index, pid)."""

    def __init__(self, ctl: Path, proc: subprocess.Popen) -> None:
        self.ctl, self.proc, self.count, self.live = ctl, proc, 0, {}

    def wait_until(self, condition, what: str, writer: int | None = None) -> None:
        """Poll ``condition``; fail fast if the supervisor or the given writer has died."""
        deadline = time.monotonic() + 60.0
        while True:
            died = self.proc.poll() is not None
            if writer is not None and (self.ctl / f"exit_{writer}").exists():
                died = True
            if not died and condition():
                return
            if died or time.monotonic() > deadline:
                log = (self.ctl / "stderr.txt").read_text()
                raise AssertionError(
                    f"{'died' if died else 'timed out'} waiting for {what}:\n{log}"
                )
            time.sleep(0.005)

    def start(self, cmd: str, **args) -> tuple[int, int]:
        i, self.count = self.count, self.count + 1
        atomic_write_text(self.ctl / f"request_{i}", json.dumps({"cmd": cmd, "args": args}))
        pid_file = self.ctl / f"pid_{i}"
        self.wait_until(pid_file.exists, "the supervisor to fork")
        self.live[i] = int(pid_file.read_text())
        return i, self.live[i]

    def exit_code(self, i: int) -> int:
        exit_file = self.ctl / f"exit_{i}"
        self.wait_until(exit_file.exists, f"writer {i} to end")
        self.live.pop(i, None)
        return int(exit_file.read_text())

    def kill(self, i: int) -> None:
        self.wait_until(lambda: True, f"writer {i} to be killed", writer=i)  # still running?
        os.kill(self.live[i], signal.SIGKILL)
        assert self.exit_code(i) == -signal.SIGKILL


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    ctl = tmp_path_factory.mktemp("supervisor")
    (ctl / "supervisor.py").write_text(SUPERVISOR)
    stderr = open(ctl / "stderr.txt", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, str(ctl / "supervisor.py"), str(ctl)],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    w = Writers(ctl, proc)
    try:
        yield w
    finally:
        for i in list(w.live):  # writers still running (a test failed half-way)
            if not (ctl / f"exit_{i}").exists():
                os.kill(w.live[i], signal.SIGKILL)
        proc.kill()
        proc.wait()
        stderr.close()


def latest_step(run: Path) -> int:
    pointer = run / "checkpoints" / LATEST
    return int(pointer.read_text().strip()[5:]) if pointer.exists() else 0


def test_sigkill_at_random_moments_never_leaves_a_half_written_checkpoint(tmp_path, writers):
    run, rng, k = tmp_path / "run", random.Random(0), 0
    for _ in range(5):
        # (Re)start a writer from the step after the one LATEST names; kill it at a random moment.
        i, _ = writers.start("write_forever", run=str(run), k=k + 1)
        writers.wait_until(lambda: latest_step(run) > k, "a new LATEST", writer=i)  # noqa: B023
        time.sleep(rng.uniform(0.0, 0.3))
        writers.kill(i)

        k_now = latest_step(run)
        assert k_now > k
        ckpt = load_checkpoint(run)
        assert ckpt.path == run / "checkpoints" / f"step_{k_now}"
        # Every visible checkpoint (LATEST's and the one being written, if its rename
        # happened) is complete: all weights equal its step number.
        visible = sorted(run.glob("checkpoints/step_*"))
        assert ckpt.path in visible
        for path in visible:
            j = int(path.name[5:])
            ckpt = load_checkpoint(path)
            assert ckpt.meta == {"step": j}
            assert len(ckpt.state_dict) == 4 + 2 * 12 + 2 + 2  # every weight made it
            for name, t in ckpt.state_dict.items():
                assert torch.all(t == j), f"{path.name}: {name} is not all {j}"
        k = k_now
    model, _ = load_model(run)  # strict: the weights fit the config
    assert all(torch.all(p == k) for p in model.parameters())


def test_sigkill_while_replacing_an_existing_checkpoint_keeps_one(tmp_path, writers):
    run = tmp_path / "run"
    i, pid = writers.start("kill_between_renames", run=str(run))
    assert writers.exit_code(i) == -signal.SIGKILL
    ckpts = run / "checkpoints"
    assert (ckpts / f".last.old-{pid}" / "model.safetensors").is_file()  # the kill hit the gap
    load_checkpoint(run)  # the old or the new checkpoint, never none


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("depth", 10**9, r"depth must lie in \[1, 1,024\], got 1,000,000,000"),
        ("depth", 1000, r"depth 1000 \(the weights: 2\)"),
        ("width", 10**12, r"width must lie in \[1, 65,536\]"),
        ("layer_norm_eps", "abc", r"layer_norm_eps must be a number, got 'abc'"),
        ("qkv_bias", "yes", r"qkv_bias must be one of True, False, got 'yes'"),
    ],
)
def test_config_fields_are_checked_before_anything_is_built(
    tmp_path, capsys, field, value, expected
):
    """A config.json with an absurd or mistyped field: one line naming the file and the
    field from inspect and eval, at once (no allocation, no traceback)."""
    from vitkit.cli import main

    path = save_checkpoint(tmp_path / "c", tiny())
    edit_config(path, lambda c: c["model"].__setitem__(field, value))
    for argv in (["inspect", str(path)], ["eval", "--from", str(path), "--data", "digits"]):
        start = time.perf_counter()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert time.perf_counter() - start < 30 and "\n" not in err, err  # (not building it)
        assert re.search(expected, err) and str(path / "config.json") in err, err


def test_a_hugging_face_config_is_checked_before_anything_is_built(tmp_path, capsys):
    from vitkit.checkpoints import read_checkpoint, write_checkpoint
    from vitkit.cli import main

    ckpt = read_checkpoint(save_checkpoint(tmp_path / "c", tiny()))
    hf = write_checkpoint(ckpt, tmp_path / "hf", "hf")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "hidden_size": 10**12}))
    assert main(["inspect", str(hf)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(hf / "config.json") in err, err
    assert "hidden_size: width must lie in [1, 65,536]" in err, err
