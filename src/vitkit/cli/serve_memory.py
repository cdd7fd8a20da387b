"""What ``vitkit serve --dry-run`` says a container needs: the resident model, the request
budgets and the decode processes, for one process, a front with its model processes, or
shared-socket workers (deploy/k8s.yaml's memory lines are this module's)."""

from __future__ import annotations

import argparse
from typing import Any

# Beside the model and the budgets, the decode processes' own pages: PSS at idle measured by
# bench/serve_decode_idle.py (bench/results/serve_decode_idle.md, the MNIST model, --decode-workers
# 2): 26.0 MB for the two decode processes, 13 MB each, counted for each of the up to SURGE x
# --decode-workers that decode at once (a surge process is forked from the same fork server);
# 11.5 MB for the fork server and 8.0 MB for multiprocessing's resource tracker, once.
DECODE_PROCESS_MB = 13
DECODE_SHARED_MB = 20
# A container's limit over its request: room for what the estimate leaves out.
LIMIT_OVER_REQUEST = 1.25


def resident_mb() -> float:
    """This process's resident memory now (MB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def weights_mb(served: Any) -> float:
    """The bytes (MiB) of the served model's parameters and buffers, its explaining model's
    included, each tensor once (0 for an engine that keeps its own)."""
    import torch

    seen: dict[int, int] = {}
    for m in (served.model, served.attention_model):
        if isinstance(m, torch.nn.Module):
            for t in (*m.parameters(), *m.buffers()):
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values()) / 2**20


def memory_line(args: argparse.Namespace, limits: Any, weights: float = 0.0) -> str:
    """What a container needs (``--dry-run``): the resident memory after loading and warming
    up, plus what the decode and body budgets let requests hold and the decode processes; with
    ``--workers N`` the front's (all that less the model's ``weights`` MiB: it holds none) and
    N model processes' (each about the resident model; ``--worker-mode socket``: N whole
    servers); the request and limit to give it (Mi)."""
    from vitkit.serve.decode_process import SURGE

    model = resident_mb()
    budgets = (limits.max_decode_memory + limits.max_body_memory) / 2**20
    most = SURGE * limits.decode_workers
    decoders = DECODE_SHARED_MB + DECODE_PROCESS_MB * most
    worker = model + budgets + decoders
    front = args.workers > 1 and args.worker_mode == "front"
    total = worker - weights + model * args.workers if front else worker * args.workers
    request = int(-(-total // 64) * 64)
    limit = int(-(-total * LIMIT_OVER_REQUEST // 64) * 64)
    parts = (
        f"memory: {model:,.0f} MiB resident after warm-up + {budgets:,.0f} MiB of decode and "
        f"body budgets + {decoders} MiB of up to {most} decode processes = {worker:,.0f} MiB"
    )
    if front:
        return (
            f"{parts} the front, less the model's {weights:,.0f} MiB of weights it does not "
            f"hold, + {args.workers} model processes of {model:,.0f} MiB: request "
            f"{request}Mi, limit {limit}Mi"
        )
    return f"{parts} a worker, x {args.workers} workers: request {request}Mi, limit {limit}Mi"
