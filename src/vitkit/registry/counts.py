"""Exact parameter and FLOP counts of a model config, computed from its shapes.

:func:`count_params` equals ``sum(p.numel())`` of the built model and the reference
implementations' counts (timm's, BiT's); :func:`count_flops` counts the forward pass's matmuls and
convolutions analytically, which hook-based counters miss inside the fused attention kernel.
"""

from __future__ import annotations

from vitkit.registry.model_config import ModelConfig, ResNetConfig, ViTConfig


def count_params(cfg: ModelConfig) -> int:
    """Analytic parameter count (equals ``sum(p.numel())`` of the built model)."""
    if isinstance(cfg, ResNetConfig):
        return _bit_params(cfg)
    d, m = cfg.width, cfg.mlp_dim
    ph, pw = cfg.patch_size
    n = cfg.patch_in_chans * ph * pw * d + (d if cfg.patch_bias else 0)  # patch embedding
    n += _resnet_params(cfg)
    n += cfg.num_prefix_tokens * d  # class token, registers
    if cfg.abs_pos_embed:  # position embeddings (none with rotary ones or a relative bias)
        n += (cfg.num_patches + cfg.num_pos_prefix) * d
    if cfg.rope == "mixed":  # RoPE-ViT mixed's learned frequencies [2, depth, heads, hd / 2]
        n += 2 * cfg.depth * cfg.num_heads * (d // cfg.num_heads // 2)
    qkv_bias = (3 if cfg.k_bias else 2) * d if cfg.qkv_bias else 0  # EVA, BEiT: q and v only
    n += _rel_pos_params(cfg)
    layer_scale = (1 + cfg.layer_scale_mlp) * d if cfg.layer_scale_init is not None else 0
    qk_norm = 4 * (d // cfg.num_heads) if cfg.qk_norm else 0
    fc2_in = m // 2 if cfg.mlp == "swiglu" else m
    block = (
        4 * d
        + 3 * d * d
        + qkv_bias
        + d * d
        + d
        + d * m
        + m
        + fc2_in * d
        + d
        + layer_scale
        + qk_norm
    )
    n += cfg.depth * (block + _parallel_params(cfg, block))
    for kv in cfg.kv_heads or ():  # grouped-query attention: smaller key / value projections
        n -= 2 * (d - kv * (d // cfg.num_heads)) * (d + int(cfg.qkv_bias))
    n += 2 * d if cfg.final_norm else 0  # final norm (or fc_norm after pooling)
    if cfg.pool == "map":  # probe, q, kv, out projection, LayerNorm, MLP
        pm = cfg.map_mlp_dim or m
        n += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (2 * d * pm + pm + d)
    n += 2 * d if cfg.norm_pre else 0
    n += _later_switch_params(cfg)
    if cfg.representation_size:
        n += d * cfg.representation_size + cfg.representation_size
    if cfg.num_classes:
        heads = 2 if cfg.dist_token else 1
        n += heads * (cfg.feature_dim * cfg.num_classes + cfg.num_classes)
    return n


def _rel_pos_params(cfg: ViTConfig) -> int:
    """The relative position bias (vitkit.models.relpos): a table of offsets x heads, or the MLP of
    log offsets; once (shared) or per block."""
    if cfg.rel_pos == "none":
        return 0
    (h, w), heads, hidden = cfg.grid_size, cfg.num_heads, cfg.rel_pos_dim
    if cfg.rel_pos == "bias":
        one = ((2 * h - 1) * (2 * w - 1) + 3 * cfg.has_class_token) * heads
    else:  # fc1 (2 -> hidden), fc2 (hidden -> heads; no bias in Swin v2's mode)
        one = 3 * hidden + hidden * heads + (heads if cfg.rel_pos == "mlp" else 0)
    return one * (1 if cfg.rel_pos_shared else cfg.depth)


def _later_switch_params(cfg: ViTConfig) -> int:
    """What the AIMv2 / BEiT-3 switches add to the paper's count (the post-norm block
    rearranges the same parameters): RMSNorms without biases, a norm on the patch embeddings,
    no attention-projection / MLP biases, the sub-norms inside attention and the MLP."""
    d, hidden = cfg.width, cfg.mlp_dim // 2 if cfg.mlp == "swiglu" else cfg.mlp_dim
    per_norm = 1 if cfg.norm == "rmsnorm" else 2  # scale (and bias) per channel
    n = 0
    if cfg.norm == "rmsnorm":  # the norms counted above as LayerNorms lose their biases
        qk = 2 * (d // cfg.num_heads) if cfg.qk_norm else 0
        norms = 1 if cfg.parallel_scaling else 2  # per block (parallel_scaling: in_norm only)
        n -= cfg.depth * (norms * d + qk) + d * (cfg.final_norm + cfg.norm_pre)
    n += per_norm * d if cfg.patch_norm else 0
    if not cfg.proj_bias:  # attention projection, fc1, fc2
        n -= cfg.depth * (d + cfg.mlp_dim + d)
    n += cfg.depth * per_norm * d if cfg.scale_attn_norm else 0
    n += cfg.depth * per_norm * hidden if cfg.scale_mlp_norm else 0
    return n


def count_flops(cfg: ModelConfig) -> int:
    """Analytic forward FLOPs of one image (2 per multiply-add; matmuls and convolutions only).

    Counted from the shapes rather than by hooks, which miss the fused attention kernel.
    """
    if isinstance(cfg, ResNetConfig):
        return 2 * _bit_macs(cfg)
    t, d, m = cfg.seq_len, cfg.width, cfg.mlp_dim
    m_out = m // 2 if cfg.mlp == "swiglu" else m  # fc2's input
    ph, pw = cfg.patch_size
    macs = cfg.num_patches * ph * pw * cfg.patch_in_chans * d  # patch embedding
    macs += _resnet_macs(cfg)
    per_block = t * d * 3 * d + 2 * t * t * d + t * d * d + t * d * m + t * m_out * d
    macs -= sum(2 * t * d * (d - kv * (d // cfg.num_heads)) for kv in cfg.kv_heads or ())
    macs += cfg.depth * per_block * cfg.parallel  # parallel=N: N branches of each (the rest:
    # parallel_scaling and diff_attn have the paper's matmuls, rearranged)
    if cfg.pool == "map":  # one query over the N patch tokens: q, kv, scores, values, out, MLP
        n = cfg.seq_len if cfg.map_prefix else cfg.num_patches
        macs += d * d + n * d * 2 * d + 2 * n * d + d * d + 2 * d * (cfg.map_mlp_dim or m)
    if cfg.rel_pos.startswith("mlp"):  # the bias's MLP over every offset, per module
        (h, w), hidden = cfg.grid_size, cfg.rel_pos_dim
        per = (2 * h - 1) * (2 * w - 1) * (2 * hidden + hidden * cfg.num_heads)
        macs += per * (1 if cfg.rel_pos_shared else cfg.depth)
    if cfg.representation_size:
        macs += d * cfg.representation_size
    macs += cfg.feature_dim * cfg.num_classes * (2 if cfg.dist_token else 1)
    return 2 * macs


def _parallel_params(cfg: ViTConfig, block: int) -> int:
    """Parameters of a parallel or differential block (vitkit.models.parallel_blocks) minus
    ``block``, the paper's block's."""
    d, m, hd = cfg.width, cfg.mlp_dim, cfg.width // cfg.num_heads
    hq = hd // 2 if cfg.diff_attn else hd  # q/k width per (half) head
    diff = 4 * hq + hd if cfg.diff_attn else 0  # lambda_q1, k1, q2, k2; sub_norm
    qk_norm = 4 * (hq - hd) if cfg.qk_norm else 0  # q/k norms over half heads with diff_attn
    if not cfg.parallel_scaling:  # parallel=N: N attention and N MLP branches
        return (cfg.parallel - 1) * block + cfg.parallel * (diff + qk_norm)
    scaling = 2 * d + d * (m + 3 * d) + (m + 3 * d if cfg.qkv_bias else m)  # in_norm, in_proj
    scaling += 4 * hq if cfg.qk_norm else 0
    scaling += (d + m) * d + (d if cfg.diff_attn else 2 * d)  # out_proj or attn/mlp_out_proj
    scaling += d if cfg.layer_scale_init is not None else 0  # one layer scale
    return scaling + diff - block


def _resnet_units(cfg: ViTConfig) -> list[tuple[int, int, int, int]]:
    """(input channels, bottleneck width, stride, output side length / image side) per unit of
    the hybrid's ResNet, in order."""
    units, cin, w = [], cfg.resnet_width, cfg.resnet_width
    for i, n in enumerate(cfg.resnet_layers or ()):
        f = w * 2**i
        for u in range(n):
            stride = 2 if (i > 0 and u == 0) else 1
            units.append((cin, f, stride, 4 * 2**i))
            cin = 4 * f
    return units


def _resnet_params(cfg: ViTConfig) -> int:
    if cfg.resnet_layers is None:
        return 0
    w = cfg.resnet_width
    n = 7 * 7 * cfg.in_chans * w + 2 * w  # conv_root (no bias), gn_root
    for cin, f, stride, _ in _resnet_units(cfg):
        n += cin * f + 2 * f + 9 * f * f + 2 * f + f * 4 * f + 2 * 4 * f
        if cin != 4 * f or stride != 1:
            n += cin * 4 * f + 2 * 4 * f  # conv_proj, gn_proj
    return n


def _resnet_macs(cfg: ViTConfig) -> int:
    if cfg.resnet_layers is None:
        return 0
    h, w_ = cfg.image_size
    root = cfg.resnet_width
    macs = (h // 2) * (w_ // 2) * 49 * cfg.in_chans * root
    for cin, f, stride, down in _resnet_units(cfg):
        pix = (h // down) * (w_ // down)
        in_pix = pix * stride * stride
        macs += in_pix * cin * f + pix * 9 * f * f + pix * f * 4 * f
        if cin != 4 * f or stride != 1:
            macs += pix * cin * 4 * f
    return macs


def bit_units(cfg: ResNetConfig) -> list[tuple[int, int, int]]:
    """(input channels, bottleneck width, stride) of every unit of a BiT ResNet, in order."""
    units, cin = [], cfg.width
    for i, n in enumerate(cfg.layers):
        f = cfg.width * 2**i
        for u in range(n):
            units.append((cin, f, 2 if (i > 0 and u == 0) else 1))
            cin = 4 * f
    return units


def _bit_params(cfg: ResNetConfig) -> int:
    k = 7 if cfg.root == "bit" else 3
    n = k * k * cfg.in_chans * cfg.width  # root conv (no bias, no norm in a pre-act ResNet)
    for cin, f, stride in bit_units(cfg):
        n += (
            2 * cin + cin * f + 2 * f + 9 * f * f + 2 * f + f * 4 * f
        )  # gn1 conv1 gn2 conv2 gn3 conv3
        if cin != 4 * f or stride != 1:
            n += cin * 4 * f  # downsample conv (no norm)
    n += 2 * cfg.feature_dim  # final GroupNorm
    if cfg.num_classes:
        n += cfg.feature_dim * cfg.num_classes + cfg.num_classes
    return n


def _bit_macs(cfg: ResNetConfig) -> int:
    h, w = cfg.image_size
    if cfg.root == "bit":
        h, w = -(-h // 2), -(-w // 2)
        macs = h * w * 49 * cfg.in_chans * cfg.width
        h, w = -(-h // 2), -(-w // 2)  # max-pool
    else:
        macs = h * w * 9 * cfg.in_chans * cfg.width
    for cin, f, stride in bit_units(cfg):
        oh, ow = -(-h // stride), -(-w // stride)
        macs += h * w * cin * f + oh * ow * (9 * f * f + f * 4 * f)
        if cin != 4 * f or stride != 1:
            macs += oh * ow * cin * 4 * f
        h, w = oh, ow
    return macs + cfg.feature_dim * cfg.num_classes
