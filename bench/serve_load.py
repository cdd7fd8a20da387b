"""`vitkit serve` under load and under faults, on localhost.

For each model (the default MNIST ViT and B/16 at 224 px, random weights) on the fastest
installed engine (`--fast`): 1, 8 and 64 concurrent clients for a fixed time each, every answer
checked against the image's own answer; requests/s, p50/p95/p99 latency, failures, the server's
resident memory after warm-up and at the end, and the same engine's in-process throughput at the
batch the load reaches (1, 8, 32 images), measured in this process between the load levels.
Then, on the first model, faults while 8 clients load it: malformed bodies, truncated JPEGs,
100 MB bodies, a real 20,000 x 20,000 PNG, clients that leave mid-request; and a SIGTERM under
load (every request sent before it must be answered, the server must exit 0).

    python bench/serve_load.py --models mnist,B/16 --seconds 20
    python bench/serve_load.py --models B/16,B/16:bf16,B/16:int8 --scenarios load
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import b16_checkpoint, mnist_checkpoint  # noqa: E402
from serve_http import ROOT, http, read_response, rss_mb, run_clients, start_server  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(ROOT / "src"))
MAX_BATCH = 32


def image_bytes(model: str, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    shape = (28, 28) if model == "mnist" else (256, 320, 3)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def engine_throughput(served: Any, batch: int, seconds: float) -> float:
    """Images/s of the server's own forward (normalise, engine, softmax) in this process."""
    import torch

    pre = served.ckpt.preprocess
    x = [torch.randint(0, 255, (pre.channels, *pre.image_size), dtype=torch.uint8)] * batch
    served.probabilities(x)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < 2:
        served.probabilities(x)
        n += 1
    return round(n * batch / (time.perf_counter() - start), 2)


def variant(spec: str, ckpt: Path) -> tuple[str, Path, list[str], float | None]:
    """``MODEL[:bf16|:int8]`` -> the model, what to serve, the extra serve options and the
    tolerance on an answer's probabilities. bf16: ``--precision bf16`` (``--fast`` then runs
    OpenVINO's bf16 where installed); int8: the engine directory ``vitkit export --int8``
    writes (ONNX Runtime's dynamic int8, no calibration data needed: its activation scales
    come from each batch, so an image's answer moves with the batch it shares, and on random
    weights, whose probabilities are nearly flat over 1,000 classes, its labels too: the int8
    rows' answers are checked for their form only, None)."""
    name, _, precision = spec.partition(":")
    if precision == "bf16":
        return name, ckpt, ["--precision", "bf16"], 2e-2
    if precision == "int8":
        out = ckpt.parent / f"{ckpt.name}-int8"
        if not out.exists():
            subprocess.run([sys.executable, "-m", "vitkit", "export", str(ckpt), str(out),
                            "--int8"], check=True, capture_output=True)  # fmt: skip
        return name, out, ["--precision", "auto"], None  # (an engine directory's own)
    return name, ckpt, ["--precision", "fp32"], 1e-4


