"""Values and weights that cannot mean anything are refused in one line: RandAugment outside
its ranges, predictions from a diverged (NaN) checkpoint; and pretrain's help names the recipe
it really starts from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitkit.cli import build_parser, main
from vitkit.errors import VitkitError
from vitkit.train.train_config import TrainConfig


@pytest.mark.parametrize("bad", [(2, 31.0), (2, -1.0), (-1, 10.0), (2.5, 10.0), (100, 10.0)])
def test_randaugment_outside_its_ranges_is_refused(bad: tuple[float, float]) -> None:
    with pytest.raises(VitkitError, match="randaugment takes"):
        TrainConfig(randaugment=bad)  # type: ignore[arg-type]
    assert TrainConfig(randaugment=(2, 30.0)).randaugment == (2, 30.0)


def test_randaugment_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--smoke", "--data", "digits", "--randaugment", "100", "100"]) == 2
    err = capsys.readouterr().err
    assert "randaugment takes" in err and "Traceback" not in err


def test_predict_refuses_non_finite_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    from vitkit.checkpoints import save_checkpoint
    from vitkit.models.vit import build_model
    from vitkit.registry.model_config import PreprocessConfig, model_config

    cfg = model_config("Ti/4", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=8)
    cfg = cfg.replace(num_classes=3, in_chans=1)
    model = build_model(cfg)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    ckpt = save_checkpoint(
        tmp_path / "nan", model, preprocess=PreprocessConfig.for_model(cfg, crop_pct=1.0)
    )
    image = tmp_path / "x.png"
    Image.new("L", (8, 8), 128).save(image)
    assert main(["predict", str(image), "--from", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite" in err and "head.weight" in err and "Traceback" not in err


def test_pretrain_help_names_the_recipe_it_starts_from() -> None:
    """--objective mae starts from mnist-mae: the --recipe help must not say mnist-mpp."""
    pretrain = build_parser()._subparsers._group_actions[0].choices["pretrain"]  # type: ignore[union-attr]
    (recipe,) = [a for a in pretrain._actions if "--recipe" in a.option_strings]
    assert "mnist-OBJECTIVE" in (recipe.help or "")


def test_randaugment_count_must_be_whole_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--randaugment 2.5 9 was floored to 2 operations and trained."""
    assert main(["train", "--smoke", "--data", "digits", "--randaugment", "2.5", "9"]) == 2
    err = capsys.readouterr().err
    assert "randaugment takes" in err and "2.5" in err and "Traceback" not in err


def test_pretrain_help_after_objective_names_its_recipe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for objective in ("mae", "mpp"):
        with pytest.raises(SystemExit):
            main(["pretrain", "--objective", objective, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert f"recipe to start from (default: mnist-{objective})" in text


def test_image_size_is_capped_where_the_cli_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (
        ["train", "--smoke", "--data", "digits", "--image-size", "100000"],
        ["shards", "digits", "out", "--image-size", "100000"],
        ["models", "--image-size", "100000"],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "--image-size" in err and "1..16384" in err and len(err.strip().splitlines()) == 1


TINY_MAIN = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))  # a machine with 6 GiB
from vitkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--image-size", "4000"], "images at 4000x4000 px need 19.3 GiB in memory"),
        (
            ["-o", "mlp_dim=262144", "--batch-size", "1024"],
            "out of memory on cpu at batch size 1024 (1024 images per micro-batch), asking "
            "for 17.0 GiB more: lower --batch-size (e.g. 512) or keep it with --accum-steps 2",
        ),
    ],
    ids=["dataset", "step"],
)
def test_running_out_of_memory_on_cpu_is_one_line(
    tmp_path: Path, extra: list[str], expected: str
) -> None:
    """A real allocation failure (the address space capped in a child process), as on CUDA:
    one line naming the batch, the memory asked for and the fix, no traceback."""
    import os
    import subprocess
    import sys

    model = ["--model", "Ti/2", "-o", "width=32", "-o", "depth=1", "-o", "num_heads=2"]
    args = ["train", "--data", "digits", *model, "--no-progress", "--max-steps", "1"]
    args += ["--precision", "fp32", "--out-dir", str(tmp_path / "run"), *extra]
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, "-c", TINY_MAIN, *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert len([x for x in done.stderr.splitlines() if x.startswith("vitkit: error")]) == 1


