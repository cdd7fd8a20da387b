"""The tokens that are not patches, in the report: how much attention the class token, DeiT's
distillation token and the registers take, apart from the patch maps (the numbers come from
:func:`vitkit.analysis.attention.prefix_attention_share` and ``prefix_rollout_share``).

Registers (Darcet et al., "Vision Transformers Need Registers", 2024) are extra tokens that
hold no image content; their paper shows that large ViTs without registers make some background
patches absorb global information and much of the attention, and that with registers that
attention moves to the registers: the share the registers take is what shows it.
"""

from __future__ import annotations

from torch import Tensor

from vitkit.analysis.attention import prefix_groups
from vitkit.analysis.html_report import Section, Table
from vitkit.registry.model_config import ViTConfig


def prefix_table(shares: dict[str, Tensor], rollout: dict[str, Tensor] | None = None) -> Table:
    """Per layer, the mean share of the patch queries' attention on each token group (from
    :func:`prefix_attention_share`, images averaged); a last row with the rollout's shares."""
    names = list(shares)
    means = {k: v.mean(dim=0) for k, v in shares.items()}  # [L]
    layers = next(iter(means.values())).shape[0]
    rows: list[list[object]] = [
        [str(i + 1), *(float(means[k][i]) for k in names)] for i in range(layers)
    ]
    if rollout is not None:
        rows.append(["rollout (output)", *(float(rollout[k].mean()) for k in names)])
    return Table(["layer", *names], rows)


def prefix_numbers(
    shares: dict[str, Tensor], rollout: dict[str, Tensor]
) -> dict[str, dict[str, list[float] | float]]:
    """``analysis.json``'s ``"prefix_tokens"``: per group, the per-layer attention share
    (images averaged) and the rollout share."""
    return {
        name: {
            "attention_share_per_layer": shares[name].mean(dim=0).tolist(),
            "rollout_share": float(rollout[name].mean()),
        }
        for name in shares
    }


def prefix_section(
    cfg: ViTConfig, shares: dict[str, Tensor], rollout: dict[str, Tensor], description: str
) -> Section:
    """The report's section on the prefix tokens (class, distillation, registers)."""
    groups = ", ".join(f"{k} ({s.stop - s.start})" for k, s in prefix_groups(cfg).items())
    return Section(
        "Prefix tokens",
        [
            f"This model has {cfg.num_prefix_tokens} token(s) before the patches: {groups}. The "
            "attention maps and the rollout above are over the patches only; here is how much "
            "attention the other tokens take: per layer, the share of the patch queries' "
            "attention (heads and queries averaged) on each group, and in the last row the "
            "share of the pooled output's rollout that ends on it, for " + description + ".",
            prefix_table(shares, rollout),
        ],
    )