def load_model(spec: str, ckpts: dict[str, Path], args: Any) -> dict[str, Any]:
    from vitkit.cli import build_parser
    from vitkit.cli.serve import served_model

    name, ckpt, extra, tol = variant(spec, ckpts[spec.partition(":")[0]])
    images = [image_bytes(name, s) for s in range(16)]
    proc, port = start_server(
        [
            "-m",
            "vitkit",
            "serve",
            str(ckpt),
            *extra,
            "--fast",
            "--port",
            "0",
            "--max-batch",
            str(MAX_BATCH),
            "--max-wait-ms",
            "5",
            "--timeout",
            "0",
        ]
    )  # fmt: skip  (no deadline: throughput)
    engine_line = next(line for line in proc.output if line.startswith("engine: ")).strip()
    try:
        expected = {}  # each image's answer, asked alone
        for i, data in enumerate(images):
            t = asyncio.run(run_clients(port, 1, 600, lambda _, d=data: req(d), max_requests=1))
            expected[i] = t.answers[0]
        # warm-up: every batch size the levels reach (1 to 32 images per forward)
        warm = asyncio.run(run_clients(port, 64, args.seconds / 2, lambda i: req(images[i % 16])))
        rss_start = rss_mb(proc.pid)
        argv = ["serve", str(ckpt), *extra, "--fast"]
        served = served_model(build_parser().parse_args(argv))
        rows = []
        for clients in args.clients:
            batch = min(clients, MAX_BATCH)

            def check(body: bytes, i: int) -> bool:
                return same_answer(json.loads(body), expected[i % 16], tol)

            t = asyncio.run(run_clients(port, clients, args.seconds, lambda i: req(images[i % 16]),
                                        check=check))  # fmt: skip
            s = t.summary()
            inproc = engine_throughput(served, batch, min(args.seconds, 10))
            s.update(clients=clients, engine_batch=batch, engine_images_per_s=inproc,
                     server_rss_mb=rss_mb(proc.pid),
                     server_vs_engine=round(s["requests_per_s"] / inproc, 3))  # fmt: skip
            print(f"{name} {clients:3d} clients: {s['requests_per_s']} req/s (engine in-process "
                  f"batch {batch}: {inproc} img/s, ratio {s['server_vs_engine']}), p50 "
                  f"{s['p50_ms']} p95 {s['p95_ms']} p99 {s['p99_ms']} ms, failed {s['failed']}",
                  flush=True)  # fmt: skip
            rows.append(s)
        del served
        rss_end = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {
        "model": spec,
        "engine": engine_line,
        "warm_up": warm.summary(),
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "rss_change": round(rss_end / rss_start - 1, 4),
        "rows": rows,
    }


def req(data: bytes) -> tuple[str, str, bytes, dict[str, str]]:
    return "POST", "/v1/classify", data, {"Content-Type": "image/png"}


def same_answer(got: dict[str, Any], want: dict[str, Any], tol: float | None = 1e-4) -> bool:
    a, b = got["results"][0]["top_k"], want["results"][0]["top_k"]
    if tol is None:  # (the form only: as many labels, probabilities in [0, 1])
        return len(a) == len(b) and all(0.0 <= q["prob"] <= 1.0 for q in a)
    return [q["index"] for q in a[:3]] == [q["index"] for q in b[:3]] and all(
        abs(p["prob"] - q["prob"]) < tol for p, q in zip(a, b)
    )


# -- faults -------------------------------------------------------------------------------


def huge_png(side: int) -> bytes:
    """A real, complete grey PNG of side x side pixels (black: it compresses to ~0.4 MB)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        import struct

        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    import struct

    z = zlib.compressobj(9)
    row = b"\0" * (side + 1)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


async def one(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        status, _, _ = await http(reader, writer, method, path, body, headers)
        return status
    finally:
        writer.close()


async def big_body(port: int, size: int) -> str:
    """Headers for ``size`` bytes, then the body in 1 MB pieces until the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
    writer.write((head + f"Content-Length: {size}\r\n\r\n").encode())
    try:
        piece = b"\0" * (1 << 20)
        for _ in range(size >> 20):
            writer.write(piece)
            await writer.drain()
            if reader.at_eof() or len(reader._buffer):  # type: ignore[attr-defined]
                break
        status, _, _ = await read_response(reader)
        return str(status)
    except (ConnectionError, OSError) as e:  # the server answered and closed while we sent
        try:
            status, _, _ = await read_response(reader)
            return str(status)
        except Exception:
            return f"closed: {type(e).__name__}"
    finally:
        writer.close()


