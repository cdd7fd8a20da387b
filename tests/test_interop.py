"""Checkpoint interop: Google .npz (every naming era), timm and Hugging Face, numerically.

Parity is measured against the references themselves: the official JAX code's logits (fixtures
made by vit_jax, see tests/fixtures/vit_jax/README.md) and live timm / transformers models on
identical random weights.
"""

from __future__ import annotations

import logging
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from references import import_reference
from safetensors.torch import save_file

import vitkit
from vitkit.checkpoints import (
    Checkpoint,
    detect_format,
    load_model,
    read_checkpoint,
    resample_pos_embed,
    write_checkpoint,
)
from vitkit.checkpoints.google import npz as npz_conv
from vitkit.checkpoints.timm import vision_transformer as timm_conv
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig

FIXTURES = Path(__file__).parent / "fixtures" / "vit_jax"
TOL = 1e-5


def perturbed(model: torch.nn.Module, seed: int = 0, scale: float = 0.05) -> torch.nn.Module:
    """Every parameter moved off its init (zero heads / class tokens would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def ours(seed: int = 0, **kw) -> torch.nn.Module:
    base = dict(image_size=32, patch_size=8, num_classes=5, width=64, depth=2, num_heads=4)
    return perturbed(vitkit.create_model("Ti/8", **{**base, "mlp_dim": 128, **kw}), seed)


def images(n: int = 2, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def as_ckpt(model: torch.nn.Module, path: str = "mem") -> Checkpoint:
    return Checkpoint(
        Path(path), model.cfg, PreprocessConfig.for_model(model.cfg), dict(model.state_dict())
    )


def same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---------------------------------------------------------------------------------------------
# The official JAX code's logits


def fixture(name: str) -> tuple[Path, torch.Tensor, np.ndarray]:
    x = torch.from_numpy(np.load(FIXTURES / f"{name}_input_nhwc.npy")).permute(0, 3, 1, 2)
    return FIXTURES / f"{name}.npz", x, np.load(FIXTURES / f"{name}_logits.npy")


@pytest.mark.parametrize("name", ["vit_token_p4", "hybrid_r1"])
def test_official_npz_reproduces_the_jax_logits(name):
    path, x, ref = fixture(name)
    model = vitkit.load(path)
    with torch.no_grad():
        got = model(x).numpy()
    assert np.abs(got - ref).max() <= TOL
    import json

    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == meta["n_params"]
    assert model.cfg.num_heads == meta["transformer"]["num_heads"]
    assert model.cfg.depth == meta["transformer"]["num_layers"]


def _linen(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ren = {
        "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
        "LayerNorm_2": "LayerNorm_1",
        "MlpBlock_3": "MlpBlock_0",
    }
    out = {}
    for k, v in arrays.items():
        parts = k.split("/")
        out["/".join(ren.get(p, p) if "encoderblock" in k else p for p in parts)] = v
    return out


def _scanned(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One `encoderblock` whose arrays carry a leading depth axis, as big_vision's scan=True."""
    blocks: dict[str, dict[int, np.ndarray]] = {}
    out = {}
    for k, v in arrays.items():
        m = re.match(r"^Transformer/encoderblock_(\d+)/(.*)$", k)
        if m:
            blocks.setdefault(m[2], {})[int(m[1])] = v
        else:
            out[k] = v
    for rest, by_depth in blocks.items():
        out[f"Transformer/encoderblock/{rest}"] = np.stack([by_depth[i] for i in sorted(by_depth)])
    return out


