"""vitkit serve: the API answers what `vitkit predict` answers (torch and ONNX Runtime),
requests of several clients share a forward, every bad request gets a 4xx and one line and the
server keeps serving, the API key, SIGTERM drains, and the missing extra is one line."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_bounds import fp32_unless_asked  # noqa: E402

import vitkit  # noqa: E402
from vitkit.cli import build_parser, main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# -- a tiny model, its images and servers in this process ---------------------------------


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("serve")
    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/4", num_classes=5, image_size=16, in_chans=3, width=32, depth=2, num_heads=2,
        mlp_dim=64,
    )  # fmt: skip
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
    vitkit.save_checkpoint(d / "ck", model, class_names=["a", "b", "c", "d", "e"])
    rng = np.random.default_rng(0)
    for i in range(3):  # sizes other than the model's: resize and crop are part of the answer
        Image.fromarray(rng.integers(0, 255, (20 + 4 * i, 24, 3), dtype=np.uint8)).save(
            d / f"img{i}.png"
        )
    return d


class Server:
    """``vitkit serve``'s application on a thread of this process (uvicorn, port 0)."""

    def __init__(self, argv: list[str]):
        import uvicorn

        from vitkit.cli.serve import served_model
        from vitkit.cli.serve_bounds import request_limits
        from vitkit.serve.http_app import Settings, build_app

        args = build_parser().parse_args(["serve", *fp32_unless_asked(argv)])
        served = served_model(args)
        limits = request_limits(args)
        settings = Settings(limits, args.max_batch, args.max_wait_ms, args.api_key)
        config = uvicorn.Config(build_app(served, settings), port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def call(
    port: int,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {}, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def multipart(files: list[bytes]) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    parts = []
    for i, data in enumerate(files):
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
            f'filename="{i}.png"\r\nContent-Type: image/png\r\n\r\n'.encode()
            + data
            + b"\r\n"
        )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


@pytest.fixture(scope="module")
def torch_server(work: Path) -> Any:
    s = Server([str(work / "ck"), "--max-body", "200000", "--max-pixels", "1000000",
                "--max-images", "4"])  # fmt: skip
    yield s
    s.stop()


def predicted(work: Path, capsys: Any, *engine: str) -> list[list[dict[str, Any]]]:
    images = [str(work / f"img{i}.png") for i in range(3)]
    capsys.readouterr()
    assert main(["predict", *images, "--from", str(work / "ck"), "--json", *engine]) == 0
    return [json.loads(line)["top_k"] for line in capsys.readouterr().out.splitlines()]


def same_answers(served: list[Any], expected: list[Any]) -> None:
    assert len(served) == len(expected)
    for got, want in zip(served, expected):
        assert [q["label"] for q in got] == [q["label"] for q in want]
        np.testing.assert_allclose([q["prob"] for q in got], [q["prob"] for q in want], atol=1e-5)


# -- answers --------------------------------------------------------------------------------


def test_classify_answers_what_predict_answers_torch(work, torch_server, capsys):
    files = [(work / f"img{i}.png").read_bytes() for i in range(3)]
    body, headers = multipart(files)
    status, raw = call(torch_server.port, "/v1/classify?top_k=5", body, headers)
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["engine"] == "torch" and answer["precision"] == "fp32"
    assert answer["model"]["source"] == "ck" and answer["preprocess"]["image_size"] == [16, 16]
    same_answers([r["top_k"] for r in answer["results"]], predicted(work, capsys))
    # one image as the raw body: the same answer as in the form
    status, raw = call(torch_server.port, "/v1/classify?top_k=2", files[1])
    assert status == 200
    top = json.loads(raw)["results"][0]["top_k"]
    assert [q["label"] for q in top] == [q["label"] for q in answer["results"][1]["top_k"][:2]]


def test_classify_answers_what_predict_answers_onnxruntime(work, capsys):
    pytest.importorskip("onnxruntime")
    s = Server([str(work / "ck"), "--engine", "onnxruntime"])
    try:
        body, headers = multipart([(work / f"img{i}.png").read_bytes() for i in range(3)])
        status, raw = call(s.port, "/v1/classify", body, headers)
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer["engine"] == "onnxruntime"
        expected = predicted(work, capsys, "--engine", "onnxruntime")
        same_answers([r["top_k"] for r in answer["results"]], expected)
        # explanations come from the PyTorch model of the same checkpoint
        status, raw = call(s.port, "/v1/explain", (work / "img0.png").read_bytes())
        assert status == 200 and json.loads(raw)["engine"] == "torch"
    finally:
        s.stop()


def test_requests_of_several_clients_share_a_forward(work):
    s = Server([str(work / "ck"), "--max-batch", "8", "--max-wait-ms", "400"])
    try:
        png = (work / "img0.png").read_bytes()
        with ThreadPoolExecutor(6) as pool:
            done = list(pool.map(lambda _: call(s.port, "/v1/classify", png), range(6)))
        assert [status for status, _ in done] == [200] * 6
        text = call(s.port, "/metrics")[1].decode()
        count = int(re.search(r"^vitkit_batch_images_count (\d+)", text, re.M).group(1))
        images = float(re.search(r"^vitkit_batch_images_sum (\S+)", text, re.M).group(1))
        assert images == 6 and count < 6, text  # some forward answered several clients
        assert 'vitkit_requests_total{route="/v1/classify",status="200"} 6' in text
        assert "vitkit_queue_images 0" in text
        assert 'vitkit_request_seconds_count{route="/v1/classify"} 6' in text
    finally:
        s.stop()


def test_explain_gives_rollout_layer_maps_and_where_a_patch_attends(work, torch_server):
    png = (work / "img0.png").read_bytes()
    status, raw = call(torch_server.port, "/v1/explain?layers=true&query_patch=5&top_k=3", png)
    assert status == 200, raw
    a = json.loads(raw)
    assert a["grid"] == [4, 4] and a["layers"] == 2 and a["heads"] == 2
    assert len(a["top_k"]) == 3
    assert np.isclose(np.sum(a["rollout"]), 1.0, atol=1e-4)
    assert np.array(a["layer_maps"]).shape == (2, 2, 4, 4)
    assert np.array(a["rollout_maps"]).shape == (2, 4, 4)
    np.testing.assert_allclose(np.array(a["rollout_maps"])[-1], a["rollout"], atol=1e-5)
    patch = np.array(a["patch_maps"])
    assert patch.shape == (2, 2, 4, 4) and np.allclose(patch.sum((-1, -2)), 1, atol=1e-4)
    overlay = Image.open(io.BytesIO(__import__("base64").b64decode(a["rollout_png"][22:])))
    assert overlay.size == (16, 16)


# -- bad requests: 4xx, one line, and the server goes on ------------------------------------


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (width + 1) * 4)  # a few rows; the rest would be decoded
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def raw_http(port: int, data: bytes) -> tuple[int, bytes]:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        got = b""
        while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < int(
            re.search(rb"content-length: (\d+)", got, re.I).group(1)  # type: ignore[union-attr]
            if re.search(rb"content-length: (\d+)", got, re.I)
            else 1 << 30
        ):
            more = s.recv(65536)
            if not more:
                break
            got += more
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_every_bad_request_gets_a_4xx_line_and_the_server_goes_on(work, torch_server):
    port = torch_server.port
    buf = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buf, format="JPEG")  # (mostly pixels: a cut keeps the header)
    jpeg = buf.getvalue()
    ppm = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(ppm, format="PPM")
    png = (work / "img0.png").read_bytes()
    five, headers5 = multipart([png] * 5)
    cases = {
        "empty body": (call(port, "/v1/classify", b"", method="POST"), 400, "empty"),
        "not an image": (call(port, "/v1/classify", b"hello"), 415, "not an image"),
        "a format not read": (call(port, "/v1/classify", ppm.getvalue()), 415, "format"),
        "truncated JPEG": (call(port, "/v1/classify", jpeg[: len(jpeg) // 2]), 400, "truncated"),
        "truncated PNG": (call(port, "/v1/classify", png[:60]), 400, "decoded"),
        "20000x20000 PNG": (call(port, "/v1/classify", png_header(20000, 20000)), 413, "pixels"),
        "over --max-pixels": (call(port, "/v1/classify", png_header(1001, 1000)), 413, "1,001,000"),
        "body over --max-body": (call(port, "/v1/classify", b"\0" * 200_001), 413, "--max-body"),
        "chunked body over --max-body": (
            raw_http(
                port,
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                b"\r\n\r\n"
                + b"".join(b"%x\r\n" % 50_000 + b"\0" * 50_000 + b"\r\n" for _ in range(5))
                + b"0\r\n\r\n",
            ),
            413,
            "--max-body",
        ),  # fmt: skip
        "too many images": (call(port, "/v1/classify", five, headers5), 413, "--max-images"),
        "empty form": (call(port, "/v1/classify", *multipart([])), 400, "no file"),
        "top_k 0": (call(port, "/v1/classify?top_k=0", png), 400, "top_k"),
        "top_k not a number": (call(port, "/v1/classify?top_k=x", png), 400, "top_k"),
        "explain of two images": (call(port, "/v1/explain", *multipart([png, png])), 400, "one"),
        "query_patch outside": (call(port, "/v1/explain?query_patch=16", png), 400, "0 to 15"),
        "head_fusion unknown": (call(port, "/v1/explain?head_fusion=sum", png), 400, "fusion"),
        "unknown route": (call(port, "/v2/classify", png), 404, "Not Found"),
        "wrong method": (call(port, "/v1/classify"), 405, "Method"),
        "bad Content-Length": (
            raw_http(port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n"),
            400,
            "",
        ),  # fmt: skip
    }
    for name, ((status, raw), want, says) in cases.items():
        assert status == want, (name, status, raw)
        if name == "bad Content-Length":  # malformed HTTP: uvicorn's own plain line
            assert raw == b"Invalid HTTP request received.", raw
            continue
        assert raw.count(b"\n") == 0, (name, raw)
        assert says in json.loads(raw)["error"], (name, raw)
    assert call(port, "/health")[0] == 200
    status, raw = call(port, "/v1/classify", png)
    assert status == 200 and json.loads(raw)["results"][0]["top_k"]


def test_a_raw_image_is_answered_as_the_router_answers_it(work, torch_server):
    """A raw image with no query or only top_k is answered past FastAPI's router; the same
    request with another query parameter (which the route ignores) goes through the router:
    the same status and the same answer or one-line error, for good and bad bodies alike."""
    png = (work / "img1.png").read_bytes()
    bodies = {"png": png, "empty": b"", "not an image": b"hello", "truncated": png[:60],
              "20000x20000": png_header(20000, 20000)}  # fmt: skip
    for name, body in bodies.items():
        direct = call(torch_server.port, "/v1/classify?top_k=2", body, method="POST")
        routed = call(torch_server.port, "/v1/classify?top_k=2&via=router", body, method="POST")
        assert direct[0] == routed[0], (name, direct, routed)
        assert json.loads(direct[1]) == json.loads(routed[1]), name
    status, raw = call(torch_server.port, "/v1/classify", png)  # (the default top_k: 5)
    assert status == 200 and len(json.loads(raw)["results"][0]["top_k"]) == 5


def test_no_path_or_url_is_read_from_a_request(work, torch_server):
    for body in (str(work / "img0.png").encode(), b"file://" + str(work / "img0.png").encode(),
                 b"http://127.0.0.1/img.png"):  # fmt: skip
        status, raw = call(torch_server.port, "/v1/classify", body)
        assert status == 415, raw


# -- the API key --------------------------------------------------------------------------


def test_the_api_key_is_required_on_every_route_but_health(work, monkeypatch):
    monkeypatch.setenv("VITKIT_API_KEY", "s3cret")
    args = build_parser().parse_args(["serve", str(work / "ck")])
    assert args.api_key is None  # read from the environment by the command
    s = Server([str(work / "ck"), "--api-key", "s3cret"])
    try:
        png = (work / "img0.png").read_bytes()
        for path, body in (("/v1/classify", png), ("/v1/explain", png), ("/", None),
                           ("/openapi.json", None)):  # fmt: skip
            status, raw = call(s.port, path, body)
            assert status == 401 and b"API key" in raw, path
            assert call(s.port, path, body, {"X-API-Key": "wrong"})[0] == 401
            assert call(s.port, path, body, {"X-API-Key": "s3cret"})[0] == 200, path
            assert call(s.port, path, body, {"Authorization": "Bearer s3cret"})[0] == 200
        for open_route in ("/health", "/ready", "/metrics"):  # probes and the scrape
            assert call(s.port, open_route)[0] == 200, open_route
        schema = json.loads(call(s.port, "/openapi.json", None, {"X-API-Key": "s3cret"})[1])
        assert {"/v1/classify", "/v1/explain", "/health", "/metrics"} <= set(schema["paths"])
        assert call(s.port, "/?key=s3cret")[0] == 200  # the page, opened in a browser
        assert call(s.port, "/openapi.json?key=s3cret")[0] == 401  # (only the page: ?key=)
    finally:
        s.stop()


# -- the command ----------------------------------------------------------------------------


def test_int8_engine_explain_is_refused_naming_what_can(work, capsys):
    pytest.importorskip("onnxruntime")
    q = work / "q"
    assert main(["export", str(work / "ck"), str(q), "--int8", "--engine", "onnxruntime"]) == 0
    s = Server([str(q)])
    try:
        status, raw = call(s.port, "/v1/explain", (work / "img0.png").read_bytes())
        assert status == 409 and b"--engine torch" in raw
        assert call(s.port, "/v1/classify", (work / "img0.png").read_bytes())[0] == 200
    finally:
        s.stop()


def test_sigterm_drains_the_request_in_flight_and_exits_0(work):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vitkit", "serve", str(work / "ck"), "--port", "0",
         "--max-wait-ms", "1500"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("ready: "):
                break
        ready = lines[-1]
        assert ready.startswith("ready: http://127.0.0.1:"), "".join(lines)  # the default host
        port = int(ready.rsplit(":", 1)[1].strip(" /\n"))
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(call, port, "/v1/classify", (work / "img0.png").read_bytes())
            time.sleep(0.5)  # the request waits in the batcher (--max-wait-ms 1500)
            proc.send_signal(signal.SIGTERM)
            status, raw = answer.result(timeout=30)
        assert status == 200 and b"top_k" in raw
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stdout.read()  # type: ignore[union-attr]
    finally:
        proc.kill()


def test_dry_run_loads_and_says_what_it_would_serve(work, capsys):
    assert main(["serve", str(work / "ck"), "--dry-run", "--max-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "would serve" in out and "up to 4 images" in out and "127.0.0.1:8000" in out


def test_without_the_extra_one_line_names_it(work, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi raises ImportError
    assert main(["serve", str(work / "ck")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vitkit: error: vitkit serve needs the serve extra: "
        "pip install '.[serve]' in vitkit's clone"
    ]


def test_an_empty_api_key_is_refused(work, capsys):
    assert main(["serve", str(work / "ck"), "--api-key", " ", "--dry-run"]) == 2
    assert "API key is empty" in capsys.readouterr().err


def test_a_key_that_headers_cannot_carry_is_refused_and_the_environment_is_read(
    work, capsys, monkeypatch
):
    monkeypatch.setenv("VITKIT_API_KEY", "s3cret\r")  # (an env file written on Windows)
    assert main(["serve", str(work / "ck"), "--dry-run"]) == 2
    assert "starts or ends with a space" in capsys.readouterr().err
    monkeypatch.setenv("VITKIT_API_KEY", "s3cret")
    assert main(["serve", str(work / "ck"), "--dry-run"]) == 0
    assert "API key required" in capsys.readouterr().out


def test_a_key_beyond_ascii_is_accepted_as_clients_send_it(work):
    key = "pässwörd"
    sent = key.encode().decode("latin-1")  # urllib sends header text as latin-1: the UTF-8 bytes
    s = Server([str(work / "ck"), "--api-key", key])
    try:
        png = (work / "img0.png").read_bytes()
        assert call(s.port, "/v1/classify", png, {"X-API-Key": sent})[0] == 200
        assert call(s.port, "/v1/classify", png, {"Authorization": f"Bearer {sent}"})[0] == 200
        assert call(s.port, "/?key=" + urllib.parse.quote(key))[0] == 200
        assert call(s.port, "/v1/classify", png, {"X-API-Key": "passwoerd"})[0] == 401
        sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
        if not Path(CHROMIUM).is_file():
            pytest.skip(f"no Chromium at {CHROMIUM} (apt install chromium)")
        with sync_api.sync_playwright() as p:  # the page sends the key from its address
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{s.port}/?key=" + urllib.parse.quote(key))
                page.set_input_files("#file", str(work / "img0.png"))
                page.wait_for_function("document.querySelectorAll('#topk li').length === 5")
            finally:
                browser.close()
    finally:
        s.stop()


# -- the page, in a real browser ------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"


def test_the_page_shows_top_k_rollout_layers_and_where_a_patch_attends(work, torch_server):
    """Headless Chromium (Debian's; Playwright never downloads one): upload -> top-k and a
    rollout overlay drawn, the layer and head sliders change the map, a click shows where the
    patch attends. The test writes a screenshot (serve_page.png in its temporary folder)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt install chromium)")
    shot = work / "serve_page.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), np.uint8)).save(
        work / "upload.png"
    )
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{torch_server.port}/")
            page.wait_for_function("document.getElementById('model').textContent.includes('ck')")
            page.set_input_files("#file", str(work / "upload.png"))
            page.wait_for_function("document.querySelectorAll('#topk li').length === 5")

            def canvas() -> str:
                return page.evaluate("document.getElementById('view').toDataURL()")

            assert page.evaluate("window.vitkitState.drawn") == "rollout layer 2 head 0"
            rollout = canvas()
            labels = page.eval_on_selector_all("#topk .name", "els => els.map(e => e.textContent)")
            status, raw = call(
                torch_server.port, "/v1/classify", (work / "upload.png").read_bytes()
            )
            assert labels == [q["label"] for q in json.loads(raw)["results"][0]["top_k"]]
            page.fill("#layer", "1")  # the slider moves: the map is another layer's
            page.dispatch_event("#layer", "input")
            assert page.evaluate("window.vitkitState.drawn") == "rollout layer 1 head 0"
            assert canvas() != rollout
            page.fill("#head", "2")
            page.dispatch_event("#head", "input")
            assert page.evaluate("window.vitkitState.drawn") == "rollout layer 1 head 2"
            page.click("#view", position={"x": 10, "y": 10})  # the top-left patch
            page.wait_for_function("window.vitkitState.drawn.startsWith('patch 0')")
            assert not page.is_hidden("#back")
            assert page.text_content("#status") == ""
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert Image.open(shot).size[0] > 400


def test_listening_beyond_this_machine_without_a_key_is_said(work, capsys):
    assert main(["serve", str(work / "ck"), "--host", "0.0.0.0", "--dry-run"]) == 0
    assert "without an API key" in capsys.readouterr().err
    assert main(["serve", str(work / "ck"), "--dry-run"]) == 0
    assert "API key" not in capsys.readouterr().err


def test_a_port_in_use_or_an_empty_host_is_one_line(work, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(work / "ck"), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    # the reason said, before the model loads (its engine line)
    busy = f"vitkit: error: could not listen on 127.0.0.1:{port}: Address already in use"
    assert err.strip().splitlines()[-1] == busy and out == ""
    assert main(["serve", str(work / "ck"), "--host", ""]) == 2
    assert "not a host name" in capsys.readouterr().err
