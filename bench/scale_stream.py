"""Shards streamed from object storage against the same shards on local disk: images/s.

Starts a local S3 server (moto's server mode, over HTTP on loopback), writes the same shards
twice with ``vitkit shards`` (a local directory and ``s3://bench/NAME/``) and trains from each,
interleaved round by round, reading ``train_images_per_s`` from the run's report (the whole
training loop, fetching included): the default MNIST model on MNIST, and Ti/16 at 224 px on
synthetic 500x375 JPEGs (bench/data_pipeline.py's). Also the data pipeline alone (decoded +
augmented images/s, the training process reading, no model) and the read-ahead's memory
bound, (read_ahead + 1) x the largest shard, per DataLoader worker.

    python bench/scale_stream.py --rounds 2 --out bench/results/scale_stream
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from data_pipeline import write_jpeg_folder  # noqa: E402

from vitkit.data import load_dataset, make_loader  # noqa: E402

MODELS = {
    # name: (shards source, train options, steps)
    "mnist": ("mnist", ["--recipe", "mnist"], 40),
    "Ti/16@224": ("jpegs", ["--model", "Ti/16", "--image-size", "224", "--batch-size", "32"], 8),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu() -> str:
    from scale_faults import cpu_name

    return cpu_name()


def _train(data: str, options: list[str], steps: int, out: Path, threads: int) -> float:
    cmd = [sys.executable, "-m", "vitkit", "train", "--data", data, *options, "--no-progress"]
    cmd += ["--max-steps", str(steps), "--epochs", "1", "--threads", str(threads)]
    cmd += ["--num-workers", "1", "--out-dir", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=3600)
    return float(json.loads((out / "report.json").read_text())["train_images_per_s"])


def _pipeline(data: str, batches: int) -> float:
    dataset = load_dataset(data, "train")
    loader = make_loader(dataset, 64, shuffle=True, drop_last=True, seed=0)
    start, n = time.perf_counter(), 0
    for i, (images, _, _) in enumerate(loader):
        n += len(images)
        if i + 1 == batches:
            break
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default="bench/results/scale_stream")
    args = ap.parse_args()
    port = _free_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows = []
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_jpeg_folder(work / "jpegs", 512, 4, (500, 375), 0)
            for name in args.models.split(","):
                source, options, steps = MODELS[name]
                src = str(work / "jpegs") if source == "jpegs" else source
                local, url = work / f"shards-{source}", f"s3://bench/{source}/"
                for dst in (str(local), url):
                    if not Path(dst).exists() or dst == url:
                        shard = ["--shard-size", "2000", "--splits", "train,test"]
                        cmd = [sys.executable, "-m", "vitkit", "shards", src, dst, *shard]
                        subprocess.run([*cmd, "--overwrite"], check=True, capture_output=True)
                index = json.loads((local / "shards.json").read_text())
                biggest = max(e["bytes"] for e in index["splits"]["train"])
                train: dict[str, list[float]] = {"disk": [], "s3": []}
                pipe: dict[str, list[float]] = {"disk": [], "s3": []}
                for r in range(args.rounds):
                    for where, data in (("disk", str(local)), ("s3", url)):
                        run = work / f"run-{source}-{where}-{r}"
                        train[where].append(_train(data, options, steps, run, args.threads))
                        pipe[where].append(_pipeline(data, 20))
                row = {
                    "model": name,
                    "train_images_per_s": {k: statistics.median(v) for k, v in train.items()},
                    "pipeline_images_per_s": {k: statistics.median(v) for k, v in pipe.items()},
                    "read_ahead_bytes_per_worker": 3 * biggest,  # default read-ahead 2
                    "rounds": {"train": train, "pipeline": pipe},
                }
                t, p = row["train_images_per_s"], row["pipeline_images_per_s"]
                row["train_ratio"] = t["s3"] / t["disk"]
                row["pipeline_ratio"] = p["s3"] / p["disk"]
                rows.append(row)
                print(json.dumps(row))
    finally:
        server.terminate()
    load = os.getloadavg()
    meta = {"cpu": _cpu(), "threads": args.threads, "load_avg": load, "rounds": args.rounds}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# Shards from a local S3 server against the same shards on disk",
        "",
        f"`python bench/scale_stream.py --rounds {args.rounds} --threads {args.threads}` on "
        f"{meta['cpu']}, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        "(a shared host: compare the ratios, taken within one run). Default read-ahead (2 "
        "shards), one DataLoader worker, medians over the rounds.",
        "",
        "| model | train images/s, disk | S3 | ratio | pipeline images/s, disk | S3 | ratio "
        "| read-ahead memory per worker |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        t, p = row["train_images_per_s"], row["pipeline_images_per_s"]
        lines.append(
            f"| {row['model']} | {t['disk']:.0f} | {t['s3']:.0f} | {row['train_ratio']:.2f}x "
            f"| {p['disk']:.0f} | {p['s3']:.0f} | {row['pipeline_ratio']:.2f}x "
            f"| {row['read_ahead_bytes_per_worker'] / 1e6:.1f} MB |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