def _bf16_void(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """How numpy stores bfloat16 without ml_dtypes: 2-byte void holding the upper 16 bits."""
    out = {}
    for k, v in arrays.items():
        bits = (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        out[k] = bits.view("V2")
    return out


NAMINGS = {
    "released": lambda a: a,
    "opt_target_prefix": lambda a: {f"opt/target/{k}": v for k, v in a.items()},
    "linen_params_prefix": lambda a: {f"params/{k}": v for k, v in _linen(a).items()},
    "linen_scan_stacked": lambda a: _scanned(_linen(a)),
}


@pytest.mark.parametrize("naming", list(NAMINGS))
def test_every_npz_naming_era_gives_the_same_logits(tmp_path, naming):
    path, x, ref = fixture("vit_token_p4")
    with np.load(path) as z:
        arrays = NAMINGS[naming]({k: z[k] for k in z.files})
    np.savez(tmp_path / "c.npz", **arrays)
    assert detect_format(tmp_path / "c.npz") == "npz"
    with torch.no_grad():
        got = vitkit.load(tmp_path / "c.npz")(x).numpy()
    assert np.abs(got - ref).max() <= TOL


def test_big_vision_top_level_posemb_without_class_row(tmp_path):
    """big_vision adds no position embedding to the class token; vitkit stores a zero row."""
    model = ours(pool="token")
    with torch.no_grad():
        model.pos_embed[:, 0].zero_()
    arrays = npz_conv.state_dict_to_npz(model.state_dict(), model.cfg)
    arrays["pos_embedding"] = arrays.pop("Transformer/posembed_input/pos_embedding")[:, 1:]
    np.savez(tmp_path / "bv.npz", **{f"params/{k}": v for k, v in _linen(arrays).items()})
    loaded = vitkit.load(tmp_path / "bv.npz")
    assert loaded.cfg.grid_size == model.cfg.grid_size
    x = images()
    with torch.no_grad():
        assert max_diff(loaded(x), model(x)) <= TOL


def test_bf16_npz_is_widened_exactly(tmp_path):
    path, x, _ = fixture("vit_token_p4")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(tmp_path / "bf16.npz", **_bf16_void(arrays))
    loaded = vitkit.load(tmp_path / "bf16.npz")
    # The reference: the same model with every weight rounded toward zero to bf16 (truncation).
    ref_arrays = {k: ((v.view(np.uint32) >> 16) << 16).view(np.float32) for k, v in arrays.items()}
    np.savez(tmp_path / "f32.npz", **ref_arrays)
    ref = vitkit.load(tmp_path / "f32.npz")
    same_state(loaded.state_dict(), ref.state_dict())
    assert any(
        not torch.equal(a, b)
        for a, b in zip(loaded.state_dict().values(), vitkit.load(path).state_dict().values())
    )


@pytest.mark.parametrize(
    "kw",
    [
        dict(pool="token"),
        dict(pool="gap"),
        dict(representation_size=48),
        dict(num_classes=0),
        dict(qkv_bias=False),
        dict(image_size=(32, 48)),
    ],
    ids=["token", "gap", "pre_logits", "no_head", "no_qkv_bias", "non_square"],
)
def test_npz_round_trip_is_exact(tmp_path, kw):
    model = ours(**kw)
    write_checkpoint(as_ckpt(model), tmp_path / "m.npz", "npz")
    grid = model.cfg.grid_size if model.cfg.grid_size[0] != model.cfg.grid_size[1] else None
    back = read_checkpoint(tmp_path / "m.npz", grid=grid)
    assert back.model_config == model.cfg.replace(pos_resample="zoom")  # the official kernel
    same_state(back.state_dict, model.state_dict())


def test_hybrid_npz_round_trip_is_exact(tmp_path):
    ckpt = read_checkpoint(FIXTURES / "hybrid_r1.npz")
    write_checkpoint(ckpt, tmp_path / "h.npz", "npz")
    with np.load(FIXTURES / "hybrid_r1.npz") as a, np.load(tmp_path / "h.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k


# ---------------------------------------------------------------------------------------------
# timm


@pytest.mark.parametrize("pool", ["token", "gap"])
@pytest.mark.parametrize("gelu", ["none", "tanh"])
def test_timm_logits_match_on_identical_weights(tmp_path, pool, gelu):
    timm = import_reference("timm")
    cfg = ours(pool=pool, gelu=gelu).cfg
    ref = perturbed(timm.create_model("vit_base_patch16_224", **timm_conv.timm_model_args(cfg)))
    save_file(ref.state_dict(), tmp_path / "timm.safetensors")
    torch.save(ref.state_dict(), tmp_path / "timm.pth")
    x = images()
    for f in ("timm.safetensors", "timm.pth"):
        model, ckpt = load_model(tmp_path / f, num_heads=4)
        assert ckpt.format == "timm"
        if gelu == "tanh":  # a bare state dict cannot say which GELU it was trained with
            assert model.cfg.gelu == "none"
            model = vitkit.create_model(model.cfg.replace(gelu="tanh"))
            model.load_state_dict(ckpt.state_dict)
            model.eval()
        with torch.no_grad():
            assert max_diff(model(x), ref(x)) <= TOL
            assert (
                max_diff(
                    model.forward_head(model.forward_features(x), pre_logits=True),
                    ref.forward_head(ref.forward_features(x), pre_logits=True),
                )
                <= TOL
            )


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_timm_round_trip_and_local_dir_folder(tmp_path, pool):
    timm = import_reference("timm")
    model = ours(pool=pool)
    ckpt = as_ckpt(model)
    write_checkpoint(ckpt, tmp_path / "sd.safetensors", "timm")
    back = read_checkpoint(tmp_path / "sd.safetensors", num_heads=4)
    same_state(back.state_dict, model.state_dict())
    write_checkpoint(ckpt, tmp_path / "folder", "timm")
    again = read_checkpoint(tmp_path / "folder")  # the folder keeps tanh GELU via act_layer
    assert again.model_config == model.cfg.replace(pos_resample="bicubic-antialias")
    same_state(again.state_dict, model.state_dict())
    ref = timm.create_model(f"local-dir:{tmp_path / 'folder'}", pretrained=True).eval()
    x = images()
    with torch.no_grad():
        assert max_diff(ref(x), model(x)) <= TOL


def test_timm_old_pre_logits_names_and_training_checkpoints(tmp_path):
    model = ours(representation_size=48)
    sd = {k.replace("pre_logits.0.", "pre_logits.fc."): v for k, v in model.state_dict().items()}
    torch.save(
        {"epoch": 3, "state_dict": {f"module.{k}": v for k, v in sd.items()}},
        tmp_path / "train.pth.tar",
    )
    loaded, ckpt = load_model(tmp_path / "train.pth.tar", num_heads=4, gelu="tanh")
    assert ckpt.model_config.representation_size == 48
    same_state(loaded.state_dict(), model.state_dict())
    with pytest.raises(VitkitError, match="no pre-logits layer"):
        write_checkpoint(as_ckpt(model), tmp_path / "t.safetensors", "timm")


def test_timm_heads_of_a_non_standard_width_must_be_given(tmp_path):
    model = ours()  # width 64: not a table size
    save_file(dict(model.state_dict()), tmp_path / "w64.safetensors")
    with pytest.raises(VitkitError, match="pass num_heads"):
        read_checkpoint(tmp_path / "w64.safetensors")
    assert read_checkpoint(tmp_path / "w64.safetensors", num_heads=4).model_config.num_heads == 4


def test_timm_architectures_that_are_not_the_paper_are_refused(tmp_path):
    timm = import_reference("timm")
    ref = timm.create_model(
        "vit_base_patch16_224",
        img_size=32,
        patch_size=8,
        embed_dim=64,
        depth=1,
        num_heads=4,
        global_pool="map",
        class_token=False,
    )
    # AttentionPoolLatent(pos_embed="abs"): a MAP head with position embeddings of its own
    sd = {**ref.state_dict(), "attn_pool.pos_embed": torch.zeros(16, 64)}
    save_file(sd, tmp_path / "map.safetensors")
    with pytest.raises(VitkitError, match=r"map.safetensors: an attention-pooling head other"):
        read_checkpoint(tmp_path / "map.safetensors", num_heads=4)


# ---------------------------------------------------------------------------------------------
# Hugging Face


def hf_config(transformers, **kw):
    base = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    return transformers.ViTConfig(**{**base, **kw})


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "quick_gelu"])
def test_hf_classifier_logits_match_and_settings_travel(tmp_path, act):
    """Each ``hidden_act`` is read and written back as itself (quick GELU was refused on
    reading, and a writer that knew only two would have written it as the exact GELU)."""
    transformers = import_reference("transformers")
    ref = perturbed(transformers.ViTForImageClassification(hf_config(transformers, hidden_act=act)))
    ref.save_pretrained(tmp_path / "hf")
    model, ckpt = load_model(tmp_path / "hf")
    assert ckpt.format == "hf"
    assert model.cfg.layer_norm_eps == 1e-12  # HF's default, honoured rather than assumed
    gelus = {"gelu_pytorch_tanh": "tanh", "gelu": "none", "quick_gelu": "quick"}
    assert model.cfg.gelu == gelus[act]
    x = images()
    with torch.no_grad():
        assert max_diff(model(x), ref(x).logits) <= TOL
    write_checkpoint(ckpt, tmp_path / "back", "hf")
    again = transformers.ViTForImageClassification.from_pretrained(tmp_path / "back").eval()
    assert again.config.hidden_act == act or (act, again.config.hidden_act) == ("gelu", "gelu")
    with torch.no_grad():
        assert max_diff(again(x).logits, ref(x).logits) <= TOL


def test_hf_model_pooler_is_the_pre_logits_layer(tmp_path):
    transformers = import_reference("transformers")
    ref = perturbed(transformers.ViTModel(hf_config(transformers, pooler_output_size=48)))
    ref.save_pretrained(tmp_path / "hf")
    model, ckpt = load_model(tmp_path / "hf")
    assert ckpt.model_config.representation_size == 48 and ckpt.model_config.num_classes == 0
    x = images()
    with torch.no_grad():
        out = ref(x)
        assert max_diff(model(x), out.pooler_output) <= TOL
        assert max_diff(model.forward_features(x), out.last_hidden_state) <= TOL


def _hf_load_quietly(cls, path, caplog, **kw):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model, info = cls.from_pretrained(path, output_loading_info=True, **kw)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    noisy = [r.getMessage() for r in caplog.records if "key" in r.getMessage().lower()]
    assert not noisy, noisy
    return model.eval()


@pytest.mark.parametrize("naming", ["4", "5"])
@pytest.mark.parametrize(
    "kw",
    [dict(), dict(num_classes=0), dict(num_classes=0, representation_size=48)],
    ids=["classifier", "model", "pooler"],
)
def test_hf_written_folder_loads_without_warnings_and_round_trips(tmp_path, caplog, naming, kw):
    transformers = import_reference("transformers")
    model = ours(**kw)
    names = tuple(f"c{i}" for i in range(model.cfg.num_classes))
    ckpt = as_ckpt(model)
    ckpt.class_names = names
    write_checkpoint(ckpt, tmp_path / "hf", "hf", hf_naming=naming)
    x = images()
    if model.cfg.num_classes:
        ref = _hf_load_quietly(transformers.ViTForImageClassification, tmp_path / "hf", caplog)
        with torch.no_grad():
            assert max_diff(ref(x).logits, model(x)) <= TOL
        assert ref.config.id2label[1] == "c1"
    else:
        pool = model.cfg.representation_size is not None
        ref = _hf_load_quietly(
            transformers.ViTModel, tmp_path / "hf", caplog, add_pooling_layer=pool
        )
        with torch.no_grad():
            out = ref(x)
            assert (
                max_diff(out.pooler_output if pool else out.last_hidden_state[:, 0], model(x))
                <= TOL
            )
    back = read_checkpoint(tmp_path / "hf")
    assert back.model_config == model.cfg
    assert back.class_names == names
    same_state(back.state_dict, model.state_dict())


def test_hf_cannot_hold_gap_or_pre_logits_with_a_head(tmp_path):
    with pytest.raises(VitkitError, match="global-average"):
        write_checkpoint(as_ckpt(ours(pool="gap")), tmp_path / "a", "hf")
    with pytest.raises(VitkitError, match="drop-pre-logits"):
        write_checkpoint(as_ckpt(ours(representation_size=48)), tmp_path / "b", "hf")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_hf_preprocessing_travels_to_predict(tmp_path, capsys):
    from PIL import Image

    from vitkit.cli import main

    model = ours()
    ckpt = as_ckpt(model)
    ckpt.preprocess = PreprocessConfig(
        (32, 32), 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bicubic", 1.0
    )
    write_checkpoint(ckpt, tmp_path / "hf", "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ours"), "--to", "vitkit"]) == 0
    loaded = read_checkpoint(tmp_path / "ours")
    assert loaded.preprocess == ckpt.preprocess
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    capsys.readouterr()
    assert (
        main(
            [
                "predict",
                str(tmp_path / "x.png"),
                "--from",
                str(tmp_path / "hf"),
                "--json",
                "--top-k",
                "1",
            ]
        )
        == 0
    )
    import json

    got = json.loads(capsys.readouterr().out)["top_k"][0]
    from vitkit.data import PilEvalTransform, normalize

    pre = ckpt.preprocess
    tf = PilEvalTransform(pre.image_size, 3, crop_pct=1.0, interpolation="bicubic")
    img = Image.open(tmp_path / "x.png").convert("RGB")
    x = normalize(tf(img)[None].float(), pre.mean, pre.std)
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    assert got["index"] == int(probs.argmax())
    assert abs(got["prob"] - float(probs.max())) < 1e-5


