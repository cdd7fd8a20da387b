"""Google's checkpoints: the ``.npz`` files of vit_jax and big_vision (``npz``)."""
