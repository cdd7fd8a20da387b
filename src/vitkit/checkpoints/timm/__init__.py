"""timm's checkpoints, one module per timm model file: ``vision_transformer`` (and bare
state dicts: ``bare``), ``eva`` (and ``eva_bare``), ``naflexvit``, ``beit_relpos`` (beit.py,
vision_transformer_relpos.py), ``parallel`` (parallel blocks, differential attention) and
``switches``; timm's names (``names``) and a timm folder (``hub_folder``)."""
