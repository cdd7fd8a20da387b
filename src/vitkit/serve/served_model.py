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
import copy
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
from vitkit.pil_images import PilNativeTransform, fit_size
from vitkit.serve.decode import DecodeBudget
from vitkit.serve.request_images import Limits, RequestError, load_image, open_checked

# After a decode that needed this many bytes glibc's free memory goes back to the system
# (vitkit.engines.allocator: the vitkit command keeps freed blocks otherwise).
RELEASE_AFTER = 32_000_000


# A forward of fewer FLOPs than this runs on one intra-op thread where --threads is not given:
# its operations are too small to split (a 2-vCPU Zen 4 EPYC, host loaded, the MNIST model on
# one thread against two: 1.7 against 5.8 ms for one image, 6.0 against 9.5 for 32, 40 against
# 77 for 128 (0.93 GFLOP); Ti/16, one image, 2.5 GFLOP: 65 against 119 ms, where an idle host
# gains from the second thread).
ONE_THREAD_FLOPS = 1e9


def forward_threads(cfg: Any, max_batch: int) -> int | None:
    """1 where a forward of ``max_batch`` images of ``cfg`` is under :data:`ONE_THREAD_FLOPS`
    (analytic FLOPs), None (PyTorch's choice) otherwise."""
    from vitkit.registry.counts import count_flops

    return 1 if count_flops(cfg) * max_batch < ONE_THREAD_FLOPS else None


