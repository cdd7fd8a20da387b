"""A model process of ``vitkit serve --workers N``: the model loaded once, then forwards on
the batches the front hands it (:mod:`vitkit.serve.front`), one at a time.

The front and this process share two tensors in shared memory, made by the front once per
process: the batch's uint8 images ``[max_batch, C, H, W]`` and the class probabilities
``[max_batch, K]``. A forward's only messages on the pipe are the number of images (front ->
here) and ``("done", seconds)`` or ``("error", line)`` back: no image is pickled. A NaFlex
model's images each have their own size: each lies at the start of its row (room for
``max_seq_len`` patches), and the front sends ``(number, their shapes)``.

The process ignores SIGTERM and SIGINT (the front drains and then closes the pipe: a forward
the drain waits for is never cut short) and exits when the pipe closes, so a front that dies,
even by SIGKILL, leaves no model process behind once its forward ends.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any


def model_main(
    index: int,
    args: Any,
    load: Callable[[Any], Any],
    conn: Any,
    inputs: Any,
    outputs: Any,
) -> None:
    """Load the model of ``args`` with ``load`` (``vitkit serve``'s, at the precision the front
    chose), warm it up, say ``("ready", pid)``, then run every batch the front sends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(args.threads)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # (the front said what it loads)
            served = load(args)
            served.warm_up(args.max_batch)
    except Exception as e:  # (a VitkitError included: one line for the front to print)
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        sys.exit(1)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the front is gone
            break
        if message is None:  # the front stops
            break
        start = time.perf_counter()
        n, images = (message, inputs[:message]) if isinstance(message, int) else message
        try:
            if not isinstance(message, int):  # (NaFlex: each image at its own size)
                images = [row.view(-1)[: math.prod(s)].view(s) for row, s in zip(inputs, images)]
            outputs[:n] = served.probabilities(images)
        except Exception as e:  # the requests of this batch hear why; the process goes on
            conn.send(("error", f"{type(e).__name__}: {e}"))
            continue
        conn.send(("done", time.perf_counter() - start))
    sys.exit(0)
