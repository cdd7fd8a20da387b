"""Several nodes and a killed rank on one machine, timed: docs/distributed.md's two-node
command (two torchrun agents on loopback, c10d rendezvous, gloo) against one agent of two
processes with the same options (final weights compared bit for bit, train images/s), then a
rank killed with SIGKILL while it writes a checkpoint under ``--max-restarts 1`` with
``--resume auto``, in one agent, in one of two agents, and with that agent killed whole and
its command started again (a node that dies and is replaced): whether the job restarted and ended
bitwise equal to the unbroken run, the seconds from the kill to training again (the restarted
run's "continuing the run from" line), and the steps lost (those redone after the restart).

    python bench/scale_faults.py --out bench/results/scale_faults
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENDPOINT = "127.0.0.1:29500"


def doc_command() -> list[str]:
    text = (ROOT / "docs" / "distributed.md").read_text()
    section = text.split("### Two nodes on one machine", 1)[1].split("\n### ", 1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, "docs/distributed.md lost its two-node example"
    return shlex.split(" ".join(found.group(1).replace("\\\n", " ").split()))


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model (a VM may say only
    "AMD EPYC")."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    name = info.get("model name", platform.processor())
    return f"{name} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    src = str(ROOT / "src")
    return {**os.environ, "PYTHONPATH": src, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


def _torchrun() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _launch(cwd: Path, two_agents: bool, restarts: bool) -> list[subprocess.Popen[bytes]]:
    cmd = doc_command()
    options = cmd[cmd.index("-m") :]
    if two_agents:
        cmd[cmd.index(ENDPOINT)] = f"127.0.0.1:{_free_port()}"
        if not restarts:
            cmd = [
                a
                for i, a in enumerate(cmd)
                if a != "--max-restarts" and cmd[i - 1] != "--max-restarts"
            ]
        commands = [[*_torchrun(), *cmd[1:]]] * 2
    else:
        launch = [*_torchrun(), "--standalone", "--nproc-per-node", "2"]
        launch += ["--max-restarts", "1"] if restarts else []
        commands = [[*launch, *options]]
    agents = []
    for n, command in enumerate(commands):
        if n:  # (the first agent then hosts the rendezvous store)
            time.sleep(2)
        with open(cwd / f"agent-{n}.log", "wb") as log:
            agents.append(
                subprocess.Popen(command, cwd=cwd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
            )
    return agents


def _logs(cwd: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(cwd.glob("agent-*.log")))


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


def _weights(run: Path) -> dict:
    from vitkit.checkpoints import load_model

    return load_model(run)[0].state_dict()


def _bitwise(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def unbroken(work: Path, two_agents: bool) -> dict:
    cwd = work / ("two-agents" if two_agents else "one-agent")
    cwd.mkdir()
    agents = _launch(cwd, two_agents, restarts=False)
    ok = all(a.wait(timeout=1800) == 0 for a in agents)
    run = cwd / "runs" / "two-nodes"
    report = json.loads((run / "report.json").read_text()) if ok else {}
    return {"ok": ok, "run": str(run), "train_images_per_s": report.get("train_images_per_s")}


def killed(
    work: Path, two_agents: bool, reference: Path, timeout: float, whole_agent: bool = False
) -> dict:
    """One rank SIGKILLed mid-checkpoint; ``whole_agent``: the second agent with its process
    (a node that dies), then the same command started again in its place (the replacement)."""
    cwd = work / ("killed-two-agents" if two_agents else "killed-one-agent")
    cwd = cwd.with_name(cwd.name + ("-whole" if whole_agent else ""))
    cwd.mkdir()
    agents = _launch(cwd, two_agents, restarts=True)
    ckpts = cwd / "runs" / "two-nodes" / "checkpoints"
    kill_at = writing = latest = None
    while kill_at is None and all(a.poll() is None for a in agents):
        tmp = sorted(ckpts.glob(".step_*.tmp-dcp")) if ckpts.is_dir() else []
        if tmp and (ckpts / "LATEST").is_file():
            workers = _children(agents[-1].pid)
            if workers:
                latest = (ckpts / "LATEST").read_text().strip()
                os.kill(workers[0], signal.SIGKILL)
                if whole_agent:
                    os.kill(agents[-1].pid, signal.SIGKILL)
                kill_at, writing = time.perf_counter(), tmp[0].name
        time.sleep(0.002)
    if kill_at is None:
        return {"ok": False, "why": "the run ended before a checkpoint write was seen"}
    if whole_agent:  # the node's replacement: the same command
        agents[-1].wait()
        with open(cwd / "agent-2.log", "wb") as log:
            agents[-1] = subprocess.Popen(
                agents[-1].args, cwd=cwd, env=_env(), stdout=log, stderr=subprocess.STDOUT
            )
    back = None
    deadline = kill_at + timeout
    while time.perf_counter() < deadline and any(a.poll() is None for a in agents):
        if back is None and "continuing the run from" in _logs(cwd):
            back = time.perf_counter() - kill_at
        time.sleep(0.05)
    for a in agents:
        if a.poll() is None:
            a.kill()
    codes = [a.wait() for a in agents]
    if back is None and "continuing the run from" in _logs(cwd):
        back = time.perf_counter() - kill_at
    ok = all(c == 0 for c in codes)
    written = int(re.findall(r"\d+", writing)[0])
    resumed = re.search(r"continuing the run from step_(\d+)", _logs(cwd))
    result = {
        "ok": ok,
        "exit_codes": codes,
        "killed_while_writing": writing,
        "latest_at_kill": latest,
        "seconds_to_training_again": back,
        "steps_lost": written - int(resumed.group(1)) if resumed else None,
    }
    if ok:
        result["bitwise_equal_to_unbroken"] = _bitwise(
            _weights(cwd / "runs" / "two-nodes"), _weights(reference)
        )
    else:
        found = re.findall(r"^\w*(?:Error|Exception): .*$", _logs(cwd), re.M)
        tail = [line.split(" (0x")[0] for line in found][-3:]  # (no library paths)
        result["errors"] = [line[:300] for line in tail]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/scale_faults")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a killed job may take")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one = unbroken(work, two_agents=False)
        two = unbroken(work, two_agents=True)
        equal = (
            one["ok"]
            and two["ok"]
            and _bitwise(_weights(Path(one["run"])), _weights(Path(two["run"])))
        )
        faults = {
            "one agent, 2 processes": killed(work, False, Path(one["run"]), args.timeout),
            "two agents, 1 process each": killed(work, True, Path(one["run"]), args.timeout),
            "two agents, one killed whole and started again": killed(
                work, True, Path(one["run"]), args.timeout, whole_agent=True
            ),
        }
    cpu = cpu_name()
    load = os.getloadavg()
    for r in (one, two):
        r.pop("run")  # (a temporary directory)
    result = {
        "cpu": cpu,
        "load_avg": load,
        "command": " ".join(doc_command()),
        "one_agent": one,
        "two_agents": two,
        "two_agents_bitwise_equal_one_agent": equal,
        "faults": faults,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    ratio = two["train_images_per_s"] / one["train_images_per_s"] if equal else float("nan")
    lines = [
        "# Two nodes on one machine, and a rank killed mid-checkpoint",
        "",
        f"`python bench/scale_faults.py` on {cpu}, load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} (a shared host: one run each, times are indicative). The command: "
        "docs/distributed.md's two-node example (digits, a 2-block width-32 ViT, 40 steps of "
        "batch 32, gloo, a checkpoint every 5 steps).",
        "",
        "| | two agents x 1 process | one agent x 2 processes |",
        "| --- | --- | --- |",
        f"| train images/s | {two['train_images_per_s'] or 0:.0f} | "
        f"{one['train_images_per_s'] or 0:.0f} |",
        f"| final weights | {'bitwise equal' if equal else 'DIFFERENT'} | (reference) |",
        f"| throughput ratio | {ratio:.2f}x | 1.00x |",
        "",
        "A rank SIGKILLed while it writes a checkpoint, `--max-restarts 1`, `--resume auto`:",
        "",
        "| job | restarted and finished | bitwise equal to unbroken | kill -> training again "
        "| steps lost |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, f in faults.items():
        back = f.get("seconds_to_training_again")
        lines.append(
            f"| {name} | {'yes' if f['ok'] else 'no'} | "
            f"{ {True: 'yes', False: 'NO', None: '-'}[f.get('bitwise_equal_to_unbroken')] } | "
            f"{f'{back:.1f} s' if back else '-'} | {f.get('steps_lost', '-')} |"
        )
    for name, f in faults.items():
        if not f["ok"]:
            lines += ["", f"{name}: " + "; ".join(f.get("errors", [f.get("why", "")]))]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
