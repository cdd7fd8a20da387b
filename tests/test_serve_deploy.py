"""The Dockerfile and the Kubernetes example: what they run parses as `vitkit serve`, the probes
read /health, the drain fits the grace period, the model is read-only, the user is not root;
the guide shows deploy/k8s.yaml as it is. With a container runtime that runs here (slow): the
image is built, serves a tiny model under load, and stops within its drain timeout."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vitkit.cli import build_parser
from vitkit.cli.serve_memory import DECODE_PROCESS_MB, DECODE_SHARED_MB
from vitkit.serve.workers import STOP_MARGIN_S

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instruction(name: str) -> str:
    lines = DOCKERFILE.replace("\\\n", " ").splitlines()
    found = [ln[len(name) + 1 :].strip() for ln in lines if ln.startswith(name + " ")]
    assert found, f"the Dockerfile has no {name}"
    return found[-1]


def serve_args(argv: list[str]) -> object:
    """argv as `vitkit serve` parses it (argparse's error exits: a wrong option fails here)."""
    return build_parser().parse_args(["serve", *argv])


def test_the_dockerfile_installs_cpu_torch_pinned_runs_as_a_user_and_checks_health():
    run = " ".join(ln for ln in DOCKERFILE.replace("\\\n", " ").splitlines() if "pip install" in ln)
    assert "-c constraints.txt" in run and "download.pytorch.org/whl/cpu" in run
    assert '".[${EXTRAS}]"' in run and "ARG EXTRAS=serve" in DOCKERFILE
    assert re.search(r"^torch==2\.13\.0$", (ROOT / "constraints.txt").read_text(), re.M)
    assert instruction("USER").split(":")[0] not in ("root", "0")
    assert "/health" in instruction("HEALTHCHECK")
    entry, cmd = json.loads(instruction("ENTRYPOINT")), json.loads(instruction("CMD"))
    assert entry[:3] == ["vitkit", "serve", "/model"]
    args = serve_args(entry[2:] + cmd)
    assert args.host == "0.0.0.0" and args.port == 8000  # type: ignore[attr-defined]
    # docker stop kills after 10 s: the drain and, with --workers, the margin after it
    assert args.drain_timeout + STOP_MARGIN_S < 10  # type: ignore[attr-defined]
    kept = (ROOT / ".dockerignore").read_text().split()
    assert "*" in kept and "!src/" in kept  # the build context is the package, not runs/


def test_the_kubernetes_example_probes_health_drains_in_its_grace_period_and_scales_on_cpu():
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "deploy" / "k8s.yaml").read_text()
    docs = (ROOT / "docs" / "guide" / "serving.md").read_text()
    assert f"```yaml\n{text}```" in docs  # the guide shows the file as it is
    kinds = {d["kind"]: d for d in yaml.safe_load_all(text)}
    assert set(kinds) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = serve_args(["/model", *c["args"]])
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["ports"][0] == {"name": "http", "containerPort": 8000}
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod["terminationGracePeriodSeconds"]
    stop = int(pre_stop[1]) + args.drain_timeout + STOP_MARGIN_S  # type: ignore[attr-defined]
    assert stop < grace
    cpus = c["resources"]["requests"]["cpu"]
    assert args.threads == int(cpus) and c["resources"]["limits"]["memory"]  # type: ignore[attr-defined]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/model")
    assert mount["readOnly"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])  # (--fast writes there)
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == kinds["Deployment"]["metadata"]["name"]
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"


def runtime() -> str | None:
    """docker or podman, where it can run a container here."""
    for tool in ("docker", "podman"):
        if shutil.which(tool) is None:
            continue
        ok = subprocess.run([tool, "info"], capture_output=True, timeout=60).returncode == 0
        if ok and subprocess.run([tool, "image", "inspect", "python:3.11-slim"],
                                 capture_output=True, timeout=60).returncode == 0:  # fmt: skip
            return tool
    return None


@pytest.mark.slow
def test_the_image_serves_a_model_under_load_and_stops_within_its_drain_timeout(tmp_path):
    tool = runtime()
    if tool is None:
        pytest.skip("no container runtime that runs here with the python:3.11-slim base image")
    import torch

    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=16, in_chans=3, width=32,
                                depth=1, num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=["a", "b", "c"])
    subprocess.run([tool, "build", "-q", "-t", "vitkit-serve-test", str(ROOT)], check=True,
                   timeout=1800)  # fmt: skip
    name = f"vitkit-serve-test-{int(time.time())}"
    run = f"{tool} run -d --name {name} -p 127.0.0.1::8000 -v {tmp_path / 'ck'}:/model:ro"
    subprocess.run([*shlex.split(run), "vitkit-serve-test"], check=True, timeout=60)
    try:
        port = subprocess.run([tool, "port", name, "8000"], capture_output=True, text=True,
                              check=True).stdout.strip().rsplit(":", 1)[1]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        from PIL import Image

        Image.new("RGB", (16, 16), (10, 200, 30)).save(tmp_path / "x.png")
        png = (tmp_path / "x.png").read_bytes()

        def classify(_: int) -> int:
            req = urllib.request.Request(f"{url}/v1/classify", data=png)
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(classify, range(400))) == [200] * 400
        # a graceful stop within the grace period (exit code 0, not the 137 of a kill); the
        # period is 60 s so that a loaded host's slower exit does not turn into a kill
        subprocess.run([tool, "stop", "-t", "60", name], check=True, timeout=120)
        code = subprocess.run([tool, "inspect", "-f", "{{.State.ExitCode}}", name],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        assert code == "0"
    finally:
        subprocess.run([tool, "rm", "-f", name], capture_output=True)


def test_the_base_image_is_an_argument_to_pin_by_digest_and_no_invented_digest():
    """FROM takes BASE_IMAGE; a digest, where the default carries one, is a whole sha256; the
    comment says how to pin it."""
    assert instruction("FROM") == "${BASE_IMAGE}"
    arg = next(a for a in re.findall(r"^ARG (\S+)", DOCKERFILE, re.M) if a.startswith("BASE_"))
    name, _, image = arg.partition("=")
    assert name == "BASE_IMAGE" and image.startswith("python:3.11-slim")
    if "@" in image:
        assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", image)
    assert "--build-arg BASE_IMAGE=python:3.11-slim@sha256:" in DOCKERFILE


def test_the_deployment_runs_a_pinned_tag_with_the_memory_dry_run_printed():
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "deploy" / "k8s.yaml").read_text()
    pod = next(d for d in yaml.safe_load_all(text) if d["kind"] == "Deployment")["spec"]
    (c,) = pod["template"]["spec"]["containers"]
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and c["image"] == f"vitkit-serve:{version.group(1)}"
    printed = re.findall(r"memory: .* request (\d+)Mi, limit (\d+)Mi", text)
    assert len(printed) == 2  # the MNIST model's (used) and B/16's
    decoders = DECODE_SHARED_MB + 8 * DECODE_PROCESS_MB  # (the default --decode-workers 2)
    lines = re.findall(r"memory: .* request \d+Mi, limit \d+Mi", text)
    assert all(f"+ {decoders} MiB of up to 8 decode processes =" in ln for ln in lines), lines
    request, limit = printed[0]
    assert c["resources"]["requests"]["memory"] == f"{request}Mi"
    assert c["resources"]["limits"]["memory"] == f"{limit}Mi"
    notes = pod["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/path"] == "/metrics" and notes["prometheus.io/port"] == "8000"