# ---------------------------------------------------------------------------------------------
# Resolution and heads


def test_resampling_to_the_same_grid_is_the_identity():
    pos = torch.randn(1, 1 + 12, 8)
    for mode in ("bicubic", "bilinear", "zoom"):
        assert resample_pos_embed(pos, (3, 4), (3, 4), 1, mode) is pos


@pytest.mark.parametrize("old,new", [((7, 7), (12, 12)), ((4, 6), (9, 5)), ((12, 12), (7, 7))])
def test_zoom_mode_equals_the_official_scipy_zoom(old, new):
    from scipy import ndimage

    pos = torch.randn(1, 1 + old[0] * old[1], 16, generator=torch.Generator().manual_seed(0))
    got = resample_pos_embed(pos, old, new, 1, "zoom")
    grid = pos[0, 1:].reshape(*old, 16).numpy()
    ref = ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
    assert torch.equal(got[:, :1], pos[:, :1])  # the class-token row is kept apart
    assert np.abs(got[0, 1:].reshape(*new, 16).numpy() - ref).max() <= 1e-6


def test_bicubic_mode_equals_hugging_face_interpolation():
    transformers = import_reference("transformers")
    ref = perturbed(transformers.ViTModel(hf_config(transformers), add_pooling_layer=False))
    x = images(size=48)
    with torch.no_grad():
        want = ref(x, interpolate_pos_encoding=True).last_hidden_state
        emb = ref.embeddings.position_embeddings
        ours_pos = resample_pos_embed(emb, (4, 4), (6, 6), 1, "bicubic")
    # Rebuild HF at 48 px with our resampled table: same hidden states.
    big = transformers.ViTModel(hf_config(transformers, image_size=48), add_pooling_layer=False)
    sd = dict(ref.state_dict())
    sd["embeddings.position_embeddings"] = ours_pos
    big.load_state_dict(sd)
    with torch.no_grad():
        assert max_diff(big.eval()(x).last_hidden_state, want) <= TOL