def test_a_bad_model_is_refused_before_torchrun_spawns_ranks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Once, in one line, instead of once per rank and torchrun's traceback hint."""
    args = ["train", "--nproc-per-node", "2", "--data", "digits", "--model", "Ti/2"]
    assert main([*args, "-o", "width=64"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "vitkit: error: --model Ti/2: width 64 is not divisible by num_heads 3"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--data", "nosuchdata"], "unknown dataset 'nosuchdata'"),  # refused before spawning
        (["--data", "digits", "--data-root", "."], "applies only to mnist"),  # by the processes
    ],
)
def test_nproc_per_node_refuses_in_one_line(
    tmp_path: Path, extra: list[str], expected: str
) -> None:
    """Under --nproc-per-node a refusal printed once per process, then torchrun's
    "failed (exitcode: 2)" line and its traceback hint: now the one line, as in one process."""
    import os
    import subprocess
    import sys

    args = ["train", "--nproc-per-node", "2", "--model", "Ti/2", "-o", "width=64"]
    args += ["-o", "num_heads=2", "--max-steps", "1", "--out-dir", str(tmp_path / "r"), *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop("OMP_NUM_THREADS", None)  # torchrun warns in a banner when it is unset
    done = subprocess.run(
        [sys.executable, "-m", "vitkit", *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vitkit: error: "), done.stderr[-2000:]
    assert expected in lines[0]


def test_an_unknown_model_option_is_one_message_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o bogus=1`` on a reading command printed ``ViTConfig.__init__() got an unexpected
    keyword argument``; train said ``unknown model option(s): bogus``: one message now."""
    from PIL import Image

    from vitkit.checkpoints import save_checkpoint
    from vitkit.models.vit import create_model

    model = create_model("Ti/4", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=8)
    ck = str(save_checkpoint(tmp_path / "ck", model))
    img = tmp_path / "i.png"
    Image.new("RGB", (8, 8)).save(img)
    for args in (
        ["train", "--smoke", "--data", "digits"],
        ["inspect", ck],
        ["eval", "--from", ck, "--data", "digits"],
        ["predict", "--from", ck, str(img)],
        ["convert", ck, str(tmp_path / "out"), "--to", "hf"],
        ["export", ck, str(tmp_path / "m.onnx")],
    ):
        assert main([*args, "-o", "bogus=1"]) == 2, args
        err = capsys.readouterr().err
        assert err.strip() == "vitkit: error: unknown model option(s): bogus", (args, err)


def test_a_setting_the_file_states_is_not_replaced_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o num_heads=4`` on a checkpoint whose config states 2 heads was accepted silently and
    changed the predictions; it is said in one line, a training-only setting (dropout) and the
    stated value itself are not."""
    import vitkit
    from vitkit.checkpoints import save_checkpoint
    from vitkit.models.vit import create_model

    model = create_model("Ti/4", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=8)
    ck = save_checkpoint(tmp_path / "ck", model)
    import warnings

    with pytest.warns(UserWarning, match="states num_heads=2; the given num_heads=4 replaces it"):
        assert vitkit.load(ck, num_heads=4).cfg.num_heads == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert vitkit.load(ck, dropout=0.1).cfg.dropout == 0.1
        assert vitkit.load(ck, num_heads=2).cfg.num_heads == 2  # the same value: nothing said


@pytest.mark.parametrize(
    "sizes",
    [
        ["-o", "width=65536", "-o", "depth=1", "-o", "num_heads=1"],  # inside the ranges
        ["-o", "width=16384", "-o", "depth=1024", "-o", "num_heads=16"],
    ],
)
def test_a_model_that_cannot_fit_is_refused_before_it_is_built(
    sizes: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sizes inside the accepted ranges whose weights cannot fit ended in allocator tracebacks
    after gigabytes; the exact parameter count refuses them at once, with the estimate."""
    import time

    from vitkit.hardware import available_memory
    from vitkit.models.vit import build_model
    from vitkit.registry.counts import count_params
    from vitkit.registry.model_config import model_config

    overrides = dict(s.split("=") for s in sizes[1::2])
    cfg = model_config("Ti/4", **{k: int(v) for k, v in overrides.items()})
    free = available_memory()
    if free is None:
        pytest.skip("this platform does not say its available memory")
    if 4 * count_params(cfg) <= free:  # (it would be built: not this test's to allocate)
        pytest.skip("this machine has the memory for this model")
    start = time.perf_counter()
    out = tmp_path / "run"
    assert main(["train", "--smoke", "--data", "digits", *sizes, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "parameters, fp32) needs about" in err and "GiB" in err and "\n" not in err.strip()
    assert time.perf_counter() - start < 30 and not out.exists()
    # on the meta device (a checkpoint's key check) nothing is allocated: not refused
    with torch.device("meta"):
        assert build_model(cfg).cfg == cfg


def test_a_sequence_that_cannot_fit_is_refused_before_any_image_is_resized(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``predict --max-seq-len 100000000`` on a NaFlex model resized the image to 10^8 patches
    and was killed by the kernel at the machine's memory; refused at once with the estimate."""
    from PIL import Image

    from vitkit.checkpoints import save_checkpoint
    from vitkit.hardware import available_memory
    from vitkit.models.vit import create_model

    free = available_memory()
    if free is None or free > 200 * 2**30:  # (10^8 patches of this model: about 137 GiB)
        pytest.skip("the available memory is unknown, or enough for 10^8 patches")
    model = create_model(
        "Ti/4",
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        image_size=8,
        naflex=True,
        pos_embed_prefix=False,
    )
    ck = save_checkpoint(tmp_path / "ck", model)
    img = tmp_path / "i.png"
    Image.new("RGB", (12, 8)).save(img)
    for cmd in (["predict", "--from", str(ck), str(img)], ["eval", "--from", str(ck)]):
        assert main([*cmd, "--max-seq-len", "100000000"]) == 2
        err = capsys.readouterr().err
        assert "--max-seq-len 100,000,000" in err and "GiB" in err, err
    assert main(["predict", "--from", str(ck), str(img), "--max-seq-len", "6"]) == 0
    # a BiT ResNet has no sequence: the usual refusal, not an AttributeError of the estimate
    bit = create_model("bit_r26x1", layers=(1, 1, 1), num_classes=3, image_size=16)
    bck = save_checkpoint(tmp_path / "bit", bit)
    capsys.readouterr()
    assert main(["predict", "--from", str(bck), str(img), "--max-seq-len", "6"]) == 2
    assert "needs a NaFlex model" in capsys.readouterr().err
