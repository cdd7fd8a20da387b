"""Activation checkpointing: keep only each encoder block's input during the forward pass and
recompute the block's activations during the backward pass (``torch.utils.checkpoint``).

Memory for activations drops from every block's intermediates (attention maps, MLP hidden
states) to one [B, T, D] tensor per block, for about one extra forward pass of compute. The
result is the same: the recomputation replays the random state, so dropout masks match.
The module tree, parameter names and state dict are unchanged (the block's ``forward`` is
replaced on the instance), so checkpoints and FSDP wrapping do not see it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


class _Checkpointed:
    """A block's forward run under ``torch.utils.checkpoint`` (picklable, unlike a lambda)."""

    def __init__(self, forward) -> None:
        self.forward = forward

    def __call__(self, x: Tensor) -> Tensor:
        if not torch.is_grad_enabled():  # evaluation: nothing to save memory for
            return self.forward(x)
        return checkpoint(self.forward, x, use_reentrant=False)


def apply_activation_checkpointing(blocks: Iterable[nn.Module]) -> int:
    """Checkpoint every module in `blocks` (e.g. ``model.blocks``); returns how many."""
    n = 0
    for block in blocks:
        if isinstance(block.forward, _Checkpointed):
            continue
        block.forward = _Checkpointed(block.forward)
        n += 1
    return n
