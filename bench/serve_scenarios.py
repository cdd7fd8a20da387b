"""(part of serve_load.py) Admission control, workers and the baseline, each on live servers:

- keep: the MNIST model at 64 clients, this code against a baseline source tree (the code
  before admission control), interleaved, with the bench's client and with wrk;
- workers: --workers 2 against --workers 1 (the CPUs shared out as threads), interleaved;
- overload: a model at 4x the clients it can serve within a 2 s deadline (its speed measured
  first): admitted requests' latency, 503s, wrong answers, and from /metrics the requests
  dropped before the forward and the images computed for nobody; the same clients against the
  baseline for contrast;
- hostile: the hostile-request set of bench/serve_hostile.py where that module is present.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from serve_http import Tally, rss_mb, run_clients, start_server

SERVE = ["-m", "vitkit", "serve", "--precision", "fp32"]  # (serve's default, auto: bf16 here)


def metrics(port: int) -> dict[str, float]:
    """/metrics as {name{labels}: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def stop(proc: Any) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


# -- wrk, an outside load generator (Debian's wrk) -----------------------------------------

WRK_SCRIPT = """
wrk.method = "POST"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "{ctype}"
done = function(summary, latency, requests)
  io.write(string.format(
    "JSON {{\\"requests\\": %d, \\"duration_us\\": %d, \\"non_2xx\\": %d, \\"socket_errors\\": %d, "
    .. "\\"p50_ms\\": %.2f, \\"p99_ms\\": %.2f}}\\n",
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


def wrk(port: int, clients: int, seconds: float, body: bytes, ctype: str = "image/png") -> Any:
    """req/s, p50/p99 and failures of wrk (one thread, ``clients`` connections) POSTing
    ``body`` to /v1/classify; None where wrk is not installed."""
    exe = shutil.which("wrk")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "body").write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT.format(body=Path(tmp) / "body", ctype=ctype))
        done = subprocess.run(
            [exe, "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--timeout", "30s",
             "-s", str(script), f"http://127.0.0.1:{port}/v1/classify"],
            capture_output=True, text=True, timeout=seconds + 120,
        )  # fmt: skip
    found = re.search(r"^JSON (.*)$", done.stdout, re.M)
    if not found:
        return {"error": (done.stdout + done.stderr)[-300:]}
    r = json.loads(found.group(1))
    ok = r["requests"] - r["non_2xx"]
    return {"requests_per_s": round(ok / (r["duration_us"] / 1e6), 2), "p50_ms": r["p50_ms"],
            "p99_ms": r["p99_ms"], "failed": r["non_2xx"] + r["socket_errors"]}  # fmt: skip


# -- interleaved comparisons ------------------------------------------------------------------


def interleaved(
    servers: dict[str, int], clients: int, seconds: float, rounds: int, make: Any, check: Any,
    body: bytes,
) -> dict[str, Any]:  # fmt: skip
    """Each server loaded in turn (the order flips every round) by the bench's client and by
    wrk; per server the runs and their medians."""
    runs: dict[str, dict[str, list[Any]]] = {k: {"client": [], "wrk": []} for k in servers}
    names = list(servers)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t = asyncio.run(run_clients(servers[name], clients, seconds, make, check=check))
            runs[name]["client"].append(t.summary())
            w = wrk(servers[name], clients, seconds, body)
            if w is not None:
                runs[name]["wrk"].append(w)
            print(f"  {name}: client {t.summary()['requests_per_s']} req/s, wrk "
                  f"{w and w.get('requests_per_s')} req/s", flush=True)  # fmt: skip
    out: dict[str, Any] = {}
    for name, got in runs.items():
        out[name] = {
            "client_runs": got["client"],
            "wrk_runs": got["wrk"],
            "client_req_s": round(statistics.median(s["requests_per_s"] for s in got["client"]), 2),
            "client_failed": sum(s["failed"] for s in got["client"]),
            "wrk_req_s": round(statistics.median(w["requests_per_s"] for w in got["wrk"]), 2)
            if got["wrk"] and all("requests_per_s" in w for w in got["wrk"]) else None,
        }  # fmt: skip
    return out


def keep(ckpt: Path, baseline_src: Path, seconds: float, rounds: int, req: Any, checker: Any,
         body: bytes) -> dict[str, Any]:  # fmt: skip
    """The MNIST model at 64 clients: this code against the baseline, interleaved."""
    args = [*SERVE, str(ckpt), "--fast", "--port", "0", "--max-batch", "32", "--max-wait-ms", "5"]
    new, new_port = start_server(args)
    old, old_port = start_server(args, env={"PYTHONPATH": str(baseline_src)})
    try:
        check = checker(new_port)
        out = interleaved({"this code": new_port, "baseline": old_port}, 64, seconds, rounds,
                          req, check, body)  # fmt: skip
    finally:
        stop(new)
        stop(old)
    for kind in ("client_req_s", "wrk_req_s"):
        a, b = out["this code"][kind], out["baseline"][kind]
        out[f"ratio_{kind}"] = round(a / b, 3) if a and b else None
    return out


def workers(ckpt: Path, clients: int, seconds: float, rounds: int, req: Any, checker: Any,
            body: bytes) -> dict[str, Any]:  # fmt: skip
    """--workers 2 (a thread each on 2 CPUs) against --workers 1 (2 threads), interleaved."""
    base = [*SERVE, str(ckpt), "--fast", "--port", "0", "--max-batch", "32", "--max-wait-ms", "5"]
    one, one_port = start_server([*base, "--workers", "1"])
    two, two_port = start_server([*base, "--workers", "2"])
    try:
        check = checker(one_port)
        out = interleaved({"1 worker": one_port, "2 workers": two_port}, clients, seconds,
                          rounds, req, check, body)  # fmt: skip
        out["rss_mb"] = {"1 worker": rss_mb(one.pid, children=True),
                         "2 workers": rss_mb(two.pid, children=True)}  # fmt: skip
        out["threads"] = [ln.strip() for ln in two.output if ln.startswith("starting ")]
    finally:
        stop(one)
        stop(two)
    for kind in ("client_req_s", "wrk_req_s"):
        a, b = out["2 workers"][kind], out["1 worker"][kind]
        out[f"ratio_{kind}"] = round(a / b, 3) if a and b else None
    out["clients"] = clients
    return out


# -- overload ------------------------------------------------------------------------------


async def exchange(port: int, body: bytes, timeout: float) -> tuple[str, float, bytes, float]:
    """One request on its own connection: (status or 'timeout'/error, seconds, body,
    Retry-After seconds)."""
    start = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        writer.write(head.encode() + body)
        raw = await asyncio.wait_for(reader.read(), timeout)
    except asyncio.TimeoutError:  # the client gives up and closes
        return "timeout", time.perf_counter() - start, b"", 0.0
    except OSError as e:
        return type(e).__name__, time.perf_counter() - start, b"", 0.0
    finally:
        if writer is not None:
            writer.close()
    took = time.perf_counter() - start
    head, _, answer = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode() if head else "closed"
    retry = re.search(rb"(?im)^retry-after:\s*(\d+)", head)
    return status, took, answer, float(retry.group(1)) if retry else 0.0


async def overload_clients(port: int, clients: int, seconds: float, images: list[bytes],
                           check: Any, deadline: float) -> dict[str, Any]:  # fmt: skip
    """Closed-loop clients that give up at the deadline plus a second and wait Retry-After
    (at most 2 s) after a 503."""
    tally = Tally()
    refused: list[float] = []
    end = time.perf_counter() + seconds

    async def client(c: int) -> None:
        i = 0
        while time.perf_counter() < end:
            i += 1
            k = (c * 7 + i) % len(images)
            status, took, body, retry = await exchange(port, images[k], deadline + 1)
            tally.count(status)
            if status == "200":
                if check(body, k):
                    tally.latencies.append(took)
                else:
                    tally.errors.append("wrong answer")
            elif status == "503":
                refused.append(took)
                await asyncio.sleep(min(max(retry, 0.2), 2.0))

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    tally.seconds = time.perf_counter() - start
    s = tally.summary()
    s["wrong_answers"] = tally.errors.count("wrong answer")
    s["admitted_within_deadline"] = sum(t <= deadline for t in tally.latencies)
    s["refusal_p99_ms"] = round(sorted(refused)[int(0.99 * (len(refused) - 1))] * 1000, 1) \
        if refused else None  # fmt: skip
    return s


def overload(ckpt: Path, name: str, baseline_src: Path | None, seconds: float, images: list[bytes],
             checker: Any, deadline: float = 2.0) -> dict[str, Any]:  # fmt: skip
    """``name`` at 4x the clients it serves within ``deadline``: its speed measured with 4
    clients first (capacity: the clients whose closed-loop latency stays within the deadline,
    floor(deadline x images/s)); then 4x that many."""
    batch = 8
    args = [*SERVE, str(ckpt), "--fast", "--port", "0", "--max-batch", str(batch),
            "--max-wait-ms", "5"]  # fmt: skip
    admission = ["--timeout", f"{deadline:g}", "--max-queue", str(batch),
                 "--max-images", str(batch)]  # fmt: skip
    out: dict[str, Any] = {"model": name, "deadline_s": deadline, "max_batch": batch}
    proc, port = start_server([*args, *admission])
    try:
        check = checker(port)
        calib = asyncio.run(overload_clients(port, 4, seconds, images, check, 60))
        speed = calib["ok"] / calib["seconds"]
        capacity = min(max(1, math.floor(deadline * speed)), 64)  # (a fast model: 256 clients)
        out.update(calibration=calib, images_per_s=round(speed, 2), capacity_clients=capacity,
                   clients=4 * capacity, server_args=admission)  # fmt: skip
        print(f"  {name}: {speed:.2f} img/s -> serves {capacity} clients within {deadline:g} s;"
              f" loading with {4 * capacity}", flush=True)  # fmt: skip
        before = metrics(port)
        out["this code"] = asyncio.run(
            overload_clients(port, 4 * capacity, seconds * 2, images, check, deadline)
        )
        time.sleep(deadline + 1)  # what the last clients left behind settles
        out["this code"]["metrics"] = delta(before, metrics(port))
    finally:
        stop(proc)
    if baseline_src is not None:
        proc, port = start_server(args, env={"PYTHONPATH": str(baseline_src)})
        try:
            before = metrics(port)
            out["baseline"] = asyncio.run(
                overload_clients(port, 4 * capacity, seconds * 2, images, check, deadline)
            )
            time.sleep(deadline + 1)
            out["baseline"]["metrics"] = delta(before, metrics(port))
        finally:
            stop(proc)
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    keep = ("vitkit_batch_images_sum", "vitkit_images_abandoned_total")
    out = {}
    for k, v in after.items():
        if (
            k in keep
            or k.startswith("vitkit_requests_dropped_total")
            or (k.startswith("vitkit_requests_total") and "classify" in k)
        ):
            out[k] = v - before.get(k, 0.0)
    return out


# -- the hostile set (bench/serve_hostile.py, where present) -------------------------------


def hostile(ckpt: Path, seconds: float, req: Any, checker: Any) -> dict[str, Any]:
    """``serve_hostile.run(port=, seconds=, good_request=, check=, server_pid=) -> dict`` on the
    MNIST model's server, where bench/serve_hostile.py is present."""
    try:
        module = importlib.import_module("serve_hostile")
    except ImportError:
        return {"skipped": "bench/serve_hostile.py is not present: the hostile set did not run"}
    run = getattr(module, "run", None)
    if run is None:
        return {"skipped": "bench/serve_hostile.py has no run(port=, seconds=, good_request=, "
                "check=, server_pid=): the hostile set did not run"}  # fmt: skip
    proc, port = start_server([*SERVE, str(ckpt), "--fast", "--port", "0"])
    try:
        return dict(run(port=port, seconds=seconds, good_request=req, check=checker(port),
                        server_pid=proc.pid))  # fmt: skip
    finally:
        stop(proc)


# -- the report ------------------------------------------------------------------------------


def _cmp_table(out: dict[str, Any], names: list[str]) -> list[str]:
    lines = [
        "| server | bench client req/s (runs) | failed | wrk req/s (runs) | wrk p99 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in names:
        o = out[name]
        runs = ", ".join(str(s["requests_per_s"]) for s in o["client_runs"])
        wruns = ", ".join(str(w.get("requests_per_s")) for w in o["wrk_runs"]) or "no wrk"
        wp99 = ", ".join(str(w.get("p99_ms")) for w in o["wrk_runs"]) or "-"
        lines.append(f"| {name} | {o['client_req_s']} ({runs}) | {o['client_failed']} | "
                     f"{o['wrk_req_s']} ({wruns}) | {wp99} |")  # fmt: skip
    return lines


def scenario_report(r: dict[str, Any]) -> str:
    lines: list[str] = []
    if "keep" in r:
        k = r["keep"]
        lines += [
            f"## The MNIST model at 64 clients: this code against {r['baseline']}",
            "",
            "Both servers up at once (`--fast`, batches of 32, 5 ms), loaded in turn, the order "
            "flipping every round; each answer of the bench's client checked; wrk (one thread, "
            "64 connections, the same PNG) beside it.",
            "",
            *_cmp_table(k, ["this code", "baseline"]),
            "",
            f"This code / baseline: {k['ratio_client_req_s']} (bench client), "
            f"{k['ratio_wrk_req_s']} (wrk).",
            "",
        ]
    for w in r.get("workers", []):
        lines += [
            f"## `--workers 2` against `--workers 1`: {w['model']}, {w['clients']} clients",
            "",
            f"{'; '.join(w['threads'])} (`--workers 1`: one process, PyTorch's and the "
            f"engine's threads on both CPUs). Both up at once, loaded in turn.",
            "",
            *_cmp_table(w, ["1 worker", "2 workers"]),
            "",
            f"2 workers / 1 worker: {w['ratio_client_req_s']} (bench client), "
            f"{w['ratio_wrk_req_s']} (wrk). Resident memory, all processes: "
            f"{w['rss_mb']['1 worker']} MB (1 worker), {w['rss_mb']['2 workers']} MB (2).",
            "",
        ]
    if "overload" in r:
        o = r["overload"]
        lines += [
            f"## Overload: {o['model']} at 4x the clients it serves within {o['deadline_s']:g} s",
            "",
            f"Its speed first, 4 clients on the same server: {o['images_per_s']} images/s, so "
            f"{o['capacity_clients']} closed-loop clients are what it answers within "
            f"{o['deadline_s']:g} s (floor(deadline x images/s)); then {o['clients']} clients "
            f"for {2 * r['seconds_per_level']:g} s, each on a new connection, giving up "
            f"after {o['deadline_s'] + 1:g} s, waiting `Retry-After` (at most 2 s) after a "
            f"503. This code runs with `{' '.join(o['server_args'])}`, batches of "
            f"{o['max_batch']}; the baseline with the same batching and no admission control.",
            "",
            "| server | answered 200 | p50 ms | p99 ms | within the deadline | 503 | client "
            "gave up | wrong answers | images computed | computed, never received |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name in ("this code", "baseline"):
            if name not in o:
                continue
            s, m = o[name], o[name]["metrics"]
            computed = int(m.get("vitkit_batch_images_sum", 0))
            st = s["statuses"]
            lines.append(
                f"| {name} | {s['ok']} | {s['p50_ms']} | {s['p99_ms']} | "
                f"{s['admitted_within_deadline']} | {st.get('503', 0)} | "
                f"{st.get('timeout', 0)} | {s['wrong_answers']} | {computed} | "
                f"{computed - s['ok'] - s['wrong_answers']} |"
            )
        mine = o["this code"]["metrics"]
        dropped = {k.split('"')[1]: int(v) for k, v in mine.items() if "dropped" in k}
        lines += [
            "",
            f"This code's /metrics over the run: requests dropped before the forward "
            f"{dropped}; images computed for a request already gone "
            f"(`vitkit_images_abandoned_total`): "
            f"{int(mine.get('vitkit_images_abandoned_total', 0))}. A 503 came back in "
            f"{o['this code']['refusal_p99_ms']} ms at the 99th percentile.",
            "",
        ]
    if "hostile" in r:
        h = r["hostile"]
        lines += ["## Hostile requests under load", ""]
        if "skipped" in h:
            lines += [h["skipped"] + ".", ""]
        else:
            lines += ["```json", json.dumps(h, indent=1), "```", ""]
    return "\n".join(lines)
