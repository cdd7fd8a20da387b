"""Reading and writing checkpoints, grouped by source.

- ``native/``: vitkit's own format (``safetensors_io``: safetensors + JSON, atomic writes,
  strict loading), distributed (DCP) checkpoints (``dcp_shards``: their layout and reading;
  ``sharded``: saving, loading and consolidating them into one file);
- ``google/``, ``timm/``, ``hf/``: explicit pure converters for Google's ``.npz``, timm (one
  module per timm model file) and Hugging Face (one module per transformers model class), and
  ``hf.hub_cache``: a model id (``ORG/NAME[@REVISION]``) -> its folder in the local cache;
- ``adapt``: position-embedding resampling and head replacement (fine-tuning at another
  resolution or label set); ``posemb_kernels``: which kernel resamples a checkpoint's position
  embeddings, its source's (timm's, a Hugging Face class's, vitkit's recorded one);
- ``formats``: format detection, reading any format (``load_model`` / ``load``);
  ``writing``: writing any format (``write_checkpoint``); ``provenance``: where each loaded
  setting came from; ``description``: what ``vitkit inspect`` prints.

Imports go one way: ``native.dcp_shards`` <- ``native.safetensors_io`` <- ``formats`` (with
the converters, ``adapt`` and ``hf.hub_cache``) <- ``native.sharded``; no module imports one to
its right, not even inside a function.
"""

from vitkit.checkpoints.adapt import adapt, is_zero_head
from vitkit.checkpoints.formats import (
    FORMATS,
    adapt_checkpoint,
    describe,
    detect_format,
    load,
    load_model,
    read_checkpoint,
    write_checkpoint,
)
from vitkit.checkpoints.native.safetensors_io import (
    LATEST,
    Checkpoint,
    atomic_write_text,
    config_diff,
    load_checkpoint,
    load_state_dict_strict,
    resolve_checkpoint,
    save_checkpoint,
)
from vitkit.models.posemb_resample import resample_pos_embed

__all__ = [
    "FORMATS",
    "LATEST",
    "Checkpoint",
    "adapt",
    "adapt_checkpoint",
    "atomic_write_text",
    "config_diff",
    "describe",
    "detect_format",
    "is_zero_head",
    "load",
    "load_checkpoint",
    "load_model",
    "load_state_dict_strict",
    "read_checkpoint",
    "resample_pos_embed",
    "resolve_checkpoint",
    "save_checkpoint",
    "write_checkpoint",
]