def test_the_prometheus_example_scrapes_metrics_without_a_key():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    static = jobs["vitkit-serve-static"]
    assert static["metrics_path"] == "/metrics" and "authorization" not in static
    assert static["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    assert "authorization" not in jobs["vitkit-serve"]


def test_dry_run_prints_the_memory_a_container_needs(tmp_path, capsys):
    import torch

    import vitkit
    from vitkit.cli import main

    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=16, in_chans=3, width=32,
                                depth=1, num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=["a", "b", "c"])
    argv = ["serve", str(tmp_path / "ck"), "--dry-run", "--max-body-memory", "100000000"]
    budgets = round((256_000_000 + 100_000_000) / 2**20)
    # --worker-mode socket: three whole servers
    assert main([*argv, "--workers", "3", "--decode-workers", "1", "--worker-mode", "socket"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    decoders = DECODE_SHARED_MB + 4 * DECODE_PROCESS_MB  # (up to 4 x --decode-workers at once)
    m = re.fullmatch(
        r"memory: ([\d,]+) MiB resident after warm-up \+ (\d+) MiB of decode and body budgets "
        rf"\+ {decoders} MiB of up to 4 decode processes = ([\d,]+) MiB a worker, x 3 workers: "
        r"request (\d+)Mi, limit (\d+)Mi",
        last,
    )
    assert m, last
    assert int(m.group(2)) == budgets
    worker = int(m.group(3).replace(",", ""))
    assert abs(worker - (int(m.group(1).replace(",", "")) + budgets + decoders)) <= 1
    assert int(m.group(4)) >= 3 * worker and int(m.group(5)) >= 1.25 * 3 * worker - 64
    # the front (the budgets, the decode processes; no weights) and three model processes
    assert main([*argv, "--workers", "3", "--decode-workers", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(
        r"memory: ([\d,]+) MiB resident after warm-up \+ (\d+) MiB of decode and body budgets "
        rf"\+ {decoders} MiB of up to 4 decode processes = ([\d,]+) MiB the front, less the "
        r"model's ([\d,]+) MiB of weights it does not hold, \+ 3 model processes of "
        r"([\d,]+) MiB: request (\d+)Mi, limit (\d+)Mi",
        last,
    )
    assert m, last
    model, front = (int(m.group(i).replace(",", "")) for i in (1, 3))
    weights = int(m.group(4).replace(",", ""))
    assert int(m.group(2)) == budgets and int(m.group(5).replace(",", "")) == model
    assert int(m.group(6)) >= front - weights + 3 * model - 1
    assert int(m.group(7)) >= int(m.group(6))


def test_the_weights_the_front_does_not_hold_are_the_models_each_tensor_once():
    import torch

    import vitkit
    from vitkit.cli.serve_memory import weights_mb

    model = vitkit.create_model(
        "Ti/16", num_classes=10, image_size=32, width=256, depth=2, num_heads=4
    )
    fp32 = sum(t.numel() * 4 for t in (*model.parameters(), *model.buffers())) / 2**20
    served = type("Served", (), {"model": model, "attention_model": model})()
    assert abs(weights_mb(served) - fp32) < 1e-9 and fp32 > 5  # (one model: counted once)
    half = torch.nn.Module()
    half.w = torch.nn.Parameter(torch.zeros(2**20, dtype=torch.bfloat16))
    served.model = half  # (bf16 weights beside the fp32 model that explains)
    assert abs(weights_mb(served) - (fp32 + 2.0)) < 1e-9


def test_the_decode_process_figure_is_the_measured_one():
    """--dry-run's decode-process figures are those bench/serve_decode_idle.py measured (its
    results file's current row): PSS per decode process, and the fork server's and the
    resource tracker's once."""
    text = (ROOT / "bench" / "results" / "serve_decode_idle.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| current |"))
    server, fork, decode, other = (float(c) for c in row.split("|")[2:6])
    assert "--decode-workers 2" in text
    assert round(decode / 2) == DECODE_PROCESS_MB
    assert round(fork + other) == DECODE_SHARED_MB