def test_load_at_a_higher_resolution_runs_and_keeps_everything_else(tmp_path):
    path, _, _ = fixture("vit_token_p4")
    base = read_checkpoint(path)
    model = vitkit.load(path, image_size=48, resample="zoom")
    assert model.cfg.grid_size == (12, 12)
    with torch.no_grad():
        assert model(images(size=48)).shape == (2, 10)
    sd = model.state_dict()
    for k, v in base.state_dict.items():
        if k != "pos_embed":
            assert torch.equal(sd[k], v), k
    assert torch.equal(sd["pos_embed"][:, 0], base.state_dict["pos_embed"][:, 0])


def test_new_head_is_zero_and_pre_logits_can_be_dropped(tmp_path):
    model = ours(representation_size=48)
    write_checkpoint(as_ckpt(model), tmp_path / "m.npz", "npz")
    new = vitkit.load(tmp_path / "m.npz", num_classes=7)
    assert new.cfg.num_classes == 7 and new.cfg.representation_size == 48
    assert not new.head.weight.any() and not new.head.bias.any()
    dropped = vitkit.load(tmp_path / "m.npz", pre_logits=False)
    assert dropped.cfg.representation_size is None and dropped.head.in_features == 64
    assert not dropped.head.weight.any()
    with torch.no_grad():
        assert torch.equal(dropped(images()), torch.zeros(2, 5))


