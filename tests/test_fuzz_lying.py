"""bench/fuzz_lying.py on a few seeded draws: no lying folder and no preprocessing draw silent."""

from __future__ import annotations

from references import load_bench


def test_a_few_lying_folders_and_preprocessing_draws_are_never_silent():
    fz = load_bench("fuzz_lying", "fuzz_lying_bench")
    result = fz.run(draws=12, seconds=120, seed=1)
    for source in fz.SOURCES:
        counts = result["counts"][source]
        assert sum(counts.values()) == result["draws"] == 12
        assert counts["silent"] == counts["crashed"] == 0, result["examples"]
    assert result["counts"]["lying-timm-folder"]["refused"] > 0
    assert result["counts"]["timm-preprocess"]["exact"] > 0
