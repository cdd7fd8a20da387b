"""Reading and writing checkpoints. Only vitkit's own format lives here for now; converters for
other formats (Google .npz, timm, Hugging Face) are explicit pure functions beside it."""

from vitkit.checkpoints.io import (
    LATEST,
    Checkpoint,
    atomic_write_text,
    config_diff,
    load_checkpoint,
    load_model,
    load_state_dict_strict,
    resolve_checkpoint,
    save_checkpoint,
)

__all__ = [
    "LATEST",
    "Checkpoint",
    "atomic_write_text",
    "config_diff",
    "load_checkpoint",
    "load_model",
    "load_state_dict_strict",
    "resolve_checkpoint",
    "save_checkpoint",
]
