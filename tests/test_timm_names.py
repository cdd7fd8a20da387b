"""vitkit's table of timm architecture names equals the installed timm's registry, so a name
timm adds or moves to another module is noticed here rather than read as the nearest ViT."""

from __future__ import annotations

import pytest
from references import import_reference

from vitkit.checkpoints.timm.naflexvit import ENTRIES
from vitkit.checkpoints.timm.names import (
    EVA_NAMES,
    NAFLEX_NAMES,
    OTHER_MODULES,
    RELPOS_MODULES,
    TIMM_VERSION,
    VIT_NAMES,
    check_architecture,
)
from vitkit.errors import VitkitError


def test_tables_equal_the_installed_timm():
    timm = import_reference("timm")
    if timm.__version__ != TIMM_VERSION:
        pytest.skip(f"tables are timm {TIMM_VERSION}'s; installed {timm.__version__}")
    vit = {
        n
        for m in ("vision_transformer", "deit", "vision_transformer_hybrid")
        for n in timm.list_models(module=m)
    }
    assert vit == VIT_NAMES
    for module, (_, names) in OTHER_MODULES.items():
        read = EVA_NAMES if module == "eva" else frozenset()
        assert not names & read
        assert names | read == set(timm.list_models(module=module)), module
    for module, names in RELPOS_MODULES.items():  # read by checkpoints/timm/beit_relpos.py
        assert names == set(timm.list_models(module=module)), module
    assert NAFLEX_NAMES == set(timm.list_models(module="naflexvit")) == set(ENTRIES)


def test_names_read_refused_and_unknown():
    assert check_architecture("vit_base_patch16_224.augreg_in21k", "f") == "vit_base_patch16_224"
    assert check_architecture("vit_small_patch16_dinov3", "f") == "vit_small_patch16_dinov3"
    assert check_architecture("eva02_tiny_patch14_224.mim_in22k", "f") == "eva02_tiny_patch14_224"
    assert check_architecture("vit_base_patch16_sapiens2.fb", "f") == "vit_base_patch16_sapiens2"
    assert not OTHER_MODULES["eva"][1]  # every eva.py entry is read
    assert (
        check_architecture("beit_base_patch16_224.in22k_ft_in22k", "f") == "beit_base_patch16_224"
    )
    assert (
        check_architecture("vit_srelpos_small_patch16_224", "f") == "vit_srelpos_small_patch16_224"
    )
    assert check_architecture("naflexvit_base_patch16_gap.e300_s576_in1k", "f") == (
        "naflexvit_base_patch16_gap"
    )
    with pytest.raises(VitkitError, match="'resnet50' is not one of the timm ViTs"):
        check_architecture("resnet50", "f")