def test_a_loaded_zero_head_warns():
    model = ours()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(as_ckpt(model), Path(d) / "z.npz", "npz")
        with pytest.warns(UserWarning, match="head is all zeros"):
            vitkit.load(Path(d) / "z.npz")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            vitkit.load(Path(d) / "z.npz", num_classes=3)  # replaced: nothing to warn about


# ---------------------------------------------------------------------------------------------
# Safety and errors


class _Exploit:
    def __reduce__(self):
        return (print, ("this pickle ran code",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path, capsys):
    with open(tmp_path / "evil.pth", "wb") as f:
        pickle.dump({"patch_embed.proj.weight": _Exploit()}, f)
    with pytest.raises(VitkitError, match="refused to unpickle"):
        read_checkpoint(tmp_path / "evil.pth")
    np.savez(tmp_path / "evil.npz", x=np.array([_Exploit()], dtype=object))  # pickles it
    with pytest.raises(VitkitError, match="pickled Python objects"):
        read_checkpoint(tmp_path / "evil.npz")
    assert "this pickle ran code" not in capsys.readouterr().out


def test_a_refused_pickle_says_what_vitkit_reads_and_never_to_run_it(tmp_path, capsys):
    """No PyTorch hint to pass weights_only=False (running the file's code), no pickle
    protocol warning: one line saying what vitkit reads and how to convert a trusted file."""
    from vitkit.cli import main

    for name, save in (("plain", pickle.dump), ("torch", torch.save)):
        with open(tmp_path / f"{name}.pth", "wb") as f:
            save({"patch_embed.proj.weight": _Exploit()}, f)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["inspect", str(tmp_path / f"{name}.pth")]) == 2
        assert not [w for w in caught if "pickle" in str(w.message)], caught
        out, err = capsys.readouterr()
        assert "\n" not in err.strip() and "this pickle ran code" not in out
        assert "weights_only" not in err and "likely succeed" not in err, err
        assert "vitkit reads tensors only" in err and "save_file" in err, err


