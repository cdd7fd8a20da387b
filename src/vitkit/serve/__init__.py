"""A model behind HTTP: ``vitkit serve`` (the optional ``serve`` extra: FastAPI, uvicorn).

- :mod:`vitkit.serve.served_model`: the loaded model as the server runs it: batched forwards
  with the checkpoint's own preprocessing (the answers of ``vitkit predict``), explanations
  (attention rollout and per-layer maps, :mod:`vitkit.analysis.attention`).
- :mod:`vitkit.serve.request_images`: request images opened under limits (pixels checked
  before a byte is decoded) and decoded, with Pillow and NumPy only;
  :mod:`vitkit.serve.decode_process` runs the decodes in processes without PyTorch.
- :mod:`vitkit.serve.batcher`: requests of many clients coalesced into one forward
  (``--max-batch`` images, waiting at most ``--max-wait-ms`` for more).
- :mod:`vitkit.serve.prometheus`: the counters ``GET /metrics`` publishes.
- :mod:`vitkit.serve.http_app`: the FastAPI application (routes, limits, API key, errors).
- ``page.html``: the page at ``GET /`` (self-contained).
"""

from __future__ import annotations

from typing import Any

from vitkit.errors import VitkitError

EXTRA_LINE = "vitkit serve needs the serve extra: pip install '.[serve]' in vitkit's clone"


def require_serve() -> tuple[Any, Any]:
    """The ``fastapi`` and ``uvicorn`` modules, or one line naming the extra that installs them."""
    try:
        import fastapi
        import python_multipart  # noqa: F401  (multipart uploads)
        import uvicorn
    except ImportError:
        raise VitkitError(EXTRA_LINE) from None
    return fastapi, uvicorn
