"""The ResNet of the paper's hybrid models (Sec. 3.1, "Hybrid Architecture").

The hybrid feeds the Transformer with the feature map of a ResNet instead of raw pixel patches.
This is the ResNet of the official code (google-research/vision_transformer,
``vit_jax/models_resnet.py``), which is *not* BiT's pre-activation ResNet-v2 but a ResNet v1.5
with two BiT ingredients:

- weight-standardised convolutions: the kernel of every conv is standardised over its fan-in,
  ``(w - mean) / (std + 1e-5)`` (population std, as ``jnp.std``; BiT uses ``sqrt(var + eps)``);
- GroupNorm with 32 groups (flax's epsilon 1e-6) in place of BatchNorm.

timm's copy of these hybrids standardises as ``(w - mean) / sqrt(var + 1e-8)`` and uses
GroupNorm epsilon 1e-5; ``ViTConfig.resnet_eps="timm"`` runs those numerics, so that a timm
hybrid file computes what timm computes (``.npz`` files keep the official ones).

Layout (vit_jax ``VisionTransformer`` with ``resnet`` set): a 7x7 stride-2 root conv of width
``64 * width_factor``, GroupNorm, ReLU, 3x3 stride-2 max-pool, then stages of bottleneck units
(stage ``i`` has bottleneck width ``width * 2**i``, output ``4x`` that, stride 2 in the first unit
of every stage but the first). Convolutions and the pool pad like TensorFlow's ``"SAME"`` (the extra
pixel goes at the bottom/right), which matters for exact parity with the released weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.registry.model_config import ResNetEps, ViTConfig


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "SAME" padding (before, after) for one spatial axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: Tensor, kernel: int, stride: int, value: float = 0.0) -> Tensor:
    top, bottom = _same_padding(x.shape[-2], kernel, stride)
    left, right = _same_padding(x.shape[-1], kernel, stride)
    if top == bottom == left == right == 0:
        return x
    return F.pad(x, (left, right, top, bottom), value=value)


class StdConv2d(nn.Conv2d):
    """A bias-free convolution with a weight-standardised kernel and "SAME" padding."""

    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int = 1, eps: ResNetEps = "vit_jax"
    ) -> None:
        super().__init__(cin, cout, kernel, stride=stride, padding=0, bias=False)
        self.timm_eps = eps == "timm"

    def standardized_weight(self) -> Tensor:
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        if self.timm_eps:  # timm's StdConv2dSame(eps=1e-8)
            var = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
            return (w - mean) / torch.sqrt(var + 1e-8)
        std = w.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (w - mean) / (std + 1e-5)

    def forward(self, x: Tensor) -> Tensor:
        x = pad_same(x, self.kernel_size[0], self.stride[0])
        return F.conv2d(x, self.standardized_weight(), None, self.stride)


def group_norm(channels: int, eps: ResNetEps = "vit_jax") -> nn.GroupNorm:
    groups = 32 if channels % 32 == 0 else _largest_divisor(channels)
    return nn.GroupNorm(groups, channels, 1e-5 if eps == "timm" else 1e-6)


def _largest_divisor(channels: int, at_most: int = 32) -> int:
    return max(g for g in range(1, at_most + 1) if channels % g == 0)


class Bottleneck(nn.Module):
    """vit_jax ``ResidualUnit``: 1x1 → 3x3 (strided) → 1x1, GroupNorm after each conv."""

    conv_proj: StdConv2d | None  # the projection shortcut: both or neither
    gn_proj: nn.GroupNorm | None

    def __init__(self, cin: int, width: int, stride: int, eps: ResNetEps = "vit_jax") -> None:
        super().__init__()
        cout = 4 * width
        self.conv1, self.gn1 = StdConv2d(cin, width, 1, 1, eps), group_norm(width, eps)
        self.conv2, self.gn2 = StdConv2d(width, width, 3, stride, eps), group_norm(width, eps)
        self.conv3, self.gn3 = StdConv2d(width, cout, 1, 1, eps), group_norm(cout, eps)
        if cin != cout or stride != 1:
            self.conv_proj = StdConv2d(cin, cout, 1, stride, eps)
            self.gn_proj = group_norm(cout, eps)
        else:
            self.conv_proj, self.gn_proj = None, None

    def forward(self, x: Tensor) -> Tensor:
        if self.conv_proj is None:
            residual = x
        else:
            assert self.gn_proj is not None  # set together with conv_proj
            residual = self.gn_proj(self.conv_proj(x))
        y = F.relu(self.gn1(self.conv1(x)))
        y = F.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return F.relu(residual + y)


class ResNetStem(nn.Module):
    """Image [B, C, H, W] → feature map [B, patch_in_chans, H / stride, W / stride]."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        width, eps = cfg.resnet_width, cfg.resnet_eps
        self.conv_root = StdConv2d(cfg.in_chans, width, 7, stride=2, eps=eps)
        self.gn_root = group_norm(width, eps)
        stages, cin = [], width
        for i, n in enumerate(cfg.resnet_layers or ()):
            units = []
            for u in range(n):
                stride = 2 if (i > 0 and u == 0) else 1
                units.append(Bottleneck(cin, width * 2**i, stride, eps))
                cin = 4 * width * 2**i
            stages.append(nn.Sequential(*units))
        self.stages = nn.Sequential(*stages)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.gn_root(self.conv_root(x)))
        x = F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), kernel_size=3, stride=2)
        return self.stages(x)


@torch.no_grad()
def init_resnet(stem: ResNetStem) -> None:
    """vit_jax's initialisation: LeCun-normal (flax default) kernels, unit GroupNorm scales
    except the last of each residual branch, which starts at zero."""
    for m in stem.modules():
        if isinstance(m, StdConv2d):
            fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
            std = (1.0 / fan_in) ** 0.5 / 0.87962566103423978
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in stem.modules():
        if isinstance(m, Bottleneck):
            nn.init.zeros_(m.gn3.weight)
