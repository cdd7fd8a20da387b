"""Data-parallel training on the CPU with gloo and two real processes.

DDP and FSDP2 with two ranks equal one process with the same global batch; a torchrun run that
is SIGKILLed after its first distributed checkpoint resumes on one process to the weights of an
uninterrupted run; distributed checkpoints are read and consolidated without a process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from vitkit.checkpoints import LATEST, load_model
from vitkit.checkpoints.native.sharded import is_distributed_checkpoint
from vitkit.cli import main
from vitkit.models.vit import create_model
from vitkit.train.activation_checkpointing import apply_activation_checkpointing
from vitkit.train.trainer import TrainConfig, Trainer

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}
TINY_ARGS = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(out: Path, **changes: object) -> TrainConfig:
    base = {
        "data": "digits",
        "model": "Ti/2",
        "model_overrides": TINY,
        "epochs": 1,
        "batch_size": 32,
        "optimizer": "sgd",  # Adam would blow rounding noise in near-zero gradients up
        "lr": 0.1,
        "augment": "digits",  # drawn for the global batch: must not depend on the world size
        "precision": "fp32",
        "progress": False,
        "log_every": 1,
        "out_dir": str(out),
    }
    base.update(changes)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _rank_main(rank: int, world: int, port: int, cfg: dict) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    from vitkit.train import distributed

    env = distributed.init_distributed("cpu")
    assert env.enabled and env.world_size == world and env.rank == rank
    try:
        trainer = Trainer(TrainConfig.from_dict(cfg))
        assert trainer.micro_batch == cfg["batch_size"] // cfg["accum_steps"] // world
        trainer.fit()
    finally:
        distributed.shutdown()


def _run_on_two_ranks(cfg: TrainConfig) -> None:
    mp.spawn(_rank_main, args=(2, _free_port(), cfg.to_dict()), nprocs=2, join=True)


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k, **tol)


def _train_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["train_loss"] for line in lines if "train_loss" in line]


@pytest.mark.parametrize(
    ("strategy", "accum_steps"), [("ddp", 1), ("ddp", 2), ("fsdp", 1)], ids=str
)
def test_two_ranks_equal_one_process_with_the_global_batch(
    tmp_path: Path, strategy: str, accum_steps: int
) -> None:
    """World size 2 with per-rank batch b (x accum) equals one process with batch 2b: same
    images, same augmentation, gradients averaged over the global batch, so the same weights
    after each step (fp32 rounding apart), the same logged losses and a pruned checkpoint dir."""
    changes = {"max_steps": 3, "accum_steps": accum_steps, "strategy": strategy}
    single = Trainer(_config(tmp_path / "single", **changes))
    single.fit()
    _run_on_two_ranks(_config(tmp_path / "two", **changes))

    two, ckpt = load_model(tmp_path / "two")  # read from the two ranks' shards, one process
    assert is_distributed_checkpoint(ckpt.path)
    assert ckpt.meta["distributed"] == {"world_size": 2, "strategy": strategy}
    _assert_close(two.state_dict(), single.model.state_dict(), rtol=1e-5, atol=2e-6)
    assert two.state_dict()["head.weight"].abs().sum() > 0  # the zero-initialised head moved
    losses_two, losses_one = _train_losses(tmp_path / "two"), _train_losses(tmp_path / "single")
    assert len(losses_two) == 3
    assert losses_two == pytest.approx(losses_one, rel=1e-5)
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    single_report = json.loads((tmp_path / "single" / "report.json").read_text())
    assert report["distributed"]["world_size"] == 2
    assert report["test_num_samples"] == single_report["test_num_samples"]  # each image once
    assert report["test_top1"] == pytest.approx(single_report["test_top1"], abs=1e-9)


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (torchrun starts its workers in sessions of their own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _torchrun() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def test_torchrun_run_killed_then_resumed_on_one_process(tmp_path: Path) -> None:
    """A real torchrun run with two processes, SIGKILLed (workers and agent) once its
    first distributed checkpoint exists, resumed by a single process: the same final weights
    as an uninterrupted single-process run. The checkpoint also consolidates to one file."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_WAIT_POLICY": "PASSIVE"}
    env["OMP_NUM_THREADS"] = "1"
    args = ["train", "--data", "digits", "--model", "Ti/2", *TINY_ARGS, "--no-progress"]
    args += ["--batch-size", "32", "--epochs", "2", "--ckpt-every", "5", "--optimizer", "sgd"]
    args += ["--lr", "0.1", "--precision", "fp32", "--augment", "digits", "--keep-checkpoints"]
    args += ["100"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    vitkit = [sys.executable, "-m", "vitkit"]
    subprocess.run([*vitkit, *args, "--out-dir", str(full)], env=env, check=True, timeout=300)
    total = json.loads((full / "report.json").read_text())["steps"]

    launch = [*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitkit"]
    proc = subprocess.Popen(
        [*launch, *args, "--out-dir", str(killed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    latest = killed / "checkpoints" / LATEST
    deadline = time.time() + 240
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    for pid in [*_children(proc.pid), proc.pid]:  # the workers (own sessions), then torchrun
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate()
    assert latest.exists(), err.decode()[-2000:]
    name = latest.read_text().strip()
    at = int(name[5:])
    assert at < total, "the run finished before it could be killed; make it longer"
    assert not (killed / "report.json").exists()
    ckpt_dir = killed / "checkpoints" / name
    assert is_distributed_checkpoint(ckpt_dir)
    assert len(list((ckpt_dir / "dcp").glob("*.safetensors"))) == 2  # one file per rank

    # The sharded checkpoint as one file, in one process, equals the uninterrupted run's.
    assert main(["consolidate", str(ckpt_dir), str(tmp_path / "one")]) == 0
    consolidated, _ = load_model(tmp_path / "one")
    reference, _ = load_model(full / "checkpoints" / name)
    _assert_close(consolidated.state_dict(), reference.state_dict(), rtol=1e-5, atol=2e-6)

    subprocess.run(
        [*vitkit, *args, "--out-dir", str(killed), "--resume"], env=env, check=True, timeout=300
    )
    resumed, _ = load_model(killed)
    final, _ = load_model(full)
    _assert_close(resumed.state_dict(), final.state_dict(), rtol=1e-4, atol=1e-5)
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").open()]
    assert steps == sorted(steps) and steps[-1] == total


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    """Recomputing block activations (dropout included: its RNG is replayed) changes nothing
    but memory: the same loss and gradients, the same parameter names."""
    torch.manual_seed(0)
    model = create_model("Ti/4", image_size=16, num_classes=5, dropout=0.2, **TINY)
    x = torch.randn(4, 3, 16, 16)
    grads = []
    for checkpointed in (False, True):
        if checkpointed:
            assert apply_activation_checkpointing(model.blocks) == 2
            assert apply_activation_checkpointing(model.blocks) == 0  # idempotent
        model.zero_grad()
        torch.manual_seed(1)
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    _assert_close(grads[0], grads[1], rtol=0, atol=0)
    assert grads[0].keys() == dict(create_model("Ti/4", **TINY).named_parameters()).keys()


def test_single_process_checkpoint_resumes_sharded_with_fsdp(tmp_path: Path) -> None:
    """A single-process (vitkit-format) checkpoint continues under FSDP on two ranks: weights
    and SGD momentum reach the right shards, so the run ends where the single process does."""
    import shutil

    single = Trainer(_config(tmp_path / "single", max_steps=6, ckpt_every=3, keep_checkpoints=9))
    single.fit()
    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(
        tmp_path / "single" / "checkpoints" / "step_00000003",
        run / "checkpoints" / "step_00000003",
    )
    (run / "checkpoints" / LATEST).write_text("step_00000003\n")
    cfg = _config(run, max_steps=6, ckpt_every=3, keep_checkpoints=9, strategy="fsdp")
    _run_on_two_ranks(TrainConfig(**{**cfg.to_dict(), "resume": True}))
    resumed, ckpt = load_model(run)
    assert ckpt.path.name == "step_00000006" and is_distributed_checkpoint(ckpt.path)
    _assert_close(resumed.state_dict(), single.model.state_dict(), rtol=1e-5, atol=2e-6)


def _rank_diverges(rank: int, world: int, port: int, cfg: dict, out: str) -> None:
    """A rank of a run that diverges: records the error it stopped with (None: it did not)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    from vitkit.errors import VitkitError
    from vitkit.train import distributed

    distributed.init_distributed("cpu")
    message = None
    try:
        Trainer(TrainConfig.from_dict(cfg)).fit()
    except VitkitError as e:
        message = str(e)
    finally:
        distributed.shutdown()
    Path(out, f"rank{rank}.json").write_text(json.dumps(message))


def test_divergence_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    """A NaN loss stops both ranks at the same step (the loss is all-reduced before the check),
    none hangs in a collective; FSDP's sharded weights are checked before every save."""
    cfg = _config(
        tmp_path / "run", optimizer="adamw", lr=1e6, max_steps=20, ckpt_every=1, strategy="fsdp"
    )
    args = (2, _free_port(), cfg.to_dict(), str(tmp_path))
    mp.spawn(_rank_diverges, args=args, nprocs=2, join=True)
    messages = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert messages[0] is not None and "diverged at step" in messages[0]
    step = messages[0].split("diverged at step ")[1].split(":")[0]
    assert f"diverged at step {step}:" in (messages[1] or "")  # the same step on both ranks
    for name, t in load_model(tmp_path / "run")[0].state_dict().items():
        assert torch.isfinite(t).all(), name  # the last checkpoint kept is finite


class _Cycle:
    """Kept alive only by a reference cycle; records whether a group existed when it was freed."""

    def __init__(self, seen: list[bool]) -> None:
        self.me = self
        self.seen = seen

    def __del__(self) -> None:
        import torch.distributed as dist

        self.seen.append(dist.is_initialized())


def test_shutdown_frees_cyclic_garbage_before_destroying_the_group(tmp_path: Path) -> None:
    """A failed run's model and optimizer sit in reference cycles; freed after the group was
    destroyed (at interpreter teardown), gloo aborted the process in about 1 of 3 two-rank FSDP
    divergence runs. shutdown() collects them while the group still exists."""
    import gc

    import torch.distributed as dist

    from vitkit.train import distributed

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    seen: list[bool] = []
    gc.disable()  # so only shutdown() can collect the cycle
    try:
        _Cycle(seen)
        distributed.shutdown()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()
    gc.collect()
    assert seen == [True]
    assert not dist.is_initialized()
