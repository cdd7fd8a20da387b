"""Every command's ``--help`` reads well: each option explained, defaults shown once and as
people write them (the commands are read from ``build_parser``, so a new one is checked too);
and what commands print reads as English: "1 epoch", "no pre-logits"."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import build_parser, main


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    found = []

    def walk(p: argparse.ArgumentParser, words: list[str]) -> None:
        found.append((" ".join(words) or "vitkit", p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*words, name])

    walk(build_parser(), [])
    return found


def option_help(p: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The text ``--help`` shows for one option, on one line."""
    formatter = p._get_formatter()
    return " ".join(formatter._expand_help(action).split()) if action.help else ""


@pytest.mark.parametrize(("name", "p"), commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_help_style(name: str, p: argparse.ArgumentParser) -> None:
    text = p.format_help()
    assert "%%" not in text and "%(" not in text, name
    for action in p._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        what = f"{name} {'/'.join(action.option_strings) or action.dest}"
        assert action.help and action.help.strip(), f"{what}: no help"
        shown = option_help(p, action)
        assert "default: None" not in shown, f"{what}: {shown}"
        assert shown.count("default") <= 1 or "defaults to" in shown, f"{what}: {shown}"
        if action.required or not action.option_strings:
            assert "(default:" not in shown, f"{what}: required, yet {shown}"
        assert not re.search(r"default: [^)]*\d\.0\b|\de[+-]?\d", shown), f"{what}: {shown}"
        assert "%" not in shown.replace(" %", ""), f"{what}: {shown}"


def test_inspect_says_no_pre_logits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=8, in_chans=1, depth=1)
    save_checkpoint(tmp_path / "ckpt", model)
    for _ in range(2):  # (a second inspect in one process once found describe() a module)
        assert main(["inspect", str(tmp_path / "ckpt")]) == 0
        out = capsys.readouterr().out
        assert "None" not in out and "no pre-logits" in out


def test_a_one_epoch_run_says_1_epoch(tmp_path: Path) -> None:
    from vitkit.cli.train import banner
    from vitkit.train.distributed import DistEnv
    from vitkit.train.trainer import TrainConfig, Trainer

    cfg = TrainConfig(
        data="digits",
        model="Ti/4",
        model_overrides={"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 16},
        epochs=1,
        batch_size=64,
        max_steps=1,
        out_dir=str(tmp_path / "run"),
    )
    line = banner(Trainer(cfg), DistEnv())
    assert " 1 epoch, 1 step, " in line and "epochs" not in line


def test_a_step_bounded_run_says_the_epochs_it_does(tmp_path: Path) -> None:
    """The fine-tuning recipe sets epochs=10,000 and max_steps=10,000: the banner said
    "10,000 epochs" for a run of far fewer; it says the epochs the steps cover."""
    from vitkit.cli.train import banner
    from vitkit.train.distributed import DistEnv
    from vitkit.train.trainer import TrainConfig, Trainer

    cfg = TrainConfig(
        data="digits",
        model="Ti/4",
        model_overrides={"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 16},
        epochs=10_000,
        batch_size=512,
        max_steps=5,
        out_dir=str(tmp_path / "run"),
    )
    trainer = Trainer(cfg)
    expected = -(-5 // trainer.steps_per_epoch)  # digits' train split: 3 steps of 512 an epoch
    line = banner(trainer, DistEnv())
    assert f" {expected} epochs, 5 steps, " in line and "10,000" not in line
