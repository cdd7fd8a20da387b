"""Data-parallel training on PyTorch's own stack: torchrun, torch.distributed, DDP and FSDP2.

- `init_distributed()` joins the process group that ``torchrun`` describes in the environment
  (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): NCCL for CUDA devices, gloo otherwise.
- `wrap_model()` returns the module to call in training: ``DistributedDataParallel`` around the
  model, or the model sharded in place with FSDP2's ``fully_shard`` (every encoder block is one
  FSDP unit, then the root), with bf16 parameters for the all-gathers when training in bf16
  and fp32 gradient reduction.
- `DistEnv` says which rank this process is; everything else (loaders, logging, checkpoints)
  reads it. A process without a process group is ``DistEnv()``: rank 0 of 1.
- Reductions (`all_reduce_sum`, `all_reduce_max`) and `reduce_classification`, which merges
  the evaluation results of the ranks into the result of the whole evaluation set.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from vitkit.errors import VitkitError
from vitkit.eval import ClassificationResult

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import OptimizerStateType, ValueType

Strategy = Literal["auto", "ddp", "fsdp"]
FSDP_MIN_WIDTH = 1024  # "auto" shards ViT-L (width 1024) and bigger; smaller models use DDP


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job. ``enabled``: a process group is initialised."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    enabled: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def current(cls) -> DistEnv:
        """The environment of the initialised process group, or a single process."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            enabled=True,
        )


def launched_by_torchrun() -> bool:
    """True in a process started by torchrun (or any launcher that sets the same variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_distributed(device: str = "cpu", timeout_s: float = 1800.0) -> DistEnv:
    """Join the process group described by torchrun's environment variables.

    The backend is NCCL for a CUDA ``device`` (each process then uses ``cuda:LOCAL_RANK``) and
    gloo otherwise. Does nothing if a process group is already initialised.
    """
    if not dist.is_available():
        raise VitkitError("this PyTorch build has no torch.distributed")
    if dist.is_initialized():
        return DistEnv.current()
    if not launched_by_torchrun():
        raise VitkitError(
            "distributed training needs the environment torchrun sets (RANK, WORLD_SIZE, "
            "MASTER_ADDR, MASTER_PORT): launch with 'torchrun --nproc-per-node N -m vitkit "
            "train ...' or 'vitkit train --nproc-per-node N ...'"
        )
    cuda = device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            raise VitkitError(f"device '{device}': this PyTorch sees no CUDA GPU")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        dist.init_process_group(
            backend="nccl" if cuda else "gloo", timeout=timeout, **_restart_store(timeout)
        )
    except (dist.DistStoreError, dist.DistNetworkError) as e:  # (the store never answered)
        endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        reason = " ".join(str(e).split("\n")[0].split())[:200]
        raise VitkitError(
            f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: the rendezvous at "
            f"{endpoint} did not complete within {timeout_s:g} s ({reason}); is every node "
            "started, and is the endpoint reachable from this one?"
        ) from None
    return DistEnv.current()


def _restart_store(timeout: datetime.timedelta) -> dict[str, Any]:
    """Under torchrun's rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``), the process
    group's keys under a prefix of their own per round of processes: torchrun keeps one store
    for every round and its workers' keys carry no round, so after ``--max-restarts``
    restarted the processes, gloo read the killed processes' addresses from it (connection
    refused) and the restart failed. torchrun's restart count does not name the round either:
    of two agents, the one whose process died counts a restart, the other restarts its healthy
    process for the new round without counting one. The round is counted here instead: every
    process adds one on joining, and the processes of a round join after all of the previous
    round's have (torchrun stops a round before it starts the next), so the joins of round k
    are k * world_size + 1 ... (k + 1) * world_size. Elsewhere: nothing (init_process_group
    reads the environment itself)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timeout,
    )
    round_ = (store.add("vitkit/processes_joined", 1) - 1) // world
    return {
        "store": dist.PrefixStore(f"vitkit/round_{round_}", store),
        "rank": int(os.environ["RANK"]),
        "world_size": world,
    }


def shutdown() -> None:
    """Destroy the process group, after freeing what unreachable objects still hold on to it.

    A run that stopped with an error leaves its model, optimizer and FSDP state in reference
    cycles (through the traceback's frames). Left to the interpreter's teardown they were freed
    after the group was gone, and gloo then aborted the process ("terminate called without an
    active exception"; measured: 6 of 16 two-rank FSDP divergence runs). Collecting them first
    frees them while the group still exists.
    """
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def device_for(name: str, env: DistEnv) -> str:
    """A CUDA device without an index means this process's own GPU, ``cuda:LOCAL_RANK``."""
    if env.enabled and name == "cuda":
        return f"cuda:{env.local_rank}"
    return name


def resolve_strategy(strategy: Strategy, width: int) -> Literal["ddp", "fsdp"]:
    if strategy not in ("auto", "ddp", "fsdp"):
        raise VitkitError(f"strategy must be auto, ddp or fsdp, got {strategy!r}")
    if strategy == "auto":
        return "fsdp" if width >= FSDP_MIN_WIDTH else "ddp"
    return strategy


