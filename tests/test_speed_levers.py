"""The GPU speed levers as far as the CPU can check them: which Linear layers ``--precision fp8``
swaps (train.float8), that the swapped model computes what the bf16 one does and keeps its
checkpoint, the one-line refusals (fp8 on a device without float8 matmuls, the missing
extra, an attention kernel the device lacks), and that ``--attention-backend`` really reaches
``scaled_dot_product_attention`` (models.sdpa_backend). The CUDA runs are in test_gpu.py."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.eval.checkpoint_eval import checkpoint_precision
from vitkit.models.sdpa_backend import check_sdpa_backend, sdpa_backend
from vitkit.models.vit import create_model
from vitkit.train.float8 import FP8_MIN_PARAMS, check_fp8_device, convert_to_fp8, fp8_eligible
from vitkit.train.train_config import TrainConfig

pytest.importorskip("torchao")
TINY = ["--model", "Ti/2", "-o", "width=32", "-o", "depth=2", "-o", "num_heads=2"]
TINY += ["-o", "mlp_dim=64", "--data", "digits", "--no-progress", "--batch-size", "32"]


def test_the_default_swaps_vit_b_qkv_and_mlp_and_keeps_the_projection_and_head() -> None:
    """ViT-B/16 (built on the meta device: no memory): qkv 768x2304 and the MLP's 768x3072 and
    3072x768 hold at least 2**20 weights; the 768x768 projection does not, nor the 1000-class
    head (1000 is not a multiple of 16)."""
    with torch.device("meta"):
        model = create_model("B/16", num_classes=1000)
    chosen = [n for n, m in model.named_modules() if fp8_eligible(m)]
    assert len(chosen) == 12 * 3
    assert {n.split(".", 2)[2] for n in chosen} == {"attn.qkv", "mlp.fc1", "mlp.fc2"}
    everything = [n for n, m in model.named_modules() if fp8_eligible(m, min_params=0)]
    assert len(everything) == 12 * 4 and "head" not in everything
    assert 768 * 768 < FP8_MIN_PARAMS <= 768 * 2304  # the projection out, qkv in


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_float8_model_computes_the_bf16_one_and_keeps_its_checkpoint(recipe: str) -> None:
    """Logits and weight gradients of the swapped model against the same weights in bf16
    (torchao's float8 matmuls run on the CPU too, emulated): the float8 rounding error, a few
    per cent, and no more; the state dict keeps every key, dtype and value."""
    torch.manual_seed(0)
    model = create_model("Ti/16", width=128, depth=2, num_heads=2, mlp_dim=256, num_classes=10,
                         image_size=(32, 32))  # fmt: skip
    torch.nn.init.normal_(model.head.weight, std=0.2)
    reference = create_model("Ti/16", width=128, depth=2, num_heads=2, mlp_dim=256,
                             num_classes=10, image_size=(32, 32))  # fmt: skip
    reference.load_state_dict(model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    swapped = convert_to_fp8(model, recipe, min_params=0)
    assert sorted(swapped) == sorted(
        f"blocks.{i}.{p}" for i in range(2) for p in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
    )
    assert all(type(model.get_submodule(n)).__name__ == "Float8Linear" for n in swapped)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(
        torch.equal(after[k], before[k]) and after[k].dtype == before[k].dtype for k in before
    )
    x = torch.randn(16, 3, 32, 32)
    outs = []
    for m in (model, reference):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(x)
        logits.float().square().sum().backward()
        outs.append((logits.detach().float(), m.blocks[0].mlp.fc1.weight.grad))
    (ours, g_ours), (ref, g_ref) = outs
    # measured: logits 0.087 (tensorwise) and 0.079 (rowwise), fc1's gradient 0.150 and 0.126
    # (e5m2 gradients: two mantissa bits); different weights would be off by about 1.4
    assert 0 < float((ours - ref).norm() / ref.norm()) < 0.15
    assert 0 < float((g_ours - g_ref).norm() / g_ref.norm()) < 0.3
    plain = create_model("Ti/16", width=128, depth=2, num_heads=2, mlp_dim=256, num_classes=10,
                         image_size=(32, 32))  # fmt: skip
    plain.load_state_dict(model.state_dict())  # a float8 run's checkpoint is an ordinary one


def test_a_batch_off_the_float8_kernels_multiple_of_16_is_padded_only_then() -> None:
    for batch, padded in ((256, False), (None, False), (7, True)):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64))
        convert_to_fp8(model, min_params=0, batch=batch)
        assert model[0].config.pad_inner_dim is padded


def test_a_float8_model_is_evaluated_under_bf16_autocast() -> None:
    """An fp8 run's validation: its float8 layers under autocast (inference mode refuses the
    cast, so the evaluation runs under no_grad) give the same accuracy as the plain model."""
    from vitkit.eval.classification import evaluate_classification

    torch.manual_seed(0)
    model = create_model("Ti/16", width=64, depth=1, num_heads=2, mlp_dim=128, num_classes=10,
                         image_size=(32, 32))  # fmt: skip
    torch.nn.init.normal_(model.head.weight, std=0.5)
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    batches = [(images, torch.arange(8), 0)]
    plain = evaluate_classification(model, batches, 10, autocast_dtype=torch.bfloat16)
    convert_to_fp8(model, min_params=0)
    ours = evaluate_classification(model, batches, 10, autocast_dtype=torch.bfloat16)
    assert ours.num_samples == 8 and abs(ours.loss - plain.loss) < 0.1 * plain.loss
    assert torch.is_inference_mode_enabled() is False


def test_fp8_is_refused_on_the_cpu_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", *TINY, "--precision", "fp8", "--out-dir", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compute capability 8.9 or newer" in err[0] and "cpu" in err[0]
    assert "--precision bf16" in err[0] and not out.exists()
    with pytest.raises(VitkitError, match="device is cpu"):
        check_fp8_device(torch.device("cpu"))


def test_fp8_without_torchao_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_torchao(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    with pytest.raises(VitkitError, match=r"pip install '\.\[fp8\]' in vitkit's clone"):
        convert_to_fp8(torch.nn.Sequential(torch.nn.Linear(16, 16)))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fp8_recipe": "blockwise"}, "fp8_recipe must be one of tensorwise, rowwise"),
        ({"fp8_min_params": -1}, "fp8_min_params must be at least 0"),
        ({"attention_backend": "xformers"}, "attention_backend must be one of auto, flash"),
        ({"precision": "fp16"}, "precision must be auto, fp32, bf16 or fp8"),
    ],
)
def test_bad_lever_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(VitkitError, match=message):
        TrainConfig(**fields)  # type: ignore[arg-type]


def test_a_cuda_only_attention_kernel_is_refused_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("cudnn", "efficient"):
        with pytest.raises(VitkitError, match=f"attention backend {name} runs on CUDA GPUs only"):
            check_sdpa_backend(name, torch.device("cpu"))
    out = tmp_path / "run"
    assert main(["train", *TINY, "--attention-backend", "cudnn", "--out-dir", str(out)]) != 0
    assert "CUDA GPUs only" in capsys.readouterr().err and not out.exists()


def test_the_attention_backend_reaches_sdpa() -> None:
    """Inside ``sdpa_backend("efficient")`` the CPU has no kernel left (the context works);
    ``math`` and ``flash`` compute the same attention as PyTorch's own choice."""
    q, k, v = (torch.randn(2, 4, 17, 16) for _ in range(3))
    auto = F.scaled_dot_product_attention(q, k, v)
    with (
        sdpa_backend("efficient"),
        pytest.raises(RuntimeError, match="No (available kernel|viable backend)"),
    ):
        F.scaled_dot_product_attention(q, k, v)
    for name in ("math", "flash"):
        with sdpa_backend(name):
            assert torch.allclose(F.scaled_dot_product_attention(q, k, v), auto, atol=1e-5)


