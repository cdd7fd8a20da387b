"""BiT's ResNet-v2: the paper's convolutional baseline ("Big Transfer", Kolesnikov et al., 2020).

The paper compares ViT against BiT ResNets (Sec. 4.1, Table 2, Figures 3-4). BiT is a ResNet-v2
(pre-activation, He et al., 2016) with two changes that make it transfer well at any batch size:

- weight-standardised convolutions: every kernel is standardised over its fan-in,
  ``(w - mean) / sqrt(var + 1e-10)`` (as BiT's ``bit_pytorch/models.py``);
- GroupNorm (32 groups, PyTorch's epsilon 1e-5 as in ``bit_pytorch``) instead of BatchNorm.

Layout, as ``bit_pytorch``: a 7x7 stride-2 root conv, zero padding of 1 and a 3x3 stride-2
max-pool (no norm: the units normalise their own input); stages of pre-activation bottleneck
units (GN → ReLU → 1x1 conv → GN → ReLU → 3x3 conv (stride 2 in the first unit of every stage
but the first, "ResNet v1.5" style) → GN → ReLU → 1x1 conv, plus the shortcut, a 1x1 conv of the
pre-activated input where the shape changes); a final GN → ReLU, global average pooling and a
zero-initialised linear head. Stage ``i`` has bottleneck width ``64 * width_factor * 2**i`` and
output ``4x`` that; any number of stages and units per stage (``ResNetConfig.layers``).

Where we deviate from BiT, and why:

- The head is a ``Linear`` (BiT: a 1x1 conv on the pooled map — the same function), so that
  vitkit's head replacement, few-shot probe and converters treat it like the ViT's ``head``.
- ``root="small"`` (not in BiT) replaces the root by a 3x3 stride-1 conv without pooling, for
  28-32 px images where a 4x downsampling root throws most of the image away.
- Initialisation: He-normal (fan-out) convolutions, unit GroupNorm scales, zero head. BiT's code
  trains from PyTorch's default init; the released models were trained in TF.

This is *not* the ResNet inside the paper's hybrids: vit_jax's hybrid uses a post-activation
ResNet v1.5 with the same two ingredients (see :mod:`vitkit.models.hybrid_stem`), and so does timm's
``vit_*_r*`` (``ResNetV2(preact=False)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.models.scriptable import refuse_script
from vitkit.registry.model_config import ResNetConfig


class StdConv2d(nn.Conv2d):
    """A bias-free convolution with a weight-standardised kernel (BiT's, symmetric padding)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0):
        super().__init__(cin, cout, kernel, stride=stride, padding=padding, bias=False)

    def standardized_weight(self) -> Tensor:
        w = self.weight
        var, mean = torch.var_mean(w, dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (w - mean) / torch.sqrt(var + 1e-10)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.standardized_weight(), None, self.stride, self.padding)


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with 32 groups, or the largest divisor below that for narrow layers."""
    groups = max(g for g in range(1, 33) if channels % g == 0)
    return nn.GroupNorm(groups, channels, eps=1e-5)


class PreActBottleneck(nn.Module):
    """BiT's unit: x + conv3(relu(gn3(conv2(relu(gn2(conv1(relu(gn1(x))))))))) with a
    projection shortcut from the pre-activated input where the shape changes."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.gn1, self.conv1 = group_norm(cin), StdConv2d(cin, width, 1)
        self.gn2, self.conv2 = group_norm(width), StdConv2d(width, width, 3, stride, padding=1)
        self.gn3, self.conv3 = group_norm(width), StdConv2d(width, cout, 1)
        self.downsample = StdConv2d(cin, cout, 1, stride) if (cin != cout or stride != 1) else None

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.gn1(x))
        residual = x if self.downsample is None else self.downsample(y)
        y = self.conv1(y)
        y = self.conv2(F.relu(self.gn2(y)))
        y = self.conv3(F.relu(self.gn3(y)))
        return y + residual


class ResNetV2(nn.Module):
    """BiT ResNet-v2: normalised pixels [B, C, H, W] → logits [B, num_classes]."""

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        if cfg.root == "bit":
            self.root = StdConv2d(cfg.in_chans, w, 7, stride=2, padding=3)
        else:
            self.root = StdConv2d(cfg.in_chans, w, 3, stride=1, padding=1)
        stages, cin = [], w
        for i, n in enumerate(cfg.layers):
            units = []
            for u in range(n):
                units.append(PreActBottleneck(cin, w * 2**i, 2 if (i > 0 and u == 0) else 1))
                cin = 4 * w * 2**i
            stages.append(nn.Sequential(*units))
        self.stages = nn.Sequential(*stages)
        self.norm = group_norm(cfg.feature_dim)
        self.head = nn.Linear(cfg.feature_dim, cfg.num_classes) if cfg.num_classes else None
        init_weights(self)

    def forward_features(self, x: Tensor) -> Tensor:
        """Pixels → the final pre-activated feature map [B, feature_dim, H / s, W / s]."""
        c = self.cfg.in_chans
        if x.ndim != 4 or x.shape[1] != c:  # any size runs: convolutions, then average pooling
            raise VitkitError(f"expected images [B, {c}, H, W], got {tuple(x.shape)}")
        x = self.root(x)
        if self.cfg.root == "bit":
            x = F.max_pool2d(F.pad(x, (1, 1, 1, 1)), kernel_size=3, stride=2)
        return F.relu(self.norm(self.stages(x)))

    def forward_head(self, features: Tensor, pre_logits: bool = False) -> Tensor:
        """Feature map → logits; with ``pre_logits=True`` the pooled features [B, feature_dim]."""
        x = features.mean(dim=(2, 3))
        if pre_logits or self.head is None:
            return x
        return self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def __prepare_scriptable__(self) -> nn.Module:
        refuse_script("BiT's ResNet (vitkit scripts its Vision Transformers)")


@torch.no_grad()
def init_weights(model: ResNetV2) -> None:
    for m in model.modules():
        if isinstance(m, StdConv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if model.head is not None:
        nn.init.zeros_(model.head.weight)
        nn.init.zeros_(model.head.bias)
