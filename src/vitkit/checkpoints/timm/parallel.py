"""timm's parallel blocks and differential attention (:mod:`vitkit.models.parallel_blocks`).

vitkit's parallel blocks have timm's parameter names, so their keys carry over unchanged in
both directions; what this module adds is reading the architecture. A block with
``in_proj`` is ``ParallelScalingBlock`` (``parallel_scaling``; ``out_proj`` and ``lambda_*``
on the block: ``DiffParallelScalingBlock``), one with ``attns.{i}`` / ``ffns.{i}`` is
``ParallelThingsBlock`` (``parallel`` = their count), and ``attn.lambda_q1`` is
``DiffAttention`` (``diff_attn``). :func:`plain_block_view` shows such a state dict through the
keys of the paper's block (the same tensors, sliced), so that
:func:`vitkit.checkpoints.timm.vision_transformer.timm_config` reads widths, biases, q/k norm
and layer scale in one place, and returns the switches to add.

Writing: timm's ``model_args`` cannot name a block class, so a timm folder names an
architecture registered with that block (:func:`parallel_architecture`); its ``model_args``
override every other setting. timm builds ``ParallelThingsBlock`` with two branches only.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig

_B0 = "blocks.0."


def plain_block_view(
    sd: dict[str, Tensor], source: str
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``sd`` with block 0 also under the paper's block's keys (for reading shapes), and the
    parallel-block switches it shows (empty for the paper's block)."""
    if _B0 + "attn.lambda_a" in sd or _B0 + "lambda_a" in sd:
        raise VitkitError(
            f"{source}: differential attention with timm's dual_lambda (lambda_a, lambda_b); "
            "vitkit reads the paper's lambda_q1/k1/q2/k2"
        )
    if _B0 + "in_proj.weight" in sd:
        return _scaling_view(sd, source)
    if _B0 + "attns.0.attn.qkv.weight" in sd:
        n = 1 + max(int(k.split(".")[3]) for k in sd if k.startswith(_B0 + "attns."))
        view = dict(sd)
        for k, v in sd.items():
            for part, which in (("attns.0.", "1"), ("ffns.0.", "2")):
                if k.startswith(_B0 + part):
                    view[_B0 + _plain_key(k[len(_B0 + part) :], which)] = v
        fields = {"parallel": n, "diff_attn": _B0 + "attn.lambda_q1" in view}
        return view, fields
    return sd, {"diff_attn": True} if _B0 + "attn.lambda_q1" in sd else {}


def _plain_key(key: str, n: str) -> str:
    """A branch's key as the paper's block's: its ``norm`` / ``ls`` are ``norm{n}`` / ``ls{n}``
    (1: attention, 2: MLP)."""
    head, _, rest = key.partition(".")
    return f"{head}{n}.{rest}" if head in ("norm", "ls") else key


def _scaling_view(sd: dict[str, Tensor], source: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    w = sd[_B0 + "in_proj.weight"]
    d = w.shape[1]
    m = w.shape[0] - 3 * d
    diff = _B0 + "lambda_q1" in sd
    out = _B0 + ("out_proj.weight" if diff else "mlp_out_proj.weight")
    if m <= 0 or out not in sd:
        raise VitkitError(
            f"{source}: a parallel block (in_proj) without {out[len(_B0) :]}; vitkit reads "
            "timm's ParallelScalingBlock and DiffParallelScalingBlock"
        )
    view = dict(sd)
    view[_B0 + "attn.qkv.weight"] = w[m:]
    view[_B0 + "mlp.fc1.weight"] = w[:m]
    view[_B0 + "mlp.fc2.weight"] = sd[out][:, -m:]
    if _B0 + "in_proj.bias" in sd:
        view[_B0 + "attn.qkv.bias"] = sd[_B0 + "in_proj.bias"][m:]
    named = {"attn.q_norm.weight": "q_norm.weight", "ls1.gamma": "ls.gamma"}
    named.update({"norm1.weight": "in_norm.weight", "norm1.bias": "in_norm.bias"})
    for ours, theirs in named.items():
        if _B0 + theirs in sd:
            view[_B0 + ours] = sd[_B0 + theirs]
    fields: dict[str, Any] = {"parallel_scaling": True, "diff_attn": diff}
    if _B0 + "in_norm.bias" not in sd:  # timm's vit_*_xp_* (norm_layer=RmsNorm everywhere)
        fields["norm"] = "rmsnorm"
    return view, fields


def parallel_architecture(cfg: ViTConfig) -> str | None:
    """A registered timm name whose block class is ``cfg``'s parallel block (None: the
    paper's block). timm drops a ``None`` argument, so a name with layer scale keeps it:
    a model without it needs a name without it."""
    if not (cfg.parallel_scaling or cfg.parallel > 1):
        return None
    if cfg.mlp != "mlp":
        raise VitkitError("timm's parallel blocks have a GELU MLP; this model has mlp='swiglu'")
    if cfg.parallel > 2:
        raise VitkitError(
            f"timm builds ParallelThingsBlock with 2 branches; this model has {cfg.parallel}"
        )
    scale = cfg.layer_scale_init is not None
    if cfg.parallel_scaling and not cfg.diff_attn and not scale:
        return "vit_base_patch16_xp_224"  # with norm_layer="layernorm" (parallel_model_args)
    if not scale:
        raise VitkitError(
            "timm registers ParallelThingsBlock and DiffParallelScalingBlock only with layer "
            "scale; this model has none (write the state dict alone: a .safetensors file)"
        )
    if cfg.parallel_scaling:
        return f"vit_{'dp' if cfg.diff_attn else 'p'}wee_patch16_reg1_gap_256"
    return "vit_small_patch16_18x2_224"


def parallel_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """The ``timm.create_model`` arguments of the attention (differential or not) and, for
    the ``vit_*_xp_*`` name, of the LayerNorm in place of its RMSNorm."""
    args: dict[str, Any] = {}
    if cfg.diff_attn and not cfg.parallel_scaling:
        args["attn_layer"] = "diff"
    if cfg.parallel_scaling and not cfg.diff_attn and cfg.layer_scale_init is None:
        args["norm_layer"] = cfg.norm  # the xp entries' own is RMSNorm
    return args
