"""A model process of ``vitkit serve --workers N``: the model loaded once, then forwards on
the batches and the explanations the front hands it (:mod:`vitkit.serve.front`), one at a
time. The front holds no weights: every forward and every explanation runs here.

Once loaded, the process makes two tensors in shared memory and hands them to the front with
its ``("ready", pid, facts)``: the batch's uint8 images ``[max_batch, C, H, W]`` and the class
probabilities ``[max_batch, K]``. A forward's only messages on the pipe are the number of
images (front -> here) and ``("done", seconds)`` or ``("error", line)`` back: no image is
pickled. A NaFlex model's images each have their own size: each lies at the start of its row
(room for ``max_seq_len`` patches), and the front sends ``(number, their shapes)``. An
explanation is ``("call", "explain", args, kwargs)`` (its one image as a NumPy array),
answered ``("called", answer)``, ``("refused", status, line)`` or ``("error", line)``.
``facts`` carries the served model without its weights (:meth:`ServedModel.without_weights`:
the front's preprocessing, labels, engine and precision) and what the loading said.

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


def model_main(index: int, args: Any, load: Callable[[Any], Any], conn: Any) -> None:
    """Load the model of ``args`` with ``load`` (``vitkit serve``'s: ``--precision auto``
    decided here in the first process, then the front passes the choice to the others), warm
    it up, say ``("ready", pid, facts, inputs, outputs)``, then run every batch and call the
    front sends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import numpy as np
    import torch

    from vitkit.errors import VitkitError
    from vitkit.serve.served_model import RequestError

    torch.set_num_threads(args.threads)
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):  # (the front prints it, once)
            served = load(args)
            if getattr(args, "threads_auto", False):  # (--threads not given)
                from vitkit.serve.served_model import forward_threads

                threads = forward_threads(served.ckpt.model_config, args.max_batch)
                if threads is not None:  # a forward too small to split
                    torch.set_num_threads(threads)
            served.warm_up(args.max_batch)
        pre = served.ckpt.preprocess
        shape = (args.max_batch, pre.channels, *pre.image_size)
        if served.max_seq_len is not None:  # (NaFlex: room for an image of max_seq_len patches)
            ph, pw = served.transform.patch
            shape = (args.max_batch, pre.channels, served.max_seq_len * ph, pw)
        inputs = torch.empty(shape, dtype=torch.uint8).share_memory_()
        outputs = torch.empty(args.max_batch, served.num_classes).share_memory_()
    except Exception as e:  # (a VitkitError: its line alone, for the front to print)
        conn.send(("failed", str(e) if isinstance(e, VitkitError) else f"{type(e).__name__}: {e}"))
        sys.exit(1)
    facts = {"served": served.without_weights(), "said": said.getvalue()}
    import gc

    gc.collect()
    gc.freeze()  # (the start's objects out of the collector's reach: no full-heap pauses)
    conn.send(("ready", os.getpid(), facts, inputs, outputs))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the front is gone
            break
        if message is None:  # the front stops
            break
        if isinstance(message, tuple) and message[0] == "call":  # (name, args, kwargs)
            _, name, call_args, kwargs = message
            call_args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                         for a in call_args]  # fmt: skip
            try:
                conn.send(("called", getattr(served, name)(*call_args, **kwargs)))
            except RequestError as e:
                conn.send(("refused", e.status, e.message))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
            continue
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
