"""The registry of names and sizes: model configs and the variant tables (``model_config``),
the ViT family's named models (``families``), preprocessing (``preprocess_config``), exact
parameter and FLOP counts (``counts``), the checks of every config field (``config_checks``)
and ``KEY=VALUE`` overrides (``overrides``)."""
