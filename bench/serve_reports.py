"""(part of serve_hostile.py) Its results files: the hostile set under load
(``--out NAME``: one row per server variant, then each hostile request's statuses and times)
and the decode bombs (``--decode-bombs --out NAME``), as bench/results/NAME.json and NAME.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def write_hostile(args: Any, runs: dict[str, dict[str, Any]]) -> None:
    import os
    import shlex

    from vitkit.hardware import cpu_name

    out = Path(__file__).resolve().parent / "results" / args.out
    command = "python bench/serve_hostile.py " + shlex.join(sys.argv[1:])
    load = [round(x, 2) for x in os.getloadavg()]
    meta = {"command": command, "cpu": cpu_name(), "load_average": load, "seconds": args.seconds}
    out.with_suffix(".json").write_text(json.dumps({**meta, "runs": runs}, indent=1) + "\n")
    lines = [
        "# The hostile set under load: `vitkit serve` (the MNIST model)",
        "",
        f"`{command}`; {meta['cpu']}; load average {load[0]:.1f} at the end (a shared host). "
        f"For {args.seconds:g} s each: 8 good clients (28 x 28 PNGs, keep-alive), every hostile "
        "request in turn again and again, 4 slowloris connections, and /health every 50 ms on "
        "a fresh connection from a process of its own (as a kubelet probes; 'in the client': "
        "the same probe from the load generator's event loop, its own waits included). RSS: "
        "the resident memory of the process the bench started (with `--workers`, the front or "
        "the workers' supervisor: not the processes it started).",
        "",
        "| server | good req/s | good failed | good p99 ms | /health p50 ms | /health p99 ms "
        "| /health max ms | /health p99 in the client ms | hostile as expected "
        "| RSS growth MB of the process started |",
        "| --- |" + " ---: |" * 7 + " --- | ---: |",
    ]
    for name, r in runs.items():
        g, hostile = r["good_clients"], r["hostile"]
        fine = sum(h["as_expected"] for h in hostile.values())
        lines.append(
            f"| {name} (`{r['serve_args'] or 'defaults'}`) | {g['requests_per_s']} | "
            f"{g['failed']} | {g['p99_ms']} | {r['health_p50_ms']} | {r['health_p99_ms']} | "
            f"{r['health_max_ms']} | {r['health_in_client_p99_ms']} | {fine} of "
            f"{len(hostile)} | {r['rss_growth_mb']} |"
        )
    for name, r in runs.items():
        lines += ["", f"## {name}: each hostile request", "",
                  "| request | expected | statuses | p50 ms | p99 ms |",
                  "| --- | --- | --- | ---: | ---: |"]  # fmt: skip
        for case, h in r["hostile"].items():
            got = ", ".join(f"{k} x {v}" for k, v in h["statuses"].items())
            lines.append(f"| {case} | {h['expected']} | {got} | {h['p50_ms']} | {h['p99_ms']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_bombs(args: Any, runs: dict[str, dict[str, Any]]) -> None:
    import os
    import shlex

    from vitkit.hardware import cpu_name

    out = Path(__file__).resolve().parent / "results" / args.out
    command = "python bench/serve_hostile.py " + shlex.join(sys.argv[1:])
    load = os.getloadavg()
    meta = {"command": command, "cpu": cpu_name(), "load_average": [round(x, 2) for x in load]}
    out.with_suffix(".json").write_text(json.dumps({**meta, "runs": runs}, indent=1) + "\n")
    lines = [
        "# Decode bombs under load: `vitkit serve` (the MNIST model, `--timeout 5`)",
        "",
        f"`{command}`; {meta['cpu']}; load average {load[0]:.1f} at the end (a shared host).",
        "Each case as 4 concurrent requests, one case after another, beside 8 good clients "
        "(28 x 28 PNGs) and a /health probe every 50 ms on a fresh connection from a process "
        "of its own (as a kubelet probes; 'in the client': the same probe from the load "
        "generator's event loop, its own waits included). Memory: the PSS of the server's "
        "whole process tree (the server, its fork server and decode processes), sampled "
        "every 50 ms.",
        "",
    ]
    for name, run in runs.items():
        g = run["good_clients"]
        lines += [
            f"## {name}",
            "",
            "| case | bytes | statuses | slowest answer (s) | within --timeout + 1 s |",
            "| --- | ---: | --- | ---: | --- |",
            *(f"| {c['case']} | {c['bytes']:,} | {', '.join(map(str, c['statuses']))} | "
              f"{c['max_s']} | {'yes' if c['within_timeout_plus_1s'] else 'no'} |"
              for c in run["cases"]),
            "",
            f"Good clients: {g['ok']:,} answered, {g['failed']} failed, {g['requests_per_s']} "
            f"req/s, p99 {g['p99_ms']} ms. /health p99 {run['health_p99_ms']} ms (max "
            f"{run['health_max_ms']}; in the client p99 "
            f"{run.get('health_in_client_p99_ms', '-')} ms). Process tree PSS "
            f"{run['tree_pss_idle_mb']} MB idle, "
            f"{run['tree_pss_peak_mb']} MB at its peak (+{run['tree_pss_growth_mb']} MB).",
            "",
        ]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines))
