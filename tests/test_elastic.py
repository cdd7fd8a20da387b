"""Elastic distortion inside the digits jitter (Simard et al. 2003; `--elastic ALPHA SIGMA`):
the field against scipy's Gaussian filter, the displacement's direction and size, the affine
draws unchanged by it, one batch drawn the same in parts, and every misuse refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.ndimage import gaussian_filter

from vitkit.cli import main
from vitkit.data.transforms import _sample, elastic_field, random_translate_scale_batch
from vitkit.errors import VitkitError
from vitkit.train.augment import augment_batch
from vitkit.train.train_config import TrainConfig


def test_field_is_uniform_noise_through_scipys_gaussian_filter() -> None:
    alpha, sigma = 34.0, 4.0
    field = elastic_field(torch.Generator().manual_seed(3), 5, (28, 20), alpha, sigma)
    assert field.shape == (5, 28, 20, 2)
    noise = torch.rand((5, 2, 28, 20), generator=torch.Generator().manual_seed(3)) * 2 - 1
    for i in range(5):
        for axis in range(2):
            want = alpha * gaussian_filter(
                noise[i, axis].double().numpy(), sigma, mode="constant", cval=0.0, truncate=3.0
            )
            np.testing.assert_allclose(field[i, ..., axis].numpy(), want, atol=1e-4)
    # Simard's values move the centre of a digit by about 1.4 px (rms), smoothly.
    centre = field[:, 8:20, 6:14]
    assert 0.9 < centre.pow(2).mean().sqrt() < 1.9
    step = (field[:, 1:] - field[:, :-1]).abs().mean()
    assert step < 0.25 * field.abs().mean()


def test_displacement_moves_the_sampling_point_by_pixels() -> None:
    image = torch.zeros(1, 1, 6, 8)
    image[..., 2, 3] = 255.0
    identity = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    field = torch.zeros(1, 6, 8, 2)
    field[..., 0] = 1.0  # every output pixel reads the input 1 px to its right
    field[..., 1] = -2.0  # ... and 2 px above
    out = _sample(image, identity, (6, 8), fill=0.0, displacement=field)
    assert out[0, 0, 4, 2] == pytest.approx(255.0, abs=1e-3)
    assert out.sum() == pytest.approx(255.0, abs=1e-2)


def test_affine_draws_are_those_of_a_run_without() -> None:
    images = torch.rand(6, 1, 14, 14) * 255

    def run(elastic: tuple[float, float] | None) -> torch.Tensor:
        g = torch.Generator().manual_seed(11)
        return random_translate_scale_batch(images, 0.1, (0.9, 1.1), 10.0, g, elastic=elastic)

    plain = run(None)
    torch.testing.assert_close(run((0.0, 4.0)), plain, atol=1e-4, rtol=0)
    bent = run((34.0, 4.0))
    assert torch.equal(bent, run((34.0, 4.0)))  # reproducible from the generator alone
    assert (bent - plain).abs().mean() > 1.0


def test_a_batch_in_parts_is_the_whole_batch() -> None:
    images = torch.rand(8, 1, 12, 12) * 255

    def draw(rows: slice, part: tuple[int, int] | None) -> torch.Tensor:
        g = torch.Generator().manual_seed(2)
        return augment_batch(
            images[rows],
            randaugment=None,
            geometric="digits",
            image_size=(12, 12),
            allow_flip=False,
            generator=g,
            part=part,
            elastic=(30.0, 3.0),
        )

    whole = draw(slice(0, 8), None)
    halves = torch.cat([draw(slice(0, 4), (0, 8)), draw(slice(4, 8), (4, 8))])
    torch.testing.assert_close(halves, whole, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="digits jitter"):
        augment_batch(
            images,
            randaugment=None,
            geometric="inception",
            image_size=(12, 12),
            allow_flip=False,
            generator=torch.Generator(),
            elastic=(30.0, 3.0),
        )


@pytest.mark.parametrize("bad", [(-1.0, 4.0), (101.0, 4.0), (34.0, 0.0), (34.0, 17.0)])
def test_elastic_outside_its_ranges_is_refused(bad: tuple[float, float]) -> None:
    with pytest.raises(VitkitError, match="elastic takes"):
        TrainConfig(elastic=bad)
    cfg = TrainConfig.from_dict(json.loads(json.dumps(TrainConfig(elastic=(34, 4)).to_dict())))
    assert cfg.elastic == (34.0, 4.0)


def test_elastic_without_the_digits_jitter_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(VitkitError, match="needs augment digits"):
        TrainConfig(elastic=(34.0, 4.0), augment="inception")
    args = ["train", "--smoke", "--data", "digits", "--augment", "none", "--elastic", "34", "4"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "needs augment digits" in err and "Traceback" not in err


def test_elastic_on_image_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for c in ("a", "b"):
        (tmp_path / "folder" / c).mkdir(parents=True)
        for i in range(4):
            Image.new("L", (12, 12), 60 * i).save(tmp_path / "folder" / c / f"{i}.png")
    args = ["train", "--smoke", "--data", str(tmp_path / "folder"), "--elastic", "34", "4"]
    assert main([*args, "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--elastic distorts in-memory batches" in err and "folder" in err
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()


def test_train_records_elastic(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--smoke", "--data", "digits", "--elastic", "20", "3", "--no-progress"]
    assert main([*args, "--max-steps", "2", "--out-dir", str(out)]) == 0
    assert json.loads((out / "train_config.json").read_text())["elastic"] == [20.0, 3.0]