def test_a_run_with_an_attention_backend_trains_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--attention-backend math`` on the CPU: the run trains, its banner names the kernel and
    its train_config.json records it (with the fp8 fields' defaults)."""
    out = tmp_path / "run"
    args = ["train", *TINY, "--epochs", "1", "--max-steps", "3", "--precision", "fp32"]
    assert main([*args, "--attention-backend", "math", "--out-dir", str(out)]) == 0
    assert "math attention" in capsys.readouterr().err
    recorded = json.loads((out / "train_config.json").read_text())
    assert recorded["attention_backend"] == "math" and recorded["fp8_recipe"] == "tensorwise"


def test_an_fp8_run_is_evaluated_in_bf16() -> None:
    from types import SimpleNamespace

    ckpt = SimpleNamespace(meta={"train_config": {"precision": "fp8"}})
    precision, why = checkpoint_precision(ckpt, None)  # type: ignore[arg-type]
    assert precision == "bf16" and "float8" in why
    assert checkpoint_precision(ckpt, "fp32")[0] == "fp32"  # type: ignore[arg-type]


def test_the_attention_backend_is_traced_by_torch_compile() -> None:
    """A context around a compiled call is not seen by the compiled graph (PyTorch does not
    guard on it), so each attention layer carries the choice and enters it itself: with
    ``efficient`` (no CPU kernel) set on the layers, the compiled model fails as the eager one
    does; the same context around the compiled plain model changes nothing."""
    from vitkit.models.sdpa_backend import set_attention_backend

    torch.manual_seed(0)
    model = create_model("Ti/4", width=32, depth=1, num_heads=2, mlp_dim=64, num_classes=10,
                         image_size=(16, 16)).eval()  # fmt: skip
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, dynamic=False)
    with torch.no_grad():
        expected = compiled(x)
        with sdpa_backend("efficient"):  # around the call: the traced graph keeps its kernel
            assert torch.allclose(compiled(x), expected)
        assert set_attention_backend(model, "efficient") == 1
        with pytest.raises(Exception, match="No (available kernel|viable backend)"):
            compiled(x)
        set_attention_backend(model, "math")
        assert torch.allclose(compiled(x), expected, atol=1e-5)
