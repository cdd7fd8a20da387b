"""NaFlex training (``vitkit train / finetune --naflex --max-seq-len N``; train.naflex,
data.naflex_batches): an ImageFolder of three aspect ratios, batches that really mix them, a
run that learns, its checkpoint read by ``predict --max-seq-len``, and one line for each
nonsense combination."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import build_parser, main
from vitkit.errors import VitkitError
from vitkit.hardware import native_bf16

SIZES = ((16, 32), (32, 16), (24, 24))  # (height, width): wide, tall, square
CLASSES = ("top", "bottom", "none")  # which half is bright: needs the patches' positions
NAFLEX_MODEL = ["--model", "Ti/4", "-o", "width=32", "-o", "depth=2", "-o", "num_heads=2"]
NAFLEX_MODEL += ["-o", "mlp_dim=64", "-o", "naflex=true", "-o", "pos_embed_prefix=false"]
NAFLEX_MODEL += ["-o", "naflex_grid=4,4", "--image-size", "16"]
RUN = ["--epochs", "4", "--batch-size", "12", "--lr", "3e-3", "--warmup-steps", "2"]
RUN += ["--precision", "fp32", "--no-progress", "--threads", "1"]


def write_folder(root: Path, per_class: dict[str, int]) -> Path:
    """root/{train,test}/{top,bottom,none}/*.png, the sizes taking turns (a third each)."""
    rng = np.random.default_rng(0)
    for split, n in per_class.items():
        for c, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = SIZES[i % 3]
                img = rng.integers(0, 100, (h, w, 3))
                if c < 2:  # the top or the bottom half brighter
                    img[slice(0, h // 2) if c == 0 else slice(h // 2, h)] += 120
                Image.fromarray(img.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("naflex") / "data", {"train": 48, "test": 18})


def naflex_train(folder: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(folder), *NAFLEX_MODEL, "--naflex", "--max-seq-len", "16"] + [
        *RUN,
        "--out-dir",
        str(out),
        *extra,
    ]


def test_a_naflex_batch_mixes_aspect_ratios(folder):
    """The run's own loader: one batch holds images of different patch grids, each at most
    16 patches, padded to 16 with a valid mask; prepare normalises and zeroes the padding."""
    from vitkit.cli.train_options import train_config_from_args
    from vitkit.data.naflex_batches import PackedImages
    from vitkit.train.trainer import Trainer

    args = build_parser().parse_args(naflex_train(folder, folder.parent / "unused"))
    trainer = Trainer(train_config_from_args(args))
    images, labels, skipped = next(iter(trainer.train_loader))
    assert isinstance(images, PackedImages) and len(images) == len(labels) == 12 and not skipped
    grids = images.grids()
    assert len(set(grids)) == 3  # wide, tall and square images in one batch
    assert {(h > w, h < w) for h, w in grids} == {(True, False), (False, True), (False, False)}
    counts = images.patch_valid.sum(dim=1)
    assert all(h * w == n <= 16 for (h, w), n in zip(grids, counts.tolist()))
    assert images.patches.shape == (12, 16, 4 * 4 * 3)
    x = trainer.prepare(images)
    assert isinstance(x, dict) and x["patches"].dtype == torch.float32
    assert not x["patches"][~x["patch_valid"]].any()  # padding stays 0
    logits = trainer.model(x)
    assert logits.shape == (12, 3)
    test_images, _, _ = next(iter(trainer._loader(trainer.test_set, 54, train=False)))
    assert len(set(test_images.grids())) == 3  # evaluation keeps each aspect ratio too
    # DataLoader workers make the same batches (the transform and collate travel to them)
    trainer.cfg = dataclasses.replace(trainer.cfg, num_workers=1)
    in_worker, _, _ = next(iter(trainer._loader(trainer.test_set, 54, train=False)))
    assert all(torch.equal(a, b) for a, b in zip(in_worker.tensors(), test_images.tensors()))


@pytest.mark.slow
def test_naflex_training_learns_and_predict_reads_the_checkpoint(folder, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(naflex_train(folder, out)) == 0
    banner = "".join(capsys.readouterr())
    assert "NaFlex: each image at its aspect ratio, at most 16 patches" in banner
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert losses[-1] < 0.5 * losses[0]  # measured: 0.91 -> 0.18
    report = json.loads((out / "report.json").read_text())
    assert report["test_top1"] > 0.8  # 3 classes: chance is 1/3 (measured 1.0)
    # predict keeps each image's aspect ratio as training did, from the checkpoint alone
    files = [folder / "test" / name / f"{i}.png" for name in CLASSES for i in range(3)]
    args = ["predict", *map(str, files), "--from", str(out), "--max-seq-len", "16", "--json"]
    assert main(args) == 0
    found = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    right = sum(rec["top_k"][0]["label"] == f.parent.name for rec, f in zip(found, files))
    assert len(found) == 9 and right >= 7
    # without --max-seq-len, the run's own (it silently resized to the fixed size before)
    assert main(args[: args.index("--max-seq-len")] + ["--json"]) == 0
    printed = capsys.readouterr()
    assert "trained with --max-seq-len 16" in printed.err
    assert [json.loads(x) for x in printed.out.splitlines() if x.strip()] == found
    # eval packs the test split as the run's own final evaluation did: the same numbers
    ev = tmp_path / "ev"
    assert main(["eval", "--from", str(out), "--max-seq-len", "16", "--out", str(ev)]) == 0
    result = json.loads((ev / "eval.json").read_text())
    assert result["max_seq_len"] == 16 and result["num_samples"] == 3 * 18
    assert result["top1"] == report["test_top1"]
    assert result["loss"] == pytest.approx(report["test_loss"], rel=1e-6)
    ev2 = tmp_path / "ev2"
    assert main(["eval", "--from", str(out), "--out", str(ev2)]) == 0  # the run's own
    assert json.loads((ev2 / "eval.json").read_text())["top1"] == report["test_top1"]
    # bf16 beside fp32 on the same packing: the fp32 side is eval's own at that --max-seq-len
    if native_bf16(torch.device("cpu")):
        for n in (4, 16):
            ev3, ev4 = tmp_path / f"ev3-{n}", tmp_path / f"ev4-{n}"
            assert (
                main(["eval", "--from", str(out), "--max-seq-len", str(n), "--out", str(ev3)]) == 0
            )
            bf16 = ["eval", "--from", str(out), "--max-seq-len", str(n), "--precision", "bf16"]
            assert main([*bf16, "--out", str(ev4)]) == 0
            fp32_top1 = json.loads((ev3 / "eval.json").read_text())["top1"]
            versus = json.loads((ev4 / "eval.json").read_text())["versus_source"]
            assert versus["source_top1"] == pytest.approx(100 * fp32_top1), n
    capsys.readouterr()
    bad = ["eval", "--from", str(out), "--max-seq-len", "16", "--tta-shift", "1"]
    assert main([*bad, "--out", str(tmp_path / "bad")]) == 2
    assert "does not take --max-seq-len" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--max-seq-len", "0"], "--max-seq-len"),
        (["--max-seq-len", "16"], "--max-seq-len is the NaFlex sequence length: add --naflex"),
        (["--naflex"], "--naflex needs --max-seq-len N"),
        (["--naflex", "--max-seq-len", "16"], "--naflex needs a NaFlex model and --model Ti/4"),
        (["--naflex", "--max-seq-len", "16", "--nproc-per-node", "2"], "runs in one process"),
    ],
)
def test_nonsense_is_one_line(folder, tmp_path, capsys, extra, needle):
    args = ["train", "--data", str(folder), "--model", "Ti/4", "--image-size", "16", *extra]
    code = main([*args, "-o", "depth=1", "--out-dir", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "r").exists()  # nothing written


def test_naflex_refuses_mixing_augmentations(folder, tmp_path, capsys):
    code = main(naflex_train(folder, tmp_path / "r", "--mixup", "0.2", "--randaugment", "2", "9"))
    err = capsys.readouterr().err.strip()
    assert code != 0 and "\n" not in err
    assert (
        "--naflex trains on images of different sizes; --mixup, --randaugment need one size" in err
    )


def test_finetune_naflex_from_a_checkpoint_without_it(folder, tmp_path, capsys):
    from vitkit.checkpoints import Checkpoint, write_checkpoint
    from vitkit.models.vit import build_model
    from vitkit.registry.model_config import PreprocessConfig, model_config

    cfg = model_config("Ti/4", image_size=16, width=32, depth=1, num_heads=2, mlp_dim=64)
    sd = build_model(cfg).state_dict()
    write_checkpoint(
        Checkpoint(Path("m"), cfg, PreprocessConfig.for_model(cfg), sd), tmp_path / "c", "vitkit"
    )
    args = ["finetune", "--from", str(tmp_path / "c"), "--data", str(folder), "--naflex"]
    code = main([*args, "--max-seq-len", "16", *RUN, "--out-dir", str(tmp_path / "ft")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "\n" not in err
    assert f"--naflex needs a NaFlex model and {tmp_path / 'c'} holds ViT-w32-d1-h2/4" in err


def test_naflex_finetunes_a_naflex_checkpoint_at_another_size(folder, tmp_path, capsys):
    """A NaFlex checkpoint (E_pos on its own 4x4 grid) fine-tuned with --naflex: E_pos is kept
    as it was (not resampled to the new image size), the run trains."""
    from vitkit.checkpoints import Checkpoint, load_checkpoint, write_checkpoint
    from vitkit.models.vit import build_model
    from vitkit.registry.model_config import PreprocessConfig, ViTConfig

    cfg = ViTConfig(
        image_size=32,
        patch_size=4,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        num_classes=5,
        naflex=True,
        pos_embed_prefix=False,
        naflex_grid=(4, 4),
    )
    torch.manual_seed(0)
    sd = {k: v + 0.01 for k, v in build_model(cfg).state_dict().items()}
    write_checkpoint(
        Checkpoint(Path("m"), cfg, PreprocessConfig.for_model(cfg), sd), tmp_path / "c", "vitkit"
    )
    args = ["finetune", "--from", str(tmp_path / "c"), "--data", str(folder), "--naflex"]
    args += ["--max-seq-len", "16", "--image-size", "16", *RUN, "--max-steps", "2"]
    assert main([*args, "--out-dir", str(tmp_path / "ft")]) == 0
    tuned = load_checkpoint(tmp_path / "ft")
    assert tuned.model_config.naflex_grid == (4, 4) and tuned.model_config.num_classes == 3
    assert tuned.state_dict["pos_embed"].shape == sd["pos_embed"].shape


def test_naflex_refusals_below_the_cli():
    from vitkit.data.naflex_batches import NaFlexTransform, native_dataset
    from vitkit.registry.model_config import model_config
    from vitkit.train.naflex_runs import check_naflex_run
    from vitkit.train.train_config import TrainConfig

    with pytest.raises(VitkitError, match="max_seq_len must be at least 1 patch, got 0"):
        TrainConfig(max_seq_len=0)
    with pytest.raises(VitkitError, match="the mae objective need one size"):
        TrainConfig(max_seq_len=16, objective="mae")
    cfg = model_config("Ti/4", naflex=True, pos_embed_prefix=False)
    with pytest.raises(VitkitError, match="one process for now"):
        check_naflex_run(TrainConfig(max_seq_len=16), cfg, distributed=True)

    class Stream:  # what a webdataset shard set looks like here: neither folder nor arrays
        info = type("I", (), {"name": "shards"})()

    with pytest.raises(VitkitError, match="shards: NaFlex batches read ImageFolder"):
        native_dataset(Stream(), NaFlexTransform((4, 4), 16, 3))


@pytest.mark.slow
def test_the_guide_s_naflex_commands_run(folder, tmp_path, monkeypatch, capsys):
    """docs/guide/checkpoints.md's NaFlex train / predict / eval / finetune commands, as
    written; substitutes: the
    test's folder for the data, files for the images, a short run (--max-steps 2, batch 12,
    32 px for the report)."""
    import shlex

    from doc_commands import page_commands

    monkeypatch.chdir(tmp_path)
    short = ["--max-steps", "2", "--batch-size", "12", "--threads", "1", "--no-progress"]
    short += ["--image-size", "32"]  # the report's fixed-size analysis (finetune's recipe: 384)
    commands = page_commands("docs/guide/checkpoints.md")
    commands = [c for c in commands if "--max-seq-len" in c and "runs/naflex" in c]
    assert [shlex.split(c)[1] for c in commands] == ["train", "predict", "eval", "finetune"]
    for command in commands:
        args = [str(folder) if a.startswith("path/to/") else a for a in shlex.split(command)[1:]]
        if args[0] == "predict":
            wide, tall = folder / "test" / "top" / "0.png", folder / "test" / "top" / "1.png"
            args = [
                str(wide) if a == "wide.jpg" else str(tall) if a == "tall.jpg" else a for a in args
            ]
        elif args[0] != "eval":  # (eval as written: the run's checkpoint names its data)
            args += [*short, "--out-dir", "runs/naflex" if args[0] == "train" else "runs/ft"]
        assert main(args) == 0, capsys.readouterr().err
    assert (tmp_path / "runs" / "ft" / "report.json").is_file()


@pytest.mark.parametrize("pos", ["learned", "factorized"])
def test_analysis_reads_naflex_position_embeddings_on_their_own_grid(pos):
    """Figure 7's position similarity of a NaFlex model: E_pos on its 3x5 grid, not the
    image's 14x14 (it stopped with "shape '[14, 14, -1]' is invalid")."""
    from vitkit.analysis import position_embedding_similarity
    from vitkit.models.vit import build_model
    from vitkit.registry.model_config import model_config

    cfg = model_config(
        "Ti/16", depth=1, naflex=True, pos_embed_prefix=False, naflex_grid=(3, 5), naflex_pos=pos
    )
    sim = position_embedding_similarity(build_model(cfg))
    assert sim.shape == (3, 5, 3, 5)
    assert torch.allclose(sim[1, 2, 1, 2], torch.tensor(1.0))


def test_naflex_trains_on_in_memory_data(tmp_path, capsys):
    """A built-in dataset (digits, one channel, 8 x 8) through the same path: each image to at
    most 4 patches of 2 x 2 (a 2 x 2 grid), packed; the run trains and evaluates."""
    model = ["--model", "Ti/2", "-o", "width=32", "-o", "depth=1", "-o", "num_heads=2"]
    model += ["-o", "mlp_dim=64", "-o", "naflex=true", "-o", "pos_embed_prefix=false"]
    args = ["train", "--data", "digits", *model, "--naflex", "--max-seq-len", "4", *RUN]
    assert main([*args, "--max-steps", "2", "--out-dir", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["test_num_samples"] == 359  # the whole test split, evaluated packed
