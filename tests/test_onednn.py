"""fp32 Linear layers on oneDNN (vitkit.engines.onednn): the same numbers as nn.Linear, oneDNN
exactly in fp32 CPU inference, nn.Linear itself under autograd, autocast and export."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import vitkit
from vitkit.engines.onednn import ENV, OneDNNLinear, OneDNNMlp, onednn_available, onednn_linears

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")


def tiny(bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    m = vitkit.create_model(
        "Ti/4", image_size=16, num_classes=5, width=32, depth=2, num_heads=2, mlp_dim=64
    )
    if not bias:
        m.head.bias = None
    return m.eval()


def onednn_calls(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if "_linear_pointwise" in e.key)


def test_same_numbers_same_state_dict_and_onednn_in_inference():
    ref, m = tiny(), tiny()
    linears = sum(type(x) is torch.nn.Linear for x in m.modules())
    keys = list(m.state_dict())
    assert onednn_linears(m) == linears > 0
    assert all(type(x) is not torch.nn.Linear for x in m.modules())
    assert list(m.state_dict()) == keys and isinstance(m.head, torch.nn.Linear)
    x = torch.randn(3, 3, 16, 16)
    with torch.inference_mode():
        want, got = ref(x), m(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert onednn_calls(lambda: m(x)) == linears  # every Linear went through oneDNN
        assert onednn_calls(lambda: ref(x)) == 0
    with torch.no_grad():
        assert onednn_calls(lambda: m(x)) == linears


def test_a_head_without_bias_and_a_non_contiguous_input():
    lin = torch.nn.Linear(8, 3, bias=False)
    ref = torch.nn.Linear(8, 3, bias=False)
    ref.load_state_dict(lin.state_dict())
    onednn_linears(lin)
    x = torch.randn(4, 5, 8)[:, 0]  # a class token: a strided view
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)


def test_autograd_and_autocast_run_plain_linear():
    ref, m = tiny(), tiny()
    onednn_linears(m)
    x = torch.randn(2, 3, 16, 16)
    out = m.train()(x)
    out.sum().backward()
    ref.train()(x).sum().backward()
    for (name, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    assert onednn_calls(lambda: m(x)) == 0  # gradients wanted: nn.Linear's own path
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
        got, want = m.eval()(x), ref.eval()(x)
        assert got.dtype == want.dtype == torch.bfloat16  # autocast still casts
        assert torch.equal(got, want)
        assert onednn_calls(lambda: m(x)) == 0


def test_export_traces_plain_linear():
    m = tiny()
    onednn_linears(m)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ep = torch.export.export(m, (x,), strict=False)
    targets = [str(n.target) for n in ep.graph.nodes]
    assert not [t for t in targets if "mkldnn" in t]
    assert any("linear" in t for t in targets)


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    m = tiny()
    assert not onednn_available() and onednn_linears(m) == 0
    assert not any(isinstance(x, OneDNNLinear) for x in m.modules())


def test_eval_and_predict_run_the_torch_engine_on_onednn(tmp_path):
    import argparse

    from vitkit.checkpoints import save_checkpoint
    from vitkit.cli.engines import load_for_inference

    save_checkpoint(tmp_path / "ck", tiny())
    args = argparse.Namespace(engine=None, fast=False, threads=None)
    model, _, line = load_for_inference(args, str(tmp_path / "ck"))
    assert any(isinstance(x, OneDNNLinear) for x in model.modules())
    assert line == "engine: torch, fp32 (default; Linear layers on oneDNN)"


@pytest.mark.parametrize("gelu", ["none", "tanh"])
def test_the_mlp_gelu_is_fused_into_fc1(gelu):
    torch.manual_seed(0)
    kw = dict(image_size=16, num_classes=5, width=32, depth=2, num_heads=2, mlp_dim=64)
    ref = vitkit.create_model("Ti/4", **kw, gelu=gelu).eval()
    m = vitkit.create_model("Ti/4", **kw, gelu=gelu).eval()
    m.load_state_dict(ref.state_dict())
    onednn_linears(m)
    assert all(isinstance(b.mlp, OneDNNMlp) for b in m.blocks)
    x = torch.randn(3, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m(x)
        ops = {e.key for e in prof.key_averages()}
        assert "aten::gelu" not in ops and "mkldnn::_linear_pointwise" in ops
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ref(x)
        assert "aten::gelu" in {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("mlp", [{"mlp": "swiglu"}, {"gelu": "quick"}])
def test_other_mlps_keep_their_own_forward(mlp):
    torch.manual_seed(0)
    kw = dict(image_size=16, num_classes=5, width=32, depth=1, num_heads=2, mlp_dim=64)
    ref = vitkit.create_model("Ti/4", **kw, **mlp).eval()
    m = vitkit.create_model("Ti/4", **kw, **mlp).eval()
    m.load_state_dict(ref.state_dict())
    onednn_linears(m)
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)