def forward_bytes(cfg: Any, batch: int, max_seq_len: int | None = None) -> int:
    """About the most memory one forward of ``batch`` images holds at once: the float input
    and, in one encoder block, the tokens, q/k/v, the attention matrix of every head and the
    MLP's hidden layer (float32). ``max_seq_len``: a NaFlex model's packed batch (that many
    patches an image, and their pixels)."""
    (h, w), (ph, pw) = cfg.image_size, cfg.patch_size
    tokens, pixels = (h // ph) * (w // pw) + 1, h * w
    if max_seq_len is not None:
        tokens, pixels = max_seq_len + cfg.num_prefix_tokens, max_seq_len * ph * pw
    block = tokens * (5 * cfg.width + cfg.mlp_dim) + cfg.num_heads * tokens * tokens
    return 4 * batch * (cfg.in_chans * pixels + block)


class ServedModel:
    """A loaded model and its checkpoint, run as ``vitkit predict`` runs it.

    ``model`` answers classification (a PyTorch module or an engine's
    :class:`vitkit.engines.backends.EngineModel`); ``attention_model`` (a PyTorch Vision
    Transformer, or None) answers explanations; ``engine_line`` says which engine and
    precision run it. ``max_seq_len`` (a NaFlex model, and only one): each image at its own
    aspect ratio with at most that many patches, a batch packed and padded to it, as
    ``vitkit predict --max-seq-len`` runs them."""

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
        max_seq_len: int | None = None,
    ):
        cfg = ckpt.model_config
        if not cfg.num_classes:
            raise VitkitError(f"{ckpt.path}: the model has no classification head to serve")
        naflex = getattr(cfg, "naflex", False)
        if naflex and max_seq_len is None:
            raise VitkitError(
                f"{ckpt.path}: a NaFlex model (images at their own aspect ratio): serve it "
                "with --max-seq-len N (the most patches an image may have)"
            )
        if max_seq_len is not None and not naflex:
            h, w = ckpt.preprocess.image_size
            raise VitkitError(
                f"{ckpt.path}: --max-seq-len packs images for a NaFlex model; this one takes "
                f"{h}x{w} images (serve it without --max-seq-len)"
            )
        if max_seq_len is not None and getattr(model, "sizes", False) is None:
            raise VitkitError(  # (an engine of one size: --engine onnxruntime / openvino)
                f"{ckpt.path}: {getattr(model, 'engine', 'the engine')} runs this NaFlex model "
                "exported at one size: serve it with --engine torch (or --fast), or export it "
                "with --dynamic-size and serve that engine directory"
            )
        self.max_seq_len = max_seq_len
        if max_seq_len is not None:  # (explain's maps are of one fixed-size image)
            attention_model = None
            no_attention_reason = (
                "a NaFlex model's attention maps are not served (each image runs at its own "
                "size): /v1/classify answers it"
            )
        self.model: Any = model.eval() if isinstance(model, nn.Module) else model
        self.ckpt = ckpt
        self.engine = engine
        self.precision = precision
        self.attention_model = attention_model
        self.explainable = attention_model is not None  # (a copy without weights keeps it)
        self.no_attention_reason = no_attention_reason
        self.precision_why = precision_why  # how the precision was chosen (/v1/info)
        self.transform: Any = eval_transform(ckpt.preprocess)
        if max_seq_len is not None:
            pre: Any = ckpt.preprocess
            patch = cfg.patch_size  # type: ignore[union-attr]
            self.transform = PilNativeTransform(patch, max_seq_len, pre.channels, pre.interpolation)
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
        if self.max_seq_len is not None:
            model["max_seq_len"] = self.max_seq_len  # (each image at its own aspect ratio)
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

    def normalized(self, images: Sequence[Tensor]) -> Any:
        """The model's input: the images normalised as a batch [B, C, H, W]; a NaFlex
        model's each normalised at its own size, then packed (what predict runs)."""
        pre = self.ckpt.preprocess
        if self.max_seq_len is None:
            x = torch.stack(list(images)).float()
            return normalize(x, pre.mean, pre.std, pre.rescale_factor)
        from vitkit.models.naflex_packing import pack

        scale = pre.rescale_factor
        each = [normalize(x.float()[None], pre.mean, pre.std, scale)[0] for x in images]
        return pack(each, self.transform.patch, self.max_seq_len)

    @property
    def input_size(self) -> tuple[int, int]:
        """(H, W) of a model input: the checkpoint's size; a NaFlex model's largest image of
        that aspect ratio (at most ``max_seq_len`` patches)."""
        size = tuple(self.ckpt.preprocess.image_size)
        if self.max_seq_len is None:
            return size  # type: ignore[return-value]
        return fit_size(size, self.transform.patch, self.max_seq_len)  # type: ignore[arg-type]

    # -- answers --------------------------------------------------------------------------

    def probabilities(self, images: Sequence[Tensor]) -> Tensor:
        """One forward over ``images`` (uint8 [C, H, W] each): class probabilities [B, K]."""
        with torch.inference_mode():
            return self.model(self.normalized(images)).float().softmax(-1)

    def top_k(self, probs: Tensor, k: int) -> list[Prediction]:
        return top_k(probs, self.names, k)

    def warm_up(self, batch: int) -> None:
        """Forwards at batch 1 and ``batch``, so the first requests pay no first-call costs."""
        x = torch.zeros(self.ckpt.preprocess.channels, *self.input_size, dtype=torch.uint8)
        for n in sorted({1, batch}):
            self.probabilities([x] * n)
        if self.attention_model is not None:
            self.explain(x, k=1, layers=False)

    def check_explainable(self) -> None:
        if not self.explainable:
            raise RequestError(409, self.no_attention_reason)

    def without_weights(self) -> ServedModel:
        """This served model less its models and weights: what the front of ``--workers N``
        holds (preprocessing, labels, which engine and precision, whether it explains), the
        model processes answering the forwards and explanations."""
        light = copy.copy(self)
        light.model, light.attention_model = None, None
        light.ckpt = copy.copy(self.ckpt)  # (a checkpoint, an engine's or a package's)
        light.ckpt.state_dict = {}
        if getattr(light.ckpt, "train_state", None) is not None:
            light.ckpt.train_state = None
        return light

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
        if model is None:  # (the front's copy: a model process explains)
            raise RuntimeError("this served model holds no weights: a model process explains")
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
