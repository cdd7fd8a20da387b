"""fp8 inference (``--precision fp8`` of eval, predict and serve) as far as the CPU can check
it: the one-line refusals (the device, options that change nothing without it, another
engine), which layers it takes, and the conversion itself with torchao's device gate lifted
(the cast and the forward run on CPU tensors; only the gate asks for a GPU). The runs on a
GPU are in test_gpu.py."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from references import load_bench

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.engines.float8_inference import GPUModel, bf16_gpu_model, quantize_fp8_linears
from vitkit.errors import VitkitError
from vitkit.eval.checkpoint_eval import check_finite_weights, non_finite_weights
from vitkit.float8_layers import FP8_MIN_PARAMS, fp8_layer_names, fp8_refusal
from vitkit.models.vit import create_model

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: fp8 runs")
BLOCK_LINEARS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def tiny() -> torch.nn.Module:
    """Two blocks of width 32 (every block Linear's sides multiples of 16) and a 10-class head
    (not a multiple of 16)."""
    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=10, width=32, depth=2, num_heads=2, mlp_dim=64
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("fp8")
    save_checkpoint(d / "ck", tiny(), meta={"dataset": "digits"})
    img = d / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8)).save(img)
    return d / "ck", img


def test_the_refusal_is_one_line_saying_why_and_what_instead() -> None:
    line = fp8_refusal("cpu")
    assert line is not None and "\n" not in line
    assert "compute capability 8.9 or newer" in line and "device is cpu" in line
    assert line.endswith("use --precision bf16")
    beside = fp8_refusal("cpu", gpu_visible=True)  # eval's default device on a GPU machine
    assert beside is not None and "--device cuda" in beside
    old = fp8_refusal("cuda", (8, 6), "NVIDIA A100-SXM4-40GB")
    assert old is not None and "NVIDIA A100-SXM4-40GB is 8.6: use --precision bf16" in old
    for capability in ((8, 9), (9, 0), (10, 0), (12, 0)):  # Ada, Hopper, Blackwell
        assert fp8_refusal("cuda", capability, "a GPU") is None


@NO_GPU
@pytest.mark.parametrize("command", ["eval", "predict", "serve"])
def test_fp8_is_refused_on_the_cpu_before_any_weights_are_read(
    command: str, ckpt: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal comes first: the same line for a checkpoint that is not there."""
    path, img = ckpt
    out = tmp_path / "eval"
    for source in (path, tmp_path / "not-there"):
        args = {
            "eval": ["eval", "--from", str(source), "--out", str(out)],
            "predict": ["predict", "--from", str(source), str(img)],
            "serve": ["serve", str(source), "--dry-run"],
        }[command]
        assert main([*args, "--precision", "fp8"]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert "compute capability 8.9 or newer" in err[0] and "device is cpu" in err[0]
        assert "--precision bf16" in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fp8-recipe", "rowwise"], "--fp8-recipe sets how --precision fp8 runs; this run's "
         "precision is {default}"),
        (["--precision", "bf16", "--fp8-min-params", "0", "--fp8-recipe", "rowwise"],
         "--fp8-recipe and --fp8-min-params set how --precision fp8 runs; this run's precision "
         "is bf16"),
        (["--precision", "fp8", "--engine", "onnxruntime"],
         "--precision fp8 runs under the torch engine on a GPU, not onnxruntime"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["eval", "predict", "serve"])
def test_fp8_options_that_would_change_nothing_are_refused(
    command: str,
    args: list[str],
    message: str,
    ckpt: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, img = ckpt
    first = {
        "eval": ["eval", "--from", str(path), "--out", str(path.parent / "never")],
        "predict": ["predict", "--from", str(path), str(img)],
        "serve": ["serve", str(path), "--dry-run"],
    }[command]
    assert main([*first, *args]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    # (serve's default precision is auto: bf16 or fp32 as the CPU and the model allow)
    message = message.format(default="auto" if command == "serve" else "the default")
    assert len(err) == 1 and message in err[0], err
    assert not (path.parent / "never").exists()


def test_fewshot_has_no_fp8(ckpt: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """fp8 is an inference path of eval, predict and serve; fewshot's features stay bf16."""
    assert main(["fewshot", "--from", str(ckpt[0]), "--data", "digits", "--precision", "fp8"]) == 2
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_the_layers_taken_are_trainings() -> None:
    """ViT-B/16 on the meta device (no memory): the default takes qkv and the MLP's two
    layers of every block, not the 768x768 projection nor the 1000-class head; 0 takes every
    block Linear; the tiny model's 32-wide layers only at 0."""
    with torch.device("meta"):
        model = create_model("B/16", num_classes=1000)
    chosen = fp8_layer_names(model)
    assert len(chosen) == 36 and {n.split(".", 2)[2] for n in chosen} == {
        "attn.qkv",
        "mlp.fc1",
        "mlp.fc2",
    }
    assert len(fp8_layer_names(model, 0)) == 48 and "head" not in fp8_layer_names(model, 0)
    assert fp8_layer_names(tiny(), FP8_MIN_PARAMS) == []
    assert fp8_layer_names(tiny(), 0) == [
        f"blocks.{i}.{p}" for i in range(2) for p in BLOCK_LINEARS
    ]


@pytest.fixture
def no_device_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchao's float8 cast asserts a GPU of capability 8.9+ (or MI300, XPU) before it casts;
    the cast and the forward themselves run on CPU tensors. Lifted here, so that what vitkit
    asks of torchao (which layers, which scaling, the weights cast once) is checked on every
    commit; test_gpu.py runs the same on a GPU with the gate in place."""
    quant_api = pytest.importorskip("torchao.quantization.quant_api")
    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_chosen_weights_become_float8_once_and_the_rest_stay_bf16(
    no_device_gate: None, recipe: str
) -> None:
    model = tiny()
    reference = bf16_gpu_model(copy.deepcopy(model), "cpu")  # the wrapper, on the CPU here
    converted = copy.deepcopy(model).to(torch.bfloat16)
    chosen = quantize_fp8_linears(converted, recipe, min_params=0)
    assert chosen == [f"blocks.{i}.{p}" for i in range(2) for p in BLOCK_LINEARS]
    for name, module in converted.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        w = module.weight
        if name in chosen:
            assert type(w).__name__ == "Float8Tensor" and w.qdata.dtype == torch.float8_e4m3fn
            rows = w.scale.shape[0]
            assert rows == (1 if recipe == "tensorwise" else module.out_features)
        else:
            assert type(w) is torch.nn.Parameter and w.dtype == torch.bfloat16, name
    ours = GPUModel(converted, torch.device("cpu"), "fp8", recipe, chosen)
    assert ours.summary() == f"{recipe}: 8 Linear layers in float8, the rest bf16, on cpu"
    torch.manual_seed(0)
    x = torch.randn(256, 1, 8, 8)
    with torch.inference_mode():
        got, ref = ours(x), reference(x)
    assert got.dtype == torch.float32 and got.device == x.device and got.shape == (256, 10)
    assert not torch.equal(got, ref)  # float8 matmuls did run
    # measured (inputs of seeds 0-2): logits 0.081-0.093 apart (bf16 from fp32: 0.010), top-1
    # the same on 91-95 % (bf16 and fp32: 99-100 %) of these near-tied random-weight logits;
    # weights cast without their scales would be far off
    assert float((got - ref).norm() / ref.norm()) < 0.15
    assert float((got.argmax(-1) == ref.argmax(-1)).float().mean()) > 0.85
    check_finite_weights(ours, _ckpt_like())  # a float8 weight is read as its values


def test_a_float8_weight_holding_nan_is_found(no_device_gate: None) -> None:
    model = tiny().to(torch.bfloat16)
    with torch.no_grad():
        model.blocks[1].mlp.fc1.weight[0, 0] = float("nan")
    quantize_fp8_linears(model, min_params=0)
    assert type(model.blocks[1].mlp.fc1.weight).__name__ == "Float8Tensor"
    assert non_finite_weights(model) == ["blocks.1.mlp.fc1.weight"]
    with pytest.raises(VitkitError, match="NaN or infinite"):
        check_finite_weights(model, _ckpt_like())


def test_the_gpu_wrapper_moves_casts_and_answers_fp32_on_the_callers_device() -> None:
    """bf16_gpu_model (the reference fp8 is measured against) with the CPU as its device:
    bf16 weights, an fp32 input cast on the way in, fp32 logits back; a NaFlex batch's pixel
    values cast and its integer fields kept."""
    model = tiny()
    with torch.no_grad():
        fp32 = model(torch.zeros(2, 1, 8, 8))
    wrapped = bf16_gpu_model(model, "cpu")
    assert all(p.dtype == torch.bfloat16 for p in wrapped.model.parameters())
    assert wrapped.summary() == "bf16 weights on cpu" and wrapped.precision == "bf16"
    got = wrapped(torch.zeros(2, 1, 8, 8))
    assert got.dtype == torch.float32 and (got - fp32).abs().max() < 0.05 * fp32.abs().max()
    seen: dict[str, torch.dtype] = {}
    probe = GPUModel(torch.nn.Identity(), torch.device("cpu"))
    probe.model = _Record(seen)
    probe({"patches": torch.zeros(1, 4, 3), "valid": torch.ones(1, 4, dtype=torch.bool)})
    assert seen == {"patches": torch.bfloat16, "valid": torch.bool}


class _Record(torch.nn.Module):
    def __init__(self, seen: dict[str, torch.dtype]) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen.update({k: v.dtype for k, v in x.items()})
        return torch.zeros(1, 10, dtype=torch.bfloat16)


def _ckpt_like() -> object:
    class Ckpt:
        path = Path("ck")

    return Ckpt()


def test_bench_times_float8_inference_as_levers_and_measures_its_agreement(
    no_device_gate: None,
) -> None:
    """bench/speed.py's ``vitkit+fp8infer`` (and its rowwise / every-layer variants) parse as
    levers; without a GPU the model is refused with the one line; the agreement it records
    (speed_fp8_inference.agreement_with_bf16) of a float8 model with the bf16 one."""
    speed = load_bench("speed")
    lever = load_bench("speed_fp8_inference")
    for impl in ("vitkit+fp8infer", "vitkit+fp8inferr", "vitkit+fp8inferall"):
        assert speed.split_impl(impl) == ("vitkit", [impl.split("+")[1]])
    with pytest.raises(SystemExit, match="fp8infer"):  # the levers' list names them
        speed.split_impl("vitkit+fp8inference")
    assert lever.INFER_LEVERS["fp8infer"] == ("tensorwise", FP8_MIN_PARAMS)
    if not torch.cuda.is_available():
        with pytest.raises(VitkitError, match="device is cpu"):
            speed.lever_model(tiny(), ["fp8infer"], torch.device("cpu"))
    model = tiny()
    converted = copy.deepcopy(model).to(torch.bfloat16)
    layers = quantize_fp8_linears(converted, min_params=0)
    fp8 = GPUModel(converted, torch.device("cpu"), "fp8", "tensorwise", layers)
    torch.manual_seed(0)
    got = lever.agreement_with_bf16(model, fp8, torch.randn(256, 1, 8, 8))
    assert got["images"] == 256 and 0.85 < got["top1_agreement"] <= 1
    assert 0 < got["logits_relative_difference"] < 0.15
