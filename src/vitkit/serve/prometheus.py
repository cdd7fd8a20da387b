"""The server's counters as Prometheus text (exposition format 0.0.4): requests by route and
status, latency histograms, images per forward, queue depth and requests in flight.

Under ``vitkit serve --workers N`` each worker publishes its counters as a small JSON file
(written atomically, at most every :data:`PUBLISH_S` seconds and at each scrape it answers) in a
directory its supervisor made; a scrape, whichever worker answers it, sums every file: counters
and histograms over every worker that ever ran (a dead worker's last file is kept, renamed
``dead-PID.json``, so no counter goes backwards when a worker is replaced), gauges over the
living ones. A request costs nothing more: the files are written by a thread, not per request.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitkit.serve.admission import REASONS

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The reasons for which a refused request means the server is shedding load (/ready: 503).
SHEDDING = ("queue_full", "deadline", "body_memory", "decode_time")
PUBLISH_S = 0.1  # a worker's counters reach the other workers' scrapes within this


def live_file(directory: str | Path, pid: int) -> Path:
    return Path(directory) / f"worker-{pid}.json"


def retire(directory: str | Path, pid: int) -> None:
    """A dead worker's counters, kept for every later scrape (its gauges no longer count)."""
    with contextlib.suppress(FileNotFoundError):  # (it died before it published anything)
        os.replace(live_file(directory, pid), Path(directory) / f"dead-{pid}.json")


class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bucket
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for bound, n in zip((*self.buckets, float("inf")), self.counts):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
        braces = f"{{{labels}}}" if labels else ""  # (the sum as it is: repr round-trips)
        out += [f"{name}_sum{braces} {self.total!r}", f"{name}_count{braces} {running}"]
        return out


