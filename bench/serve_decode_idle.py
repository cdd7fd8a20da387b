"""The memory `vitkit serve` holds at idle, by process: the server, the decode fork server and
the decode processes forked from it (--decode-workers 2), as PSS (a page that processes
share counts once across them), and whether each has PyTorch's library mapped. The server is
started as a deployment starts it (the `vitkit` script), once per round for each source
tree given (the current one, and a baseline's `src` with --baseline), in alternating order.

    python bench/serve_decode_idle.py --rounds 3 --baseline ../baseline/src
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_http import ROOT, start_server  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(ROOT / "src"))


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def roles(server: int) -> dict[str, list[int]]:
    """The server's process tree by role: the server, the fork server, the decode processes
    (the fork server's children) and any other helper process (multiprocessing's resource
    tracker)."""
    found: dict[str, list[int]] = {"server": [server], "fork server": [], "decode": [],
                                   "other": []}  # fmt: skip
    for child in children(server):
        cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"forkserver" in cmd:
            found["fork server"].append(child)
            found["decode"] += children(child)
        else:
            found["other"].append(child)
    return found


def measure(ckpt: Path, src: Path, settle: float) -> dict[str, Any]:
    script = Path(sys.executable).parent / "vitkit"
    argv = [str(script), "serve", str(ckpt), "--port", "0", "--precision", "fp32",
            "--decode-workers", "2"]  # fmt: skip
    proc, _ = start_server(argv, env={"PYTHONPATH": str(src)})
    try:
        time.sleep(settle)
        by_role = roles(proc.pid)
        row: dict[str, Any] = {}
        for role, pids in by_role.items():
            row[f"{role} processes"] = len(pids)
            row[f"{role} PSS MB"] = round(sum(pss_mb(p) for p in pids), 1)
            row[f"{role} maps libtorch"] = any(
                "libtorch" in Path(f"/proc/{p}/maps").read_text() for p in pids
            )
        row["tree PSS MB"] = round(sum(row[f"{r} PSS MB"] for r in by_role), 1)
        return row
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after ready")
    ap.add_argument("--baseline", help="another tree's src directory, measured alongside")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_decode_idle"))
    args = ap.parse_args()
    from bench_models import mnist_checkpoint

    from vitkit.hardware import cpu_name

    ckpt = mnist_checkpoint(Path(tempfile.mkdtemp(prefix="decode-idle-")) / "mnist")
    trees = {"current": ROOT / "src"}
    if args.baseline:
        trees["baseline"] = Path(args.baseline)
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            rows[name].append(measure(ckpt, trees[name], args.settle))
            print(name, rows[name][-1], flush=True)
    keys = list(rows["current"][0])
    summary = {
        t: {k: (round(sum(x[k] for x in rs) / len(rs), 1) if "MB" in k else rs[0][k])
            for k in keys}
        for t, rs in rows.items()
    }  # fmt: skip
    record = {
        "cpu": cpu_name(),
        "load_average": os.getloadavg(),
        "model": "The default MNIST ViT, random weights, PyTorch fp32, --decode-workers 2",
        "rounds": args.rounds,
        "settle_s": args.settle,
        "command": "python bench/serve_decode_idle.py " + " ".join(sys.argv[1:]),
        "mean": summary,
        "runs": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    roles_ = ["server", "fork server", "decode", "other"]
    load = ", ".join(f"{x:.2f}" for x in record["load_average"])
    lines = [
        "# vitkit serve at idle: memory by process",
        "",
        f"CPU: {record['cpu']}; load average {load} at the end."
        f" {record['model']}; started as `vitkit serve CKPT --port 0 --precision "
        f"fp32 --decode-workers 2`, measured {args.settle:g} s after its ready line; PSS from "
        f"/proc/PID/smaps_rollup (a page processes share counts once across them), the mean of "
        f"{args.rounds} starts per tree, trees in alternating order.",
        "",
        f"Command: `{record['command']}`",
        "",
        "| tree | " + " | ".join(f"{r} PSS MB" for r in roles_) + " | tree PSS MB | "
        "processes (server, fork server, decode, other) | libtorch mapped in the fork server "
        "/ decode processes |",
        "| --- |" + " ---: |" * (len(roles_) + 2) + " --- |",
    ]
    for t, s in summary.items():
        counts = ", ".join(str(s[f"{r} processes"]) for r in roles_)
        torch_in = f"{s['fork server maps libtorch']} / {s['decode maps libtorch']}"
        lines.append(
            f"| {t} | " + " | ".join(str(s[f"{r} PSS MB"]) for r in roles_)
            + f" | {s['tree PSS MB']} | {counts} | {torch_in} |"
        )  # fmt: skip
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
