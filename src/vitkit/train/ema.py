"""Polyak averaging of the weights (the paper fine-tunes "with Polyak & Juditsky (1992)
averaging with a factor of 0.9999"): an exponential moving average kept beside the model."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


class WeightAverage:
    """``avg = decay * avg + (1 - decay) * weights`` after every optimizer step (floating-point
    parameters and buffers; the average is kept in float32)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must lie in (0, 1), got {decay}")
        self.decay = decay
        self.shadow: dict[str, Tensor] = {
            k: v.detach().float().clone() for k, v in model.state_dict().items()
        }

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if v.is_floating_point():
                s.mul_(self.decay).add_(v.detach().float(), alpha=1.0 - self.decay)
            else:
                s.copy_(v)

    def averaged_model(self, model: nn.Module) -> nn.Module:
        """A copy of ``model`` holding the averaged weights."""
        out = copy.deepcopy(model)
        out.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in self.shadow.items()})
        return out

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for k, v in state.items():
            self.shadow[k].copy_(v)
