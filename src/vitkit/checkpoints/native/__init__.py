"""vitkit's own checkpoint format: safetensors + JSON written atomically
(``safetensors_io``), and distributed (DCP) checkpoints: their shards' layout
(``dcp_shards``), saving, loading and consolidating them (``sharded``)."""