def wrap_model(
    model: nn.Module,
    strategy: Literal["ddp", "fsdp"],
    device: torch.device,
    *,
    bf16: bool = False,
    blocks: Sequence[nn.Module] = (),
) -> nn.Module:
    """The module to train with: DDP around `model`, or `model` itself sharded by FSDP2.

    For FSDP each of `blocks` (the encoder blocks) becomes its own unit so only one block's
    parameters are gathered at a time; with `bf16` the gathered parameters are bf16 and the
    gradients are reduced in fp32 (the optimizer keeps fp32 parameters in both cases).
    """
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def no_gradient_sync(model: nn.Module) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce for a micro-batch that is not the step's last one.

    FSDP reduce-scatters every micro-batch (its point is not to hold whole gradients)."""
    from torch.nn.parallel import DistributedDataParallel

    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(values: Sequence[float], env: DistEnv) -> list[float]:
    """Sum `values` over the ranks (float64; exact for counts below 2**53)."""
    if not env.enabled:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(value: int, env: DistEnv) -> int:
    if not env.enabled:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --- evaluation -------------------------------------------------------------------------------


class _CountingModel(nn.Module):
    """Counts forward calls, so an FSDP rank that ran out of batches can match the others."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.model(x)


class _CountingLoader:
    """A loader that counts the samples it yielded."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.samples = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.samples += len(batch[1])
            yield batch


def evaluate_sharded(
    evaluate: Callable[[nn.Module, Iterable], ClassificationResult],
    model: nn.Module,
    loader: Any,
    num_classes: int,
    env: DistEnv,
    *,
    collective_forward: bool,
    dummy_input: Callable[[], torch.Tensor],
) -> ClassificationResult:
    """Evaluate this rank's part of a data set with `evaluate(model, loader)` and merge the
    ranks' results. With `collective_forward` (FSDP: every forward all-gathers parameters),
    a rank with fewer batches runs forwards on `dummy_input()` until every rank ran as many."""
    counted = _CountingModel(model)
    expected = all_reduce_max(len(loader), env) if collective_forward else 0
    batches = _CountingLoader(loader)
    try:
        result = evaluate(counted, batches)
    except VitkitError:
        if batches.samples:
            raise
        result = None  # this rank's share is empty (a small set over many ranks)
    if collective_forward:
        was_training = model.training
        model.eval()
        with torch.inference_mode():
            for _ in range(expected - counted.calls):
                model(dummy_input())
        model.train(was_training)
    return reduce_classification(result, num_classes, env)


def reduce_classification(
    result: ClassificationResult | None, num_classes: int, env: DistEnv
) -> ClassificationResult:
    """The result over the union of the ranks' samples (`None`: this rank had none)."""
    k = num_classes
    if result is None:
        sums = np.zeros(5 + k * k)
    else:
        n = result.num_samples
        sums = np.concatenate(
            [
                [n, result.loss * n, round(result.top1 * n), round(result.top5 * n)],
                [result.n_skipped],
                result.confusion.reshape(-1),
            ]
        ).astype(np.float64)
    total = np.array(all_reduce_sum(sums.tolist(), env))
    n = int(total[0])
    if n == 0:
        raise VitkitError(f"no samples to evaluate ({int(total[4])} skipped as unreadable)")
    confusion = total[5:].round().astype(np.int64).reshape(k, k)
    per_class_total = confusion.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(
            per_class_total > 0, np.diag(confusion) / np.maximum(per_class_total, 1), np.nan
        )
    return ClassificationResult(
        num_samples=n,
        loss=float(total[1]) / n,
        top1=int(round(total[2])) / n,
        top5=int(round(total[3])) / n,
        per_class_accuracy=tuple(float(a) for a in per_class),
        confusion=confusion,
        n_skipped=int(total[4]),
    )


# --- single-process checkpoints into a distributed model ----------------------------------------


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state_dict: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
) -> None:
    """Load a single-process checkpoint (full weights; ``optimizer.state_dict()`` with
    parameters numbered in the optimizer's order) into a DDP or FSDP2-sharded `model`.

    The optimizer's numbering is turned into parameter names, so the state reaches the right
    (possibly sharded) parameters.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if missing or unexpected:
        raise VitkitError(
            f"checkpoint does not fit the model: missing {missing}, unexpected {unexpected}"
        )
    full = StateDictOptions(full_state_dict=True)
    # dict is invariant: a dict of tensors is a dict of the state-dict API's values.
    set_model_state_dict(model, cast("dict[str, ValueType]", state_dict), options=full)
    named: OptimizerStateType = {
        "state": {order[int(i)]: s for i, s in optimizer_state.get("state", {}).items()},
        "param_groups": [
            {**g, "params": [order[int(i)] for i in g["params"]]}
            for g in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, named, options=full)