class Metrics:
    """What ``GET /metrics`` reports; ``queue_depth`` and ``info`` are read when rendered."""

    def __init__(self, info: dict[str, str], queue_depth: Callable[[], int]):
        self.info = info
        self.queue_depth = queue_depth
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.forward_seconds = Histogram(LATENCY_BUCKETS)
        self.in_flight = 0
        self.dropped = dict.fromkeys(REASONS, 0)  # requests given up before the forward
        self.abandoned = 0  # images computed for a request already gone
        self.decodes_stopped = {"time": 0, "memory": 0}  # decode processes killed, by limit
        self.last_shed = -float("inf")  # time.monotonic() a request was last refused for load
        self.queue = 0  # (a sum's queue depth: see _summed)
        self.shared: Path | None = None  # --workers: the directory every worker publishes to
        self.published = ""
        # --workers: the model processes' counters (index, pid, forwards, images, restarts)
        self.processes: Callable[[], list[dict[str, Any]]] | None = None

    def share(self, directory: str | Path) -> None:
        """Publish to ``directory`` (a thread, every :data:`PUBLISH_S` s) and render the sum
        of every worker's file there."""
        self.shared = Path(directory)
        self.publish()
        threading.Thread(target=self._publishing, name="vitkit-metrics", daemon=True).start()

    def _publishing(self) -> None:
        while True:
            time.sleep(PUBLISH_S)
            try:
                self.publish()
            except OSError:  # (the supervisor removed the directory: the server stops)
                return

    def publish(self) -> None:
        """This worker's counters to its file, atomically, where they changed."""
        if self.shared is None:
            return
        text = json.dumps(self.state())
        if text == self.published:
            return
        path = live_file(self.shared, os.getpid())
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        self.published = text

    def state(self) -> dict[str, Any]:
        """Every counter, histogram and gauge, as JSON-able values."""
        with self.lock:
            return {
                "requests": [[r, s, n] for (r, s), n in self.requests.items()],
                "latency": {r: [list(h.counts), h.total] for r, h in self.latency.items()},
                "batch": [list(self.batch_size.counts), self.batch_size.total],
                "forward": [list(self.forward_seconds.counts), self.forward_seconds.total],
                "dropped": dict(self.dropped),
                "abandoned": self.abandoned,
                "decodes_stopped": dict(self.decodes_stopped),
                "in_flight": self.in_flight,
                "queue": self.queue_depth(),
            }

    def _add(self, state: dict[str, Any], gauges: bool) -> None:
        for route, status, n in state["requests"]:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + n
        for route, (counts, total) in state["latency"].items():
            _add_histogram(self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)),
                           counts, total)  # fmt: skip
        _add_histogram(self.batch_size, *state["batch"])
        _add_histogram(self.forward_seconds, *state["forward"])
        for k, n in state["dropped"].items():
            self.dropped[k] = self.dropped.get(k, 0) + n
        self.abandoned += state["abandoned"]
        for k, n in state["decodes_stopped"].items():
            self.decodes_stopped[k] = self.decodes_stopped.get(k, 0) + n
        if gauges:
            self.in_flight += state["in_flight"]
            self.queue += state["queue"]

    def _summed(self) -> Metrics:
        """Every worker's published counters added up (this one's published first)."""
        assert self.shared is not None
        self.publish()
        total = Metrics(self.info, lambda: total.queue)
        total.dropped = dict.fromkeys(self.dropped, 0)
        total.decodes_stopped = dict.fromkeys(self.decodes_stopped, 0)
        for name in sorted(os.listdir(self.shared)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = self.shared / name
            try:
                text = path.read_text()
            except FileNotFoundError:  # retired meanwhile: read under its new name
                name = name.replace("worker-", "dead-")
                try:
                    text = (self.shared / name).read_text()
                except FileNotFoundError:
                    continue
            total._add(json.loads(text), gauges=name.startswith("worker-"))
        return total

    def request_done(self, route: str, status: int | str, seconds: float) -> None:
        with self.lock:
            key = (route, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def request_dropped(self, reason: str) -> None:
        with self.lock:
            self.dropped[reason] += 1
            if reason in SHEDDING:
                self.last_shed = time.monotonic()

    def images_abandoned(self, images: int) -> None:
        with self.lock:
            self.abandoned += images

    def decode_stopped(self, limit: str) -> None:
        with self.lock:
            self.decodes_stopped[limit] += 1

    def batch_done(self, size: int, seconds: float) -> None:
        with self.lock:
            self.batch_size.observe(size)
            self.forward_seconds.observe(seconds)

    def render(self) -> str:
        if self.shared is not None:
            try:
                return self._summed()._render()
            except OSError:  # (the supervisor removed the directory: the server is stopping)
                pass
        return self._render()

    def _render(self) -> str:
        with self.lock:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in self.info.items())
            lines = [
                "# HELP vitkit_model_info The model served, its engine and precision.",
                "# TYPE vitkit_model_info gauge",
                f"vitkit_model_info{{{labels}}} 1",
                "# HELP vitkit_requests_total HTTP requests answered, by route and status "
                '(status="disconnected": the client left first).',
                "# TYPE vitkit_requests_total counter",
            ]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'vitkit_requests_total{{route="{route}",status="{status}"}} {n}')
            lines += [
                "# HELP vitkit_request_seconds Time from a request's arrival to its answer.",
                "# TYPE vitkit_request_seconds histogram",
            ]
            for route, h in sorted(self.latency.items()):
                lines += h.lines("vitkit_request_seconds", f'route="{route}"')
            lines += [
                "# HELP vitkit_batch_images Images per forward (requests of several clients "
                "share one).",
                "# TYPE vitkit_batch_images histogram",
                *self.batch_size.lines("vitkit_batch_images"),
                "# HELP vitkit_forward_seconds Time of one batched forward.",
                "# TYPE vitkit_forward_seconds histogram",
                *self.forward_seconds.lines("vitkit_forward_seconds"),
                "# HELP vitkit_queue_images Images waiting for a forward.",
                "# TYPE vitkit_queue_images gauge",
                f"vitkit_queue_images {self.queue_depth()}",
                "# HELP vitkit_requests_in_flight Requests received and not yet answered.",
                "# TYPE vitkit_requests_in_flight gauge",
                f"vitkit_requests_in_flight {self.in_flight}",
                "# HELP vitkit_requests_dropped_total Requests given up before their forward, "
                "by reason: " + "; ".join(f"{k}: {v}" for k, v in REASONS.items()) + ".",
                "# TYPE vitkit_requests_dropped_total counter",
                *(f'vitkit_requests_dropped_total{{reason="{k}"}} {n}'
                  for k, n in self.dropped.items()),
                "# HELP vitkit_images_abandoned_total Images computed although their request "
                "had gone meanwhile (its client left during the forward).",
                "# TYPE vitkit_images_abandoned_total counter",
                f"vitkit_images_abandoned_total {self.abandoned}",
                "# HELP vitkit_decodes_stopped_total Image decodes stopped at a limit, their "
                "process killed and replaced: time (the request's deadline), memory (its grant "
                "of --max-decode-memory).",
                "# TYPE vitkit_decodes_stopped_total counter",
                *(f'vitkit_decodes_stopped_total{{limit="{k}"}} {n}'
                  for k, n in self.decodes_stopped.items()),
            ]  # fmt: skip
            if self.processes is not None:
                lines += _process_lines(self.processes())
        return "\n".join(lines) + "\n"


def _process_lines(stats: list[dict[str, Any]]) -> list[str]:
    """The model processes of ``--workers``: images and forwards each ran, its restarts."""
    lines = []
    for name, key, what in (
        ("images", "images", "Images each model process computed"),
        ("forwards", "forwards", "Forwards each model process ran"),
        ("restarts", "restarts", "Times each model process died and was started again"),
    ):
        lines += [
            f"# HELP vitkit_model_process_{name}_total {what}.",
            f"# TYPE vitkit_model_process_{name}_total counter",
            *(f'vitkit_model_process_{name}_total{{process="{s["process"]}"}} {s[key]}'
              for s in stats),
        ]  # fmt: skip
    lines += [
        "# HELP vitkit_model_process_given_up Whether each model process's slot was given up "
        "(it failed to start too many times in a row: not started again).",
        "# TYPE vitkit_model_process_given_up gauge",
        *(f'vitkit_model_process_given_up{{process="{s["process"]}"}} '
          f'{int(s.get("state") == "given up")}' for s in stats),
        "# HELP vitkit_model_process_ready Whether each model process is ready to serve.",
        "# TYPE vitkit_model_process_ready gauge",
        *(f'vitkit_model_process_ready{{process="{s["process"]}"}} '
          f'{int(s.get("state") == "ready")}' for s in stats),
    ]  # fmt: skip
    return lines


def _add_histogram(h: Histogram, counts: list[int], total: float) -> None:
    h.counts = [a + b for a, b in zip(h.counts, counts)]
    h.total += total


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
