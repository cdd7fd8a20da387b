"""The models and their parts: the Vision Transformer (``vit``, Eq. 1-4 of the paper), the
hybrid's ResNet stem (``hybrid_stem``), BiT's ResNet classifier (``bit``), and the parts the
ViT family adds (``rope``, ``relpos``, ``parallel_blocks``, ``naflex_packing``,
``posemb_resample``, ``block_parts``, ``map_head``, ``sdpa_backend``, ``weight_init``), and
the interfaces other libraries' code expects of it: timm's feature API (``features``) and model
attributes (``timm_api``), transformers' backbone classes (``hf_backbone``) and call
(``hf_model``), and ``torch.jit.script`` (``scriptable``)."""
