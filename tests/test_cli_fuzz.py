"""Every subcommand given wrong values ends with one line, never a traceback.

The commands and their options are read from ``build_parser``, so a new command or option is
fuzzed without touching this file. Each option gets wrong types, negatives, zero, empty strings,
missing files and directories where files belong (and files where directories belong); the
command runs in-process, so an exception escaping ``main`` (which a user sees as a traceback)
fails the test with its argv.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from vitkit.cli import build_parser, main

SRC = Path(__file__).resolve().parents[1] / "src"


def subcommands() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """(the words that name it, its parser) for every command that runs something."""

    def walk(
        p: argparse.ArgumentParser, words: list[str]
    ) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
        children = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if words:
            yield words, p
        for action in children:
            for name, child in action.choices.items():
                yield from walk(child, [*words, name])

    yield from walk(build_parser(), [])


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(action, argparse._SubParsersAction)


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "a_dir").mkdir()
    (root / "a_file.txt").write_text("not a checkpoint, an image or a dataset\n")
    return {
        "missing": str(root / "missing" / "thing.png"),
        "dir": str(root / "a_dir"),
        "file": str(root / "a_file.txt"),
    }


def bad_values(action: argparse.Action, places: dict[str, str]) -> list[str]:
    """Wrong values for one option: a choice only gets the empty string (argparse checks
    choices), a number wrong numbers and words, anything else also paths of the wrong kind."""
    if action.choices is not None:
        return [""]
    if action.type not in (None, str):
        return ["", "-3", "0", "nan", "abc"]
    return ["", "-3", "abc", places["missing"], places["dir"], places["file"]]


def value_options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if takes_value(a) and a.dest != "help"]


def base_argv(
    words: list[str], p: argparse.ArgumentParser, given: dict[str, str], missing: str
) -> list[str]:
    """The command with every required argument given: ``given[dest]`` where there is one,
    else the first choice, else a path that does not exist. Training commands read missing
    data unless ``given`` says otherwise, so that no value starts a real run."""
    argv = list(words)
    for action in value_options(p):
        value = given.get(action.dest, missing)
        if action.choices is not None:
            value = next(iter(action.choices))
        n = action.nargs if isinstance(action.nargs, int) else 1
        if not action.option_strings:  # positional
            argv += [value] * n
        elif action.required:
            argv += [action.option_strings[-1], *[value] * n]
    if "--data" in p._option_string_actions and "--data" not in argv:
        argv += ["--data", given.get("data", missing)]
    if "--dry-run" in p._option_string_actions:  # (serve: everything but listening forever)
        argv += ["--dry-run"]
    return argv


def with_value(
    words: list[str],
    p: argparse.ArgumentParser,
    base: list[str],
    action: argparse.Action,
    value: str,
) -> list[str]:
    """``base`` with ``action`` given ``value`` (replacing the base's own value)."""
    argv = list(base)
    n = action.nargs if isinstance(action.nargs, int) else 1
    if not action.option_strings:
        positionals = [a for a in value_options(p) if not a.option_strings]
        i = len(words) + positionals.index(action)  # positionals before them take one value
        argv[i] = value
        return argv
    flag = action.option_strings[-1]
    if flag in argv:
        argv[argv.index(flag) + 1] = value
        return argv
    return [*argv, flag, *[value] * n]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr; any exception but SystemExit escapes main: a traceback."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        pytest.fail(f"vitkit {' '.join(map(repr, argv))}: traceback: {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert "Traceback" not in err, argv
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("vitkit: error:"), (argv, err)
    return code, err


def test_every_subcommand_is_fuzzed() -> None:
    names = {" ".join(words) for words, _ in subcommands()}
    assert {"train", "eval", "predict", "explain", "analyze", "convert", "shards"} <= names
    assert "study data-scale" in names


def test_wrong_values_for_every_option_end_in_one_line(
    places: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    tried, seen = 0, set()
    for words, p in subcommands():
        base = base_argv(words, p, {}, places["missing"])
        for action in value_options(p):
            kind = (tuple(action.option_strings), action.type, str(action.choices), action.nargs)
            if (action.type not in (None, str) or action.choices) and kind in seen:
                continue  # checked at parse time, the same in every command that shares it
            seen.add(kind)
            for value in bad_values(action, places):
                run(with_value(words, p, base, action, value), capsys)
                tried += 1
    assert tried > 300


@pytest.fixture(scope="module")
def checkpoint_and_image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny real checkpoint (of digits) and an 8x8 image it reads."""
    import vitkit
    from vitkit.checkpoints import save_checkpoint
    from vitkit.registry.model_config import PreprocessConfig

    root = tmp_path_factory.mktemp("real")
    model = vitkit.create_model(
        "Ti/4", num_classes=10, image_size=8, in_chans=1, width=16, depth=1, num_heads=2, mlp_dim=16
    )
    ckpt = save_checkpoint(
        root / "ckpt",
        model,
        preprocess=PreprocessConfig.for_model(model.cfg),
        class_names=[str(i) for i in range(10)],
        meta={"dataset": "digits"},
    )
    image = root / "digit.png"
    Image.new("L", (8, 8), 128).save(image)
    return {"ckpt": str(ckpt), "images": str(image)}


def test_paths_of_the_wrong_kind_with_a_real_checkpoint(
    places: dict[str, str],
    checkpoint_and_image: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past parsing: an output that is a file, an input that is a directory, an empty path."""
    monkeypatch.chdir(tmp_path)
    given = {**checkpoint_and_image, "src": checkpoint_and_image["ckpt"], "data": "digits"}
    for words, p in subcommands():
        if "ckpt" not in {a.dest for a in p._actions} or "lr" in {a.dest for a in p._actions}:
            continue  # checkpoint readers; training commands are the test above's
        base = base_argv(words, p, given, str(tmp_path / "new"))
        for action in value_options(p):
            if action.type not in (None, str) or action.choices is not None:
                continue
            for value in ("", places["dir"], places["file"]):
                run(with_value(words, p, base, action, value), capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--image-size", "-8"],
        ["train", "--data", "digits", "--smoke", "--image-size", "-8"],
        ["train", "--data", "digits", "--smoke", "--image-size", "100000"],
        ["convert", "a", "b", "--image-size", "16385", "--to", "hf"],
        ["shards", "digits", "out", "--image-size", "100000"],
        ["eval", "--from", "x", "--batch-size", "0"],
        ["predict", "a.png", "--from", "x", "--top-k", "-3"],
        ["explain", "a.png", "--from", "x", "--top-k", "0"],
        ["train", "--val-size", "2.5"],
        ["train", "--label-smoothing", "1.5"],
        ["train", "--lr", "-1"],
        ["shards", "digits", "out", "--max-shard-bytes", "0"],
    ],
)
def test_wrong_numbers_stop_at_parse_time(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("vitkit: error: ")
    flag = next(a for a in argv if a.startswith("--") and a not in ("--from", "--data", "--smoke"))
    assert flag in lines[0] and f"'vitkit {argv[0]} --help'" in lines[0]


def test_a_closed_pipe_ends_quietly() -> None:
    """``vitkit train --list-recipes | head -1``: the reader is gone before vitkit writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_WAIT_POLICY": "PASSIVE"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "vitkit", "train", "--list-recipes"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


@pytest.mark.parametrize("command", ["train", "eval", "analyze", "fewshot", "shards"])
def test_an_empty_data_name_is_refused(
    command: str,
    checkpoint_and_image: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--data ""`` is no dataset, not the current directory (here an ImageFolder of 2 classes,
    which a path '' would read) nor the checkpoint's own dataset."""
    for name in ("a", "b"):
        (tmp_path / "train" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "train" / name / "0.png")
    monkeypatch.chdir(tmp_path)
    argv = {
        "train": ["train", "--data", "", "--smoke", "--max-steps", "1", "--no-progress"],
        "eval": ["eval", "--from", checkpoint_and_image["ckpt"], "--data", ""],
        "analyze": ["analyze", "--from", checkpoint_and_image["ckpt"], "--data", ""],
        "fewshot": ["fewshot", "--from", checkpoint_and_image["ckpt"], "--data", ""],
        "shards": ["shards", "", "out"],
    }[command]
    code, err = run(argv, capsys)
    assert code == 2 and "got ''" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_load_dataset_refuses_an_empty_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitkit.data import load_dataset
    from vitkit.errors import VitkitError

    (tmp_path / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "train" / "a" / "0.png")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(VitkitError, match="empty dataset name"):
        load_dataset("", "train")


LOADING_VALUES = [
    ["-o", "nonsense=1"],  # not a field
    ["-o", "gelu=banana"],  # not a value of the field
    ["-o", "depth=9"],  # does not fit the weights
    ["-o", "num_heads=3"],  # width 16 not divisible
    ["-o", "num_heads=0"],
    ["-o", "mean=abc"],
    ["-o", "mean=0.5,0.5"],  # two values for one channel
    ["-o", "std=0"],
    ["-o", "interpolation=sideways"],
    ["-o", "=1"],
    ["-o", "novalue"],
    ["--num-heads", "5"],  # width 16 not divisible
]


def test_loading_options_of_every_reading_command_end_in_one_line(
    checkpoint_and_image: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """-o KEY=VALUE and --num-heads, the loading options every command that reads a
    checkpoint shares, with a real checkpoint: wrong ones end in one line naming them."""
    monkeypatch.chdir(tmp_path)
    given = {**checkpoint_and_image, "src": checkpoint_and_image["ckpt"], "data": "digits"}
    readers = 0
    for words, p in subcommands():
        if "assume" not in {a.dest for a in p._actions}:
            continue
        readers += 1
        base = base_argv(words, p, given, str(tmp_path / "new"))
        for extra in LOADING_VALUES:
            code, err = run([*base, *extra], capsys)
            assert code != 0, (words, extra)
    assert readers >= 8  # eval, fewshot, predict, explain, analyze, export, inspect, convert
