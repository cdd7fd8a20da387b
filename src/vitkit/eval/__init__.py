"""Evaluators. Each is built with its data and answers ``run(model) -> dict[str, float]``."""

from vitkit.eval.classification import (
    ClassificationEvaluator,
    ClassificationResult,
    evaluate_classification,
    format_result,
    topk_correct,
)

__all__ = [
    "ClassificationEvaluator",
    "ClassificationResult",
    "evaluate_classification",
    "format_result",
    "topk_correct",
]
