"""Hugging Face's checkpoints, one module per transformers model: ``vit_model`` (ViT),
``vit_family`` (DeiT, Dinov2, ViTMAE, CLIP vision), ``dinov3``, ``siglip``, ``siglip2``,
``beit``; ``processor`` (preprocessor_config.json) and ``hub_cache`` (model ids from the
local cache)."""
