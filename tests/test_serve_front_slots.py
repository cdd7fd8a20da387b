"""vitkit serve --workers N: the front holds no weights (every forward and explanation runs in
a model process, /v1/explain answering what the model itself explains), and a model process
that can never start again is given up after a bounded number of tries, said in the log,
/metrics and /v1/info, /ready turning 503 once no process can serve."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_admission import call, said  # noqa: E402
from test_serve_front import model_pids, scrape, serve, stopped_cleanly  # noqa: E402
from test_serve_front import work as work  # noqa: E402, F401  (the fixture)

import vitkit  # noqa: E402


def reachable(root: Any) -> list[Any]:
    """Every object ``root`` holds (attributes, containers), itself included."""
    seen, todo, found = set(), [root], []
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type, Path)):
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
            todo += list(vars(obj).values())
    return found


def test_the_fronts_served_model_holds_no_tensor_or_module(work):
    """What the front keeps of a model process's served model: the checkpoint's
    preprocessing, labels, engine and precision, and whether it explains; no module, no
    weight."""
    from vitkit.cli import build_parser
    from vitkit.cli.serve import served_model

    full = served_model(
        build_parser().parse_args(["serve", str(work / "ck"), "--precision", "fp32"])
    )
    assert any(isinstance(o, torch.Tensor) for o in reachable(full.ckpt))
    light = full.without_weights()
    held = reachable(light)
    assert not [type(o) for o in held if isinstance(o, (torch.Tensor, torch.nn.Module))]
    assert light.explainable and light.describe() == full.describe()
    assert light.names == full.names and light.num_classes == full.num_classes
    assert light.ckpt.preprocess == full.ckpt.preprocess


def test_explain_runs_in_a_model_process_and_answers_as_the_model_does(work):
    """With both model processes frozen (SIGSTOP) an explanation waits (the front cannot
    compute it: it holds no weights); once they run, it is the model's own explanation, and a
    request error raised in the model process (a query patch outside the grid) is its 400."""
    from vitkit.checkpoints import load_model
    from vitkit.serve.request_images import Limits
    from vitkit.serve.served_model import ServedModel

    proc, lines, port = serve(work)
    try:
        pids = model_pids(lines)
        png = (work / "img.png").read_bytes()
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(call, port, "/v1/explain?top_k=2&query_patch=3", png)
            time.sleep(1.5)
            assert not answer.done()  # (on the front it would be answered by now)
            assert call(port, "/health")[0] == 200
            for pid in pids.values():
                os.kill(pid, signal.SIGCONT)
            status, raw, _ = answer.result()
        assert status == 200, raw
        got = json.loads(raw)
        model, ckpt = load_model(work / "ck")
        served = ServedModel(model, ckpt, engine="torch", precision="fp32", attention_model=model)
        image = served.prepare(png, Limits(20_000_000, 25_000_000, 16))
        want = served.explain(image, k=2, layers=False, query_patch=3)
        assert [p["label"] for p in got["top_k"]] == [p["label"] for p in want["top_k"]]
        assert torch.allclose(torch.tensor(got["rollout"]), torch.tensor(want["rollout"]),
                              atol=1e-5)  # fmt: skip
        assert torch.allclose(torch.tensor(got["patch_maps"]), torch.tensor(want["patch_maps"]),
                              atol=1e-5)  # fmt: skip
        status, raw, _ = call(port, "/v1/explain?query_patch=16", png)
        assert status == 400 and b"0 to 15" in raw, raw
        assert call(port, "/v1/classify", png)[0] == 200  # (the pipe is in step after both)
        stopped_cleanly(proc)
    finally:
        proc.kill()


def test_model_processes_that_can_never_start_again_are_given_up(work, tmp_path):
    """The checkpoint gone, a killed model process fails every start: it is tried a bounded
    number of times (pausing longer each time) while the other serves, then given up in one
    line; with both given up /ready is 503 naming why, /health stays 200, /metrics and
    /v1/info say which slots were given up and a request is answered 503 at once."""
    from vitkit.serve.front import MAX_FAILED_STARTS

    shutil.copytree(work / "ck", tmp_path / "ck")
    (tmp_path / "img.png").write_bytes((work / "img.png").read_bytes())
    proc, lines, port = serve(tmp_path, "--timeout", "0")
    try:
        pids = model_pids(lines)
        png = (work / "img.png").read_bytes()
        shutil.rmtree(tmp_path / "ck")
        os.kill(pids[1], signal.SIGKILL)
        assert call(port, "/v1/classify", png)[0] == 200  # process 2 serves meanwhile
        assert call(port, "/ready")[0] == 200
        os.kill(pids[2], signal.SIGKILL)  # (idle: noticed at once, not at its next batch)
        said(lines, f"model process 2 (pid {pids[2]}) was killed by SIGKILL while idle")
        said(lines, "0 of 2 model processes serve", within=240)
        log = "".join(lines)
        for i in (1, 2):
            assert log.count(f"vitkit: model process {i} could not start again") == (
                MAX_FAILED_STARTS
            ), log
            assert f"model process {i} failed to start {MAX_FAILED_STARTS} times in a row" in log
        status, raw, _ = call(port, "/ready")
        assert status == 503 and b"no model process can serve" in raw, raw
        assert call(port, "/health")[0] == 200
        assert scrape(port, 'vitkit_model_process_given_up{process="1"}') == 1
        assert scrape(port, 'vitkit_model_process_ready{process="2"}') == 0
        info = json.loads(call(port, "/v1/info")[1])
        assert [p["state"] for p in info["model_processes"]] == ["given up", "given up"]
        status, raw, _ = call(port, "/v1/classify", png)
        assert status == 503 and b"no model process can serve" in raw, raw
        status, raw, _ = call(port, "/v1/explain", png)
        assert status == 503 and b"no model process can serve" in raw, raw
        stopped_cleanly(proc)
    finally:
        proc.kill()


def test_a_pool_refuses_in_one_line_when_its_first_process_cannot_load(tmp_path, capsys):
    """The first model process loads before any other starts: a checkpoint it cannot read is
    one line naming it, and the command exits 2 (as any refusal)."""
    from vitkit.cli import main

    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=16, in_chans=3, width=32,
                                depth=1, num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model)
    weights = next(p for p in (tmp_path / "ck").iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(b"not weights")
    code = main(["serve", str(tmp_path / "ck"), "--workers", "2", "--port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert (
        err[0].startswith("vitkit: error: model process 1 could not start: ")
        and str(weights.parent) in err[0]
    ), err


def test_an_explanation_larger_than_the_pipes_buffer_crosses_whole(tmp_path):
    """An explanation of a 224 px image (two PNGs of noise: about 400 kB) is more than a pipe
    holds at once: it crosses whole (the event loop's reader leaves the pipe non-blocking,
    which would cut it short)."""
    import numpy as np
    from PIL import Image

    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", num_classes=3, image_size=224, in_chans=3, width=32,
                                depth=1, num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=["a", "b", "c"])
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)).save(tmp_path / "i.png")
    proc, _, port = serve(tmp_path)
    try:
        status, raw, _ = call(port, "/v1/explain?layers=true", (tmp_path / "i.png").read_bytes())
        assert status == 200 and len(raw) > 300_000, (status, raw[:300])
        assert call(port, "/v1/classify", (tmp_path / "i.png").read_bytes())[0] == 200
        stopped_cleanly(proc)
    finally:
        proc.kill()