def test_truncated_files_get_a_clear_error(tmp_path):
    path, _, _ = fixture("vit_token_p4")
    data = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(VitkitError, match=r"cut\.npz: unreadable"):
        read_checkpoint(tmp_path / "cut.npz")
    save_file(dict(ours().state_dict()), tmp_path / "w.safetensors")
    blob = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(VitkitError, match=r"w\.safetensors: unreadable safetensors"):
        read_checkpoint(tmp_path / "w.safetensors")
    torch.save(dict(ours().state_dict()), tmp_path / "w.pth")
    blob = (tmp_path / "w.pth").read_bytes()
    (tmp_path / "w.pth").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(VitkitError, match=r"w\.pth: unreadable PyTorch file"):
        read_checkpoint(tmp_path / "w.pth")


def test_unknown_layouts_and_shape_mismatches_name_the_keys(tmp_path):
    np.savez(tmp_path / "resnet.npz", **{"conv1/kernel": np.zeros((3, 3, 3, 8), np.float32)})
    with pytest.raises(VitkitError, match=r"missing embedding/kernel.*conv1/kernel"):
        read_checkpoint(tmp_path / "resnet.npz")
    path, _, _ = fixture("vit_token_p4")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["Transformer/encoderblock_0/extra/kernel"] = np.zeros(3, np.float32)
    np.savez(tmp_path / "extra.npz", **arrays)
    with pytest.raises(VitkitError, match=r"not understood: Transformer/encoderblock_0/extra"):
        read_checkpoint(tmp_path / "extra.npz")
    model = ours()
    sd = dict(model.state_dict())
    sd["blocks.1.mlp.fc1.weight"] = torch.zeros(100, 64)
    save_file(sd, tmp_path / "bad.safetensors")
    with pytest.raises(VitkitError, match=r"blocks\.1\.mlp\.fc1\.weight: \(100, 64\)"):
        load_model(tmp_path / "bad.safetensors", num_heads=4)


