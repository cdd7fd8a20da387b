"""Several nodes and a rank that dies, for real: docs/distributed.md's two-node command (two
torchrun agents on loopback, c10d rendezvous, gloo) run as written, against the one-agent run
of two processes; then the same command with one node's rank SIGKILLed while it writes a
checkpoint, restarted by torchrun (--max-restarts 1) and continued (--resume auto). Both end
with bitwise the same weights as the unbroken one-agent run. A rendezvous that never
completes is one line naming its endpoint."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vitkit.checkpoints import LATEST, load_model

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "distributed.md"
ENDPOINT = "127.0.0.1:29500"


def doc_command() -> list[str]:
    """The two-node command of docs/distributed.md, as written there."""
    section = DOC.read_text().split("### Two nodes on one machine", 1)[1].split("\n### ", 1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, "docs/distributed.md lost its two-node example"
    line = " ".join(found.group(1).replace("\\\n", " ").split())
    assert line.startswith("torchrun --nnodes 2 --nproc-per-node 1 ") and ENDPOINT in line
    return shlex.split(line)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_WAIT_POLICY": "PASSIVE"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _agents(cwd: Path) -> list[subprocess.Popen[bytes]]:
    """The documented command started twice (two nodes), on a free port instead of 29500;
    their output goes to ``cwd/agent-N.log``."""
    cmd = doc_command()
    cmd[cmd.index(ENDPOINT)] = f"127.0.0.1:{_free_port()}"
    cmd = [*_torchrun(), *cmd[1:]]
    agents = []
    for n in range(2):
        with open(cwd / f"agent-{n}.log", "wb") as log:
            agents.append(
                subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
            )
    return agents


def _wait(agents: list[subprocess.Popen[bytes]], cwd: Path) -> str:
    for a in agents:
        try:
            a.wait(timeout=600)
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
    logs = "".join((cwd / f"agent-{n}.log").read_text(errors="replace") for n in range(2))
    assert all(a.returncode == 0 for a in agents), logs[-4000:]
    return logs


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_model(run)[0].state_dict()


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


@pytest.fixture(scope="module")
def one_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documented options on one agent of two processes (torchrun --standalone)."""
    cmd = doc_command()
    options = cmd[cmd.index("-m") :]
    options[options.index("runs/two-nodes")] = "runs/one-node"
    cwd = tmp_path_factory.mktemp("one-agent")
    launch = [*_torchrun(), "--standalone", "--nproc-per-node", "2", *options]
    subprocess.run(launch, cwd=cwd, env=_env(), check=True, timeout=600, capture_output=True)
    return cwd / "runs" / "one-node"


def test_two_agents_equal_one_agent_of_two_processes(one_agent: Path, tmp_path: Path) -> None:
    err = _wait(_agents(tmp_path), tmp_path)
    run = tmp_path / "runs" / "two-nodes"
    report = json.loads((run / "report.json").read_text())
    assert report["distributed"]["world_size"] == 2
    assert "holds no run yet; starting it (--resume auto)" in err
    _assert_bitwise(_weights(run), _weights(one_agent))
    assert report["steps"] == json.loads((one_agent / "report.json").read_text())["steps"]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_rank_killed_mid_checkpoint_restarts_to_the_same_weights(
    one_agent: Path, tmp_path: Path
) -> None:
    """kill -9 of one node's rank while a checkpoint is being written, after an earlier one is
    complete (the documented command, --max-restarts 1): torchrun restarts both nodes'
    processes, they continue from the complete checkpoint (--resume auto; the half-written one
    is never read) and end bitwise where the unbroken run does, every record logged once.
    Fails without the process group's per-round store keys (the restart read the killed
    processes' addresses)."""
    agents = _agents(tmp_path)
    agent = agents[1]
    run = tmp_path / "runs" / "two-nodes"
    ckpts = run / "checkpoints"
    deadline, killed_during = time.time() + 300, None
    while killed_during is None and time.time() < deadline:
        assert all(a.poll() is None for a in agents), "the run ended before it could be killed"
        writing = sorted(ckpts.glob(".step_*.tmp-dcp")) if ckpts.is_dir() else []
        if writing and (ckpts / LATEST).is_file():
            workers = _children(agent.pid)
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed_during = writing[0].name
        time.sleep(0.002)
    assert killed_during, "no checkpoint write was seen in time"
    latest_at_kill = (ckpts / LATEST).read_text().strip()
    err = _wait(agents, tmp_path)
    assert f"runs/two-nodes: continuing the run from {latest_at_kill}" in err
    _assert_bitwise(_weights(run), _weights(one_agent))

    def records(r: Path) -> list[tuple[object, ...]]:
        lines = (r / "metrics.jsonl").read_text().splitlines()
        return [tuple(sorted(json.loads(line))) + (json.loads(line).get("step"),) for line in lines]

    assert records(run) == records(one_agent)  # each record once, none lost or repeated
    total = json.loads((one_agent / "report.json").read_text())["steps"]
    assert json.loads((run / "report.json").read_text())["steps"] == total
    assert not list(ckpts.glob(".step_*.tmp-dcp"))  # the half-written one was cleared


def test_a_rendezvous_that_times_out_is_one_line_naming_the_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1 of 2 whose rendezvous endpoint never answers (no node 0): one line naming the
    endpoint, after the timeout, instead of a store traceback."""
    from vitkit.errors import VitkitError
    from vitkit.train import distributed

    port = _free_port()
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with pytest.raises(VitkitError) as e:
        distributed.init_distributed("cpu", timeout_s=2)
    message = str(e.value)
    assert f"rank 1 of 2: the rendezvous at 127.0.0.1:{port} did not complete within 2 s" in message
    assert "\n" not in message
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # as torchrun's workers
    with pytest.raises(VitkitError, match=f"the rendezvous at 127.0.0.1:{port} did not complete"):
        distributed.init_distributed("cpu", timeout_s=2)
