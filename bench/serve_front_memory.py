"""The memory of `vitkit serve --workers 2` (one front, two model processes) serving B/16 (random
weights), by process: the front, the model processes, the decode fork server and its decode
processes, and the rest (multiprocessing's resource tracker), as PSS (a page that processes
share counts once across them, so the tree's sum is what the machine holds). Each start serves
one /v1/classify and one /v1/explain request (so the explaining model has run), waits, and is
measured; the source trees given (the current one, a baseline's `src` with --baseline) start in
alternating order.

    git archive BASE src | tar -x -C ../baseline   # the code to compare with
    python bench/serve_front_memory.py --rounds 2 --baseline ../baseline/src
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_decode_idle import children, pss_mb  # noqa: E402
from serve_http import ROOT, start_server  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(ROOT / "src"))
ROLES = ["front", "model", "fork server", "decode", "other"]


def roles(front: int) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {r: [] for r in ROLES}
    found["front"].append(front)
    for child in children(front):
        cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"forkserver" in cmd:
            found["fork server"].append(child)
            found["decode"] += children(child)
        elif b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            found["model"].append(child)
        else:
            found["other"].append(child)
    return found


def image() -> bytes:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def post(port: int, path: str, body: bytes) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    with urllib.request.urlopen(req, timeout=600) as r:
        return int(r.status)


def measure(ckpt: Path, src: Path, precision: str, settle: float) -> dict[str, Any]:
    script = Path(sys.executable).parent / "vitkit"
    argv = [str(script), "serve", str(ckpt), "--port", "0", "--workers", "2",
            "--precision", precision, "--decode-workers", "2"]  # fmt: skip
    proc, port = start_server(argv, env={"PYTHONPATH": str(src)})
    try:
        png = image()
        assert post(port, "/v1/classify", png) == 200
        assert post(port, "/v1/explain", png) == 200
        time.sleep(settle)
        by_role = roles(proc.pid)
        row: dict[str, Any] = {}
        for role, pids in by_role.items():
            row[f"{role} processes"] = len(pids)
            row[f"{role} PSS MB"] = round(sum(pss_mb(p) for p in pids), 1)
        row["tree PSS MB"] = round(sum(row[f"{r} PSS MB"] for r in by_role), 1)
        return row
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the requests")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--baseline", help="another tree's src directory, measured alongside")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_front_memory"))
    args = ap.parse_args()
    from bench_models import b16_checkpoint

    from vitkit.hardware import cpu_name

    ckpt = b16_checkpoint(Path(tempfile.mkdtemp(prefix="front-memory-")) / "b16")
    trees = {"current": ROOT / "src"}
    if args.baseline:
        trees["baseline"] = Path(args.baseline)
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            rows[name].append(measure(ckpt, trees[name], args.precision, args.settle))
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
        "model": f"B/16 at 224 px, random weights, --precision {args.precision}",
        "rounds": args.rounds,
        "settle_s": args.settle,
        "command": "python bench/serve_front_memory.py " + " ".join(sys.argv[1:]),
        "mean": summary,
        "runs": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    load = ", ".join(f"{x:.2f}" for x in record["load_average"])
    lines = [
        "# vitkit serve --workers 2: memory by process (B/16)",
        "",
        f"CPU: {record['cpu']}; load average {load} at the end. {record['model']}; started "
        f"as `vitkit serve CKPT --port 0 --workers 2 --precision {args.precision} "
        "--decode-workers 2`, one /v1/classify and one /v1/explain request served, measured "
        f"{args.settle:g} s later; PSS from /proc/PID/smaps_rollup (a page processes share "
        f"counts once across them), the mean of {args.rounds} starts per tree, trees in "
        "alternating order.",
        "",
        f"Command: `{record['command']}`",
        "",
        "| tree | " + " | ".join(f"{r} PSS MB" for r in ROLES) + " | tree PSS MB | "
        "processes (front, model, fork server, decode, other) |",
        "| --- |" + " ---: |" * (len(ROLES) + 1) + " --- |",
    ]
    for t, s in summary.items():
        counts = ", ".join(str(s[f"{r} processes"]) for r in ROLES)
        lines.append(
            f"| {t} | " + " | ".join(str(s[f"{r} PSS MB"]) for r in ROLES)
            + f" | {s['tree PSS MB']} | {counts} |"
        )  # fmt: skip
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