def test_inspect_and_convert_cli(tmp_path, capsys):
    from vitkit.cli import main

    path, x, ref = fixture("vit_token_p4")
    assert main(["inspect", str(path), "--json"]) == 0
    import json

    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "npz" and info["parameters"] == 75082
    assert info["resolution"] == [32, 32] and info["num_classes"] == 10
    for to, dst in (("hf", "hf"), ("timm", "timm"), ("vitkit", "v"), ("npz", "n.npz")):
        assert main(["convert", str(path), str(tmp_path / dst), "--to", to]) == 0
    model = vitkit.load(tmp_path / "v")
    with torch.no_grad():
        assert np.abs(model(x).numpy() - ref).max() <= TOL
    assert (
        main(
            [
                "convert",
                str(tmp_path / "hf"),
                str(tmp_path / "big"),
                "--to",
                "vitkit",
                "--image-size",
                "48",
                "--num-classes",
                "3",
            ]
        )
        == 0
    )
    assert main(["inspect", str(tmp_path / "big")]) == 0
    out = capsys.readouterr().out
    assert "48x48 (grid 12x12)" in out and "all zeros" in out
    assert main(["convert", str(tmp_path / "nothing.npz"), str(tmp_path / "o"), "--to", "hf"]) == 2
    assert "nothing.npz" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["transposed", "short"])
def test_convert_checks_shapes_as_strictly_as_loading(tmp_path, capsys, bad):
    """A tensor of the wrong shape (with the same parameter count or not) is refused by
    convert, inspect and write_checkpoint, naming the key; nothing is written."""
    from vitkit.cli import main

    sd = dict(ours().state_dict())
    w = sd["blocks.1.mlp.fc1.weight"]
    sd["blocks.1.mlp.fc1.weight"] = w.t().contiguous() if bad == "transposed" else w[:100]
    save_file(sd, tmp_path / "bad.safetensors")
    src = str(tmp_path / "bad.safetensors")
    for argv in (
        ["convert", src, str(tmp_path / "hf"), "--to", "hf", "--num-heads", "4"],
        ["inspect", src, "--num-heads", "4"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "blocks.1.mlp.fc1.weight: (" in err, err
    assert not (tmp_path / "hf").exists()
    ckpt = as_ckpt(ours())
    ckpt.state_dict["blocks.1.mlp.fc1.weight"] = sd["blocks.1.mlp.fc1.weight"]
    with pytest.raises(VitkitError, match=r"blocks\.1\.mlp\.fc1\.weight: \("):
        write_checkpoint(ckpt, tmp_path / "t", "timm")
    assert not (tmp_path / "t").exists()


def test_npz_that_is_not_arrays_says_why(tmp_path, capsys):
    """A zip named .npz holding a non-array member, and random bytes named .npz: one line
    with the right reason from inspect, eval and convert."""
    import zipfile

    from vitkit.cli import main

    with zipfile.ZipFile(tmp_path / "text.npz", "w") as z:
        z.writestr("readme.txt", "not an array")
    (tmp_path / "random.npz").write_bytes(bytes(range(7, 256)) * 4)
    cases = {"text": "member 'readme.txt' is not a .npy array", "random": "not an .npz (a zip"}
    for name, reason in cases.items():
        src = str(tmp_path / f"{name}.npz")
        for argv in (
            ["inspect", src],
            ["eval", "--from", src, "--data", "digits"],
            ["convert", src, str(tmp_path / "out"), "--to", "vitkit"],
        ):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip()
            assert "\n" not in err and reason in err and "pickle" not in err, err