async def leave(port: int, data: bytes, when: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    if when == "sending":
        writer.write(head.encode() + data[: len(data) // 2])
    else:  # the whole request, then gone before the answer
        writer.write(head.encode() + data)
    await writer.drain()
    writer.close()
    return "left"


async def faults(port: int, images: list[bytes], expected: dict[int, Any], seconds: float) -> Any:
    rng = random.Random(0)
    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes(
        "RGB", (256, 256), bytes(rng.randrange(256) for _ in range(256 * 256 * 3))
    ).save(buf, format="JPEG")
    jpeg = buf.getvalue()
    bomb = huge_png(20_000)
    kinds: dict[str, list[str]] = {}

    async def record(kind: str, coro: Any) -> None:
        try:
            out = await coro
        except Exception as e:
            out = f"client error {type(e).__name__}"
        kinds.setdefault(kind, []).append(str(out))

    def check(body: bytes, i: int) -> bool:
        return same_answer(json.loads(body), expected[i % 16])

    good = asyncio.create_task(
        run_clients(port, 8, seconds, lambda i: req(images[i % 16]), check=check)
    )
    bad: list[Any] = []
    for i in range(40):
        bad.append(
            record(
                "malformed body",
                one(port, "POST", "/v1/classify", rng.randbytes(rng.randrange(1, 5000)), {}),
            )
        )
        cut = jpeg[: rng.randrange(800, len(jpeg) - 10)]
        bad.append(record("truncated JPEG", one(port, "POST", "/v1/classify", cut, {})))
        bad.append(record("client leaves mid-body", leave(port, images[i % 16], "sending")))
        bad.append(
            record("client leaves before the answer", leave(port, images[i % 16], "waiting"))
        )
        if i % 8 == 0:
            bad.append(record("100 MB body", big_body(port, 100_000_000)))
            bad.append(
                record(
                    "20000x20000 PNG",
                    one(port, "POST", "/v1/classify", bomb, {"Content-Type": "image/png"}),
                )
            )
    rng.shuffle(bad)
    for coro in bad:  # spread over the load
        await asyncio.sleep(seconds / 2 / len(bad))
        asyncio.create_task(coro)
    tally = await good
    await asyncio.sleep(1)
    counts = {k: {s: v.count(s) for s in sorted(set(v))} for k, v in kinds.items()}
    return tally.summary(), counts, len(bomb)


async def sigterm_under_load(proc: Any, port: int, images: list[bytes]) -> dict[str, Any]:
    """8 clients; SIGTERM after 2 s; every request sent before the signal must be answered."""
    sent_before: list[str] = []
    after: list[str] = []
    signalled = [0.0]

    async def client(c: int) -> None:
        conn = None
        for i in range(10_000):
            start = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                status, _, keep = await http(*conn, *req(images[(c + i) % 16]))
                out = str(status)
                if not keep:
                    conn[1].close()
                    conn = None
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as e:
                out = type(e).__name__
                conn = None
                if signalled[0] and start > signalled[0]:
                    after.append(out)
                    return
            (sent_before if not signalled[0] or start < signalled[0] else after).append(out)
            if signalled[0] and time.perf_counter() - signalled[0] > 10:
                return

    task = asyncio.gather(*(client(c) for c in range(8)))
    await asyncio.sleep(2)
    signalled[0] = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    await task
    code = await asyncio.get_running_loop().run_in_executor(None, lambda: proc.wait(timeout=60))
    return {
        "sent_before_signal": {s: sent_before.count(s) for s in sorted(set(sent_before))},
        "sent_after_signal": {s: after.count(s) for s in sorted(set(after))},
        "exit_code": code,
    }


def fault_run(ckpt: Path, seconds: float) -> dict[str, Any]:
    images = [image_bytes("mnist", s) for s in range(16)]
    proc, port = start_server(
        ["-m", "vitkit", "serve", str(ckpt), "--precision", "fp32", "--fast", "--port", "0"]
    )
    try:
        expected = {}
        for i, data in enumerate(images):
            t = asyncio.run(run_clients(port, 1, 600, lambda _, d=data: req(d), max_requests=1))
            expected[i] = t.answers[0]
        rss_start = rss_mb(proc.pid)
        good, counts, bomb_bytes = asyncio.run(faults(port, images, expected, seconds))
        rss_end = rss_mb(proc.pid)
        after = asyncio.run(run_clients(port, 1, 600, lambda _: req(images[0]), max_requests=1))
        term = asyncio.run(sigterm_under_load(proc, port, images))
    finally:
        proc.kill()
    return {
        "good_clients_meanwhile": good,
        "faults": counts,
        "png_20000_bytes": bomb_bytes,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "served_after_the_faults": after.summary()["ok"] == 1,
        "sigterm": term,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mnist,B/16")
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_load"))
    ap.add_argument("--scenarios", default="load,faults,keep,workers,overload,hostile")
    ap.add_argument(
        "--baseline-src",
        type=Path,
        help="the src/ of the code to compare with (keep, overload), e.g. from git archive",
    )
    ap.add_argument(
        "--baseline-name",
        default="the code before admission control",
        help="what the baseline is, as the report names it (e.g. its commit)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (keep, workers)")
    ap.add_argument("--workers-models", default="mnist")
    ap.add_argument("--overload-model", default="B/16")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    scenarios = args.scenarios.split(",")
    from vitkit.hardware import cpu_name

    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    ckpts = {"mnist": mnist_checkpoint(work / "mnist"), "B/16": b16_checkpoint(work / "b16")}
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lscpu.splitlines())}
    record: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpu_family_model": f"family {fields.get('CPU family')}, model {fields.get('Model')}",
        "command": "python bench/serve_load.py "
        + " ".join(
            "BASELINE/src" if args.baseline_src and a == str(args.baseline_src) else a
            for a in sys.argv[1:]
        ),
        "seconds_per_level": args.seconds,
        "max_batch": MAX_BATCH,
        "models": [],
        "host": "shared with other work while it ran (2 vCPUs): compare the interleaved ratios",
    }
    if "load" in scenarios:
        for spec in args.models.split(","):
            record["models"].append(load_model(spec, ckpts, args))
    if "faults" in scenarios:
        print("faults under load (MNIST model)...", flush=True)
        record["faults"] = fault_run(ckpts["mnist"], args.seconds)
    record.update(scenario_runs(scenarios, ckpts, args))
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    Path(args.out + ".md").write_text(report(record))
    print(report(record))


def checker(name: str) -> Any:
    """port -> check(body, i): each of the 16 images asked alone first, then every answer to
    image i % 16 compared with its own."""
    images = [image_bytes(name, s) for s in range(16)]

    def on(port: int) -> Any:
        expected = {}
        for i, data in enumerate(images):
            t = asyncio.run(run_clients(port, 1, 600, lambda _, d=data: req(d), max_requests=1))
            expected[i] = t.answers[0]
        return lambda body, i: same_answer(json.loads(body), expected[i % 16])

    return on


def scenario_runs(scenarios: list[str], ckpts: dict[str, Path], args: Any) -> dict[str, Any]:
    import serve_scenarios as sc

    out: dict[str, Any] = {"baseline": args.baseline_name if args.baseline_src else None}
    mnist = [image_bytes("mnist", s) for s in range(16)]
    mnist_req = lambda i: req(mnist[i % 16])  # noqa: E731
    if "keep" in scenarios and args.baseline_src:
        print("keep: the MNIST model at 64 clients, this code and the baseline...", flush=True)
        out["keep"] = sc.keep(ckpts["mnist"], args.baseline_src, args.seconds, args.rounds,
                              mnist_req, checker("mnist"), mnist[0])  # fmt: skip
    if "workers" in scenarios:
        out["workers"] = []
        for name in args.workers_models.split(","):
            images = [image_bytes(name, s) for s in range(16)]
            clients = 64 if name == "mnist" else 8
            print(f"workers: {name}, 2 against 1, {clients} clients...", flush=True)
            make = lambda i, im=images: req(im[i % 16])  # noqa: E731
            w = sc.workers(ckpts[name], clients, args.seconds, args.rounds, make, checker(name),
                           images[0])  # fmt: skip
            out["workers"].append({"model": name, **w})
    if "overload" in scenarios:
        name = args.overload_model
        print(f"overload: {name} at 4x the clients it serves within 2 s...", flush=True)
        images = [image_bytes(name, s) for s in range(16)]
        out["overload"] = sc.overload(ckpts[name], name, args.baseline_src, args.seconds,
                                      images, checker(name))  # fmt: skip
    if "hostile" in scenarios:
        out["hostile"] = sc.hostile(ckpts["mnist"], args.seconds, mnist_req, checker("mnist"))
        if "skipped" in out["hostile"]:
            print(out["hostile"]["skipped"], flush=True)
    return out


def report(r: dict[str, Any]) -> str:
    from serve_scenarios import scenario_report

    parts = [load_report(r) if r["models"] else "# vitkit serve under load\n"]
    if "faults" in r:
        parts.append(fault_report(r))
    parts.append(scenario_report(r))
    return "\n".join(parts)


def load_report(r: dict[str, Any]) -> str:
    lines = [
        "# vitkit serve under load and faults",
        "",
        f"CPU: {r['cpu']}. Server and clients on the same machine "
        f"(localhost; the clients are one asyncio process). {r['seconds_per_level']:g} s per "
        f"level, batches of up to {r['max_batch']} images (5 ms wait), no deadline (`--timeout 0`: "
        "these levels measure throughput; the overload section below sheds load); every answer "
        "checked against the image's own answer (top-3 labels, probabilities to 1e-4; bf16 rows "
        "to 2e-2; the int8 rows, ONNX Runtime's dynamic int8 on random weights, for their form "
        "only: its scales come from each batch).",
        "",
        f"Command: `{r['command']}`",
        "",
        "| model | engine | clients | req/s | p50 ms | p95 ms | p99 ms | failed | engine "
        "in-process img/s (batch) | server / engine |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in r["models"]:
        for s in m["rows"]:
            lines.append(
                f"| {m['model']} | {m['engine'].removeprefix('engine: ')} | {s['clients']} | "
                f"{s['requests_per_s']} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} | "
                f"{s['failed']} | {s['engine_images_per_s']} ({s['engine_batch']}) | "
                f"{s['server_vs_engine']} |"
            )
    lines += [
        "",
        "Server resident memory (after a warm-up of 64 clients for half a level, "
        "then after each level):",
        "",
    ]
    for m in r["models"]:
        levels = ", ".join(f"{s['server_rss_mb']}" for s in m["rows"])
        lines.append(f"- {m['model']}: {m['rss_mb_start']} MB -> {levels} MB "
                     f"({100 * m['rss_change']:+.1f} % at the end)")  # fmt: skip
    return "\n".join(lines) + "\n"


def fault_report(r: dict[str, Any]) -> str:
    f = r["faults"]
    g = f["good_clients_meanwhile"]
    lines = [
        "## Faults under load (MNIST model, 8 good clients meanwhile)",
        "",
        f"Good clients: {g['ok']} right answers, {g['failed']} failed, p50 {g['p50_ms']} ms, "
        f"p99 {g['p99_ms']} ms. Resident memory {f['rss_mb_start']} -> {f['rss_mb_end']} MB. "
        f"The 20,000 x 20,000 PNG is a real file of {f['png_20000_bytes']:,} bytes. A request "
        f"after the faults answered: {f['served_after_the_faults']}.",
        "",
        "| fault | outcomes (count) |",
        "| --- | --- |",
    ]
    for kind, counts in f["faults"].items():
        lines.append(f"| {kind} | {', '.join(f'{k}: {v}' for k, v in counts.items())} |")
    t = f["sigterm"]
    lines += [
        "",
        f"SIGTERM under load (8 clients): requests sent before the signal: "
        f"{t['sent_before_signal']}; after it: {t['sent_after_signal']} (refused: the server "
        f"no longer accepts); exit code {t['exit_code']}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
