"""Principal components of the patch-embedding filters (the paper's Figure 7, left).

The patch embedding E is D filters of shape [C, P_h, P_w]. Their principal components (the
right singular vectors of the mean-centred D x (C P_h P_w) matrix) show the basis the model
uses to describe a patch; the paper shows the top 28 for ViT-L/32, which "resemble plausible
basis functions for a low-dimensional representation of the fine structure within each patch".

A principal component's sign is arbitrary; it is fixed so that the entry of largest magnitude
is positive (scikit-learn's ``svd_flip`` convention), which makes the figure reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer


@dataclass
class FilterComponents:
    """The principal components of a model's patch-embedding filters.

    Attributes:
        components: [k, C, P_h, P_w] unit-norm principal directions, strongest first.
        explained_variance_ratio: [k], each component's share of the filters' total variance.
    """

    components: Tensor
    explained_variance_ratio: Tensor


def embedding_filter_pca(model: VisionTransformer, k: int = 28) -> FilterComponents:
    """The top ``k`` principal components of ``model``'s patch-embedding filters (fewer if the
    filters span fewer dimensions)."""
    if k < 1:
        raise VitkitError(f"the number of principal components must be at least 1, got {k}")
    if model.cfg.is_hybrid:
        raise VitkitError(
            f"{model.cfg.short_name} is a hybrid: its patch embedding filters ResNet features, "
            "not pixels, so they have no picture"
        )
    weight = model.patch_embed.proj.weight.detach().cpu().double()  # [D, C, P_h, P_w]
    d, shape = weight.shape[0], tuple(weight.shape[1:])
    if d < 2:
        raise VitkitError(f"{d} embedding filter(s): principal components need at least 2")
    flat = weight.reshape(d, -1)
    centred = flat - flat.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    variance = s**2
    k = min(k, int((variance > variance.sum() * 1e-12).sum()))
    if k == 0:
        raise VitkitError("the patch-embedding filters are all the same: no principal components")
    comps = vh[:k]
    flip = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))
    comps = comps * torch.where(flip == 0, torch.ones_like(flip), flip)
    ratio = variance[:k] / variance.sum()
    return FilterComponents(comps.reshape(k, *shape).float(), ratio.float())
