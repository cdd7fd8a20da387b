"""Reading and writing checkpoints.

- :mod:`.io`: vitkit's own format (safetensors + JSON, atomic writes, strict loading);
- :mod:`.npz`, :mod:`.timm`, :mod:`.hf`, :mod:`.hf_family`: explicit pure converters for
  Google's ``.npz``, timm and Hugging Face weights (ViT; DeiT, Dinov2, ViTMAE, CLIP vision);
- :mod:`.adapt`: position-embedding resampling and head replacement (fine-tuning at another
  resolution or label set);
- :mod:`.formats`: format detection, reading any format (``load_model`` / ``load``) and writing
  any format (``write_checkpoint``);
- :mod:`.hub_cache`: a Hugging Face model id (``ORG/NAME[@REVISION]``) -> its folder in the
  local Hugging Face cache, offline (``read_checkpoint`` takes ids through it);
- :mod:`.distributed`: sharded checkpoints written by every rank with
  ``torch.distributed.checkpoint`` (DCP), and consolidating any checkpoint into one file;
- :mod:`.dcp_shards`: the DCP shards' layout and reading them, through which
  ``load_checkpoint`` reads a distributed checkpoint's weights too.

Imports go one way: ``dcp_shards`` <- ``io`` <- ``formats`` (with the converters, ``adapt``
and ``hub_cache``) <- ``distributed``; no module imports one to its right, not even inside a
function.
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
from vitkit.checkpoints.io import (
    LATEST,
    Checkpoint,
    atomic_write_text,
    config_diff,
    load_checkpoint,
    load_state_dict_strict,
    resolve_checkpoint,
    save_checkpoint,
)
from vitkit.posemb import resample_pos_embed

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
