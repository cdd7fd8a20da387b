"""The model as the server runs it: request images decoded under limits
(:mod:`vitkit.serve.request_images`), batched forwards with the checkpoint's own
preprocessing, and explanations.

Every answer is the one ``vitkit predict`` gives for the same image on the same engine: the
same decoding (:func:`vitkit.data.transforms.convert_image`), eval transform
(:func:`vitkit.data.images.eval_transform`), normalisation and softmax; only the batch an
image shares a forward with differs (float rounding, about 1e-6).
"""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint
from vitkit.data.images import eval_transform
from vitkit.data.transforms import normalize
from vitkit.engines.allocator import release_freed_memory
from vitkit.errors import VitkitError
from vitkit.eval.predict import Prediction, class_names, top_k
from vitkit.serve.decode import DecodeBudget
from vitkit.serve.request_images import Limits, RequestError, load_image, open_checked

# After a decode that needed this many bytes glibc's free memory goes back to the system
# (vitkit.engines.allocator: the vitkit command keeps freed blocks otherwise).
RELEASE_AFTER = 32_000_000


def forward_bytes(cfg: Any, batch: int) -> int:
    """About the most memory one forward of ``batch`` images holds at once: the float input
    and, in one encoder block, the tokens, q/k/v, the attention matrix of every head and the
    MLP's hidden layer (float32)."""
    (h, w), (ph, pw) = cfg.image_size, cfg.patch_size
    tokens = (h // ph) * (w // pw) + 1
    block = tokens * (5 * cfg.width + cfg.mlp_dim) + cfg.num_heads * tokens * tokens
    return 4 * batch * (cfg.in_chans * h * w + block)


class ServedModel:
    """A loaded model and its checkpoint, run as ``vitkit predict`` runs it.

    ``model`` answers classification (a PyTorch module or an engine's
    :class:`vitkit.engines.backends.EngineModel`); ``attention_model`` (a PyTorch Vision
    Transformer, or None) answers explanations; ``engine_line`` says which engine and
    precision run it."""

    def __init__(
        self,
        model: nn.Module,
        ckpt: Checkpoint,
        *,
        engine: str,
        precision: str,
        attention_model: nn.Module | None = None,
        no_attention_reason: str = "",
        precision_why: str = "",
    ):
        cfg = ckpt.model_config
        if not cfg.num_classes:
            raise VitkitError(f"{ckpt.path}: the model has no classification head to serve")
        if getattr(cfg, "naflex", False):
            raise VitkitError(
                f"{ckpt.path}: a NaFlex model (images at their own aspect ratio): the server "
                "runs fixed-size models; vitkit predict --max-seq-len runs this one"
            )
        self.model = model.eval() if isinstance(model, nn.Module) else model
        self.ckpt = ckpt
        self.engine = engine
        self.precision = precision
        self.attention_model = attention_model
        self.no_attention_reason = no_attention_reason
        self.precision_why = precision_why  # how the precision was chosen (/v1/info)
        self.transform = eval_transform(ckpt.preprocess)
        self.num_classes = int(cfg.num_classes)
        self.names = class_names(ckpt, self.num_classes)

    # -- what it says about itself ------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The model, engine and preprocessing, as every answer names them."""
        cfg, pre = self.ckpt.model_config, self.ckpt.preprocess
        model: dict[str, Any] = {
            "name": cfg.short_name,
            "source": self.ckpt.path.name,
            "classes": self.num_classes,
        }
        if self.ckpt.format == "vitkit-pt2":  # (vitkit.engines.pt2_package)
            record: Any = getattr(self.ckpt, "record", {})
            model["format"] = "pt2 package (torch.export + AOTInductor)"
            model["sizes"] = record.get("sizes") or {"fixed": record.get("image_size")}
        return {
            "model": model,
            "engine": self.engine,
            "precision": self.precision,
            "preprocess": pre.to_dict(),
        }

    # -- inputs -------------------------------------------------------------------------

    def prepare(
        self,
        data: bytes,
        limits: Limits,
        what: str = "the image",
        budget: DecodeBudget | None = None,
    ) -> Tensor:
        """Request bytes -> the uint8 [C, H, W] the checkpoint's eval transform makes. With a
        ``budget`` (the server's), the decode and the transform hold their memory in it: an
        image that needs more than the whole budget is refused (413), others wait their turn."""
        return self.finish(*self.open(data, limits, what, budget), what, budget)

    def open(
        self,
        data: bytes,
        limits: Limits,
        what: str,
        budget: DecodeBudget | None = None,
        pillow: bool = True,
    ) -> tuple[Any, int]:
        """The image of ``data`` opened from its header, every limit checked before a pixel
        is decoded, and the bytes its decode will hold (:func:`open_checked`)."""
        channels = self.ckpt.preprocess.channels
        limit = None if budget is None else budget.limit
        return open_checked(data, self.transform, channels, limits, what, limit, pillow)

    def finish(self, img: Any, need: int, what: str, budget: DecodeBudget | None) -> Tensor:
        """An image :meth:`open` opened, decoded and transformed within ``budget``."""
        try:
            with budget.hold(need) if budget is not None else contextlib.nullcontext():
                return self.transform(load_image(img, self.ckpt.preprocess.channels, what))
        finally:
            if budget is not None and need >= RELEASE_AFTER:
                del img
                release_freed_memory()  # (glibc keeps it otherwise: vitkit.engines.allocator)

    def normalized(self, images: Sequence[Tensor]) -> Tensor:
        pre = self.ckpt.preprocess
        return normalize(torch.stack(list(images)).float(), pre.mean, pre.std, pre.rescale_factor)

    # -- answers --------------------------------------------------------------------------

    def probabilities(self, images: Sequence[Tensor]) -> Tensor:
        """One forward over ``images`` (uint8 [C, H, W] each): class probabilities [B, K]."""
        with torch.inference_mode():
            return self.model(self.normalized(images)).float().softmax(-1)

    def top_k(self, probs: Tensor, k: int) -> list[Prediction]:
        return top_k(probs, self.names, k)

    def warm_up(self, batch: int) -> None:
        """Forwards at batch 1 and ``batch``, so the first requests pay no first-call costs."""
        pre = self.ckpt.preprocess
        x = torch.zeros(pre.channels, *pre.image_size, dtype=torch.uint8)
        for n in sorted({1, batch}):
            self.probabilities([x] * n)
        if self.attention_model is not None:
            self.explain(x, k=1, layers=False)

    def check_explainable(self) -> None:
        if self.attention_model is None:
            raise RequestError(409, self.no_attention_reason)

    def explain(
        self,
        image: Tensor,
        *,
        k: int,
        layers: bool,
        head_fusion: str = "mean",
        query_patch: int | None = None,
    ) -> dict[str, Any]:
        """Top-``k``, the attention rollout over the patch grid (array and PNG overlay); with
        ``layers`` every layer's and head's map and the rollout up to each layer; with
        ``query_patch`` where that patch attends in every layer and head."""
        from vitkit.analysis.attention import attention_weights, explain, input_config

        self.check_explainable()
        model: Any = self.attention_model
        x = self.normalized([image])
        found = explain(model, x, head_fusion=head_fusion)  # type: ignore[arg-type]
        cfg = input_config(model, x)
        gh, gw = cfg.grid_size
        rollout = found.rollout[0]
        out: dict[str, Any] = {
            "engine": "torch",  # (attention maps come from the PyTorch model)
            "precision": "fp32",
            "top_k": self.top_k(found.logits.softmax(-1), k)[0],
            "grid": [gh, gw],
            "layers": int(found.layer_maps.shape[1]),
            "heads": int(found.layer_maps.shape[2]),
            "rollout": _rounded(rollout),
            "rollout_png": overlay_png(image, rollout),
            "input_png": overlay_png(image, None),
        }
        if layers:
            out["layer_maps"] = _rounded(found.layer_maps[0])
            out["rollout_maps"] = _rounded(found.rollout_maps[0])
        if query_patch is not None:
            if not 0 <= query_patch < gh * gw:
                raise RequestError(
                    400, f"query_patch {query_patch} is not a patch: 0 to {gh * gw - 1}"
                )
            attentions, _ = attention_weights(model, x)
            row = cfg.num_prefix_tokens + query_patch
            p = cfg.num_prefix_tokens
            maps = torch.stack([a[0, :, row, p:] for a in attentions])  # [L, heads, N]
            maps = maps / maps.sum(-1, keepdim=True).clamp_min(1e-12)
            out["query_patch"] = query_patch
            out["patch_maps"] = _rounded(maps.reshape(*maps.shape[:2], gh, gw))
        return out


def _rounded(t: Tensor) -> Any:
    """A map as nested lists of floats with 6 significant digits (JSON about half as long)."""
    return np.vectorize(lambda v: float(f"{v:.6g}"))(t.double().numpy()).tolist()


def overlay_png(image: Tensor, heat: Tensor | None) -> str:
    """The image the model saw (uint8 [C, H, W]) under a map over its patches [gh, gw],
    coloured (matplotlib's inferno) and blended half and half (None: the image alone): a
    ``data:image/png`` URI."""
    from matplotlib import colormaps

    c, h, w = image.shape
    rgb = image.expand(3, h, w) if c == 1 else image
    base = rgb.permute(1, 2, 0).numpy().astype(np.float32) / 255
    if heat is None:
        buf = io.BytesIO()
        Image.fromarray(rgb.permute(1, 2, 0).numpy()).save(buf, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    m = heat.double().numpy()
    m = (m - m.min()) / max(float(m.max() - m.min()), 1e-12)
    small = Image.fromarray((m * 255).astype(np.uint8))
    up = np.asarray(small.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32) / 255
    colour = colormaps["inferno"](up)[..., :3]
    mixed = (0.5 * base + 0.5 * colour).clip(0, 1)
    buf = io.BytesIO()
    Image.fromarray((mixed * 255).round().astype(np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
