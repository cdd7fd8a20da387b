"""fp32 Linear layers on oneDNN for CPU inference: PyTorch at ONNX Runtime's fp32 speed.

Why: PyTorch's CPU wheels multiply fp32 matrices with Intel MKL (``torch.__config__.show()``:
``BLAS_INFO=mkl``). On an AMD EPYC with AVX-512 MKL reached 208 GFLOP/s on a 2048^3 matmul and
183 on a B/16 MLP Linear, while oneDNN, PyTorch's other CPU library (the one behind its bf16
matmuls), ran the same Linear at 356: ONNX Runtime's and OpenVINO's fp32 engines were twice as
fast as PyTorch for this reason (docs/experiments.md, "CPU inference").
oneDNN's result is fp32 like MKL's, summed in another order (3e-6 on outputs of magnitude 3,
measured; the size of MKL's own differences between batch sizes).

:func:`onednn_linears` makes every ``nn.Linear`` of a model an :class:`OneDNNLinear` (the same
parameters, the same state dict, still an ``nn.Linear``), which calls oneDNN exactly where it is
plain fp32 inference on the CPU: no autograd, no autocast, not while compiling or exporting;
and every MLP an :class:`OneDNNMlp`, whose fc1 and GELU are one oneDNN call there. Anywhere else
they are ``nn.Linear`` and ``Mlp`` themselves. ``vitkit eval`` and ``vitkit predict`` use it for the
torch engine; ``VITKIT_ONEDNN=0`` turns it off (then PyTorch's default BLAS runs).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models.block_parts import Mlp

ENV = "VITKIT_ONEDNN"
# fp32 always; bf16 where the CPU has it natively (a model with bf16 weights, vitkit.engines.bf16)
ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's linear (its CPU build with MKL-DNN), and it is not
    turned off by ``VITKIT_ONEDNN=0``."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(
            torch.ops.mkldnn, "_linear_pointwise"
        )
    except (AttributeError, RuntimeError):
        return False


def _plain_inference(x: Tensor, w: Tensor) -> bool:
    """Whether ``x @ w.T`` is fp32 (or all-bf16) CPU inference that oneDNN may compute (nothing
    to record for autograd, no autocast, not traced by the compiler, an exporter or
    TorchScript)."""
    return not (
        x.dtype not in ONEDNN_DTYPES
        or w.dtype != x.dtype
        or x.device.type != "cpu"
        or w.device.type != "cpu"
        or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        or torch.is_autocast_enabled("cpu")
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or x.dim() < 2
    )


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` whose fp32 CPU inference runs on oneDNN (see the module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        if not _plain_inference(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.weight, self.bias, "none", [], ""
        )

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script`` compiles in its place: the plain ``nn.Linear`` with the
        same parameters (TorchScript cannot read the dispatch above; the module itself stays)."""
        return _plain_copy(self, nn.Linear)


class OneDNNMlp(Mlp):
    """Eq. 3's MLP with ``GELU(fc1(x))`` as one oneDNN call (the GELU fused into the matmul's
    output, erf or tanh as the model's ``gelu`` says) in fp32 CPU inference: one pass less
    over the widest activation, 12 % of Ti/16's inference time measured. Any other case (a
    SwiGLU, QuickGELU or BEiT-3's sub-norm, training) is
    :class:`~vitkit.models.block_parts.Mlp` itself."""

    def forward(self, x: Tensor) -> Tensor:
        fc1 = self.fc1
        if (
            self.training
            or self.swiglu
            or type(self.act) is not nn.GELU
            or not isinstance(self.norm, nn.Identity)
            or not _plain_inference(x, fc1.weight)
        ):
            return super().forward(x)
        algorithm = self.act.approximate  # "none" (erf, the paper's) or "tanh"
        h = torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), fc1.weight, fc1.bias, "gelu", [], algorithm
        )
        return self.fc2(h)  # (dropout is the identity in eval)

    def __prepare_scriptable__(self) -> nn.Module:
        """``torch.jit.script``'s copy: the plain :class:`~vitkit.models.block_parts.Mlp`
        with the same parameters and layers (its Linear layers plain in turn)."""
        return _plain_copy(self, Mlp)


def _plain_copy(module: nn.Module, cls: type[nn.Module]) -> nn.Module:
    """A shallow copy of ``module`` as ``cls`` sharing its parameters and buffers, with a
    submodule table of its own (TorchScript's preparation replaces entries of that table, and
    must not replace the eager model's)."""
    plain = copy.copy(module)
    plain.__class__ = cls
    plain.__dict__["_modules"] = dict(module._modules)
    return plain


def onednn_linears(model: nn.Module) -> int:
    """Make every ``nn.Linear`` of ``model`` (in place) an :class:`OneDNNLinear` and every
    ``Mlp`` an :class:`OneDNNMlp`: the same modules with the same parameters, computing fp32
    CPU inference on oneDNN. Returns how many Linear layers it changed (0 where oneDNN is not
    available)."""
    if not onednn_available():
        return 0
    n = 0
    for m in model.modules():
        if type(m) is nn.Linear:  # exactly nn.Linear: a subclass has its own forward
            m.__class__ = OneDNNLinear
            n += 1
        elif type(m) is Mlp:
            m.__class__ = OneDNNMlp
    return n


__all__ = ["ENV", "OneDNNLinear", "OneDNNMlp", "onednn_available", "onednn_linears"]
