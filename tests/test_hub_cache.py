"""Checkpoints by Hugging Face model id, read from a local cache written here with the real
layout (models--ORG--NAME/refs, snapshots/HASH -> blobs/); huggingface_hub checks the layout."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

import pytest
import torch
from PIL import Image
from references import import_reference

import vitkit
from vitkit.checkpoints import Checkpoint, read_checkpoint, write_checkpoint
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.registry.model_config import PreprocessConfig


def tiny(seed: int = 0, **kw) -> torch.nn.Module:
    base = dict(image_size=8, patch_size=2, num_classes=10, width=32, depth=1, num_heads=2)
    torch.manual_seed(seed)
    model = vitkit.create_model("Ti/2", **{**base, "mlp_dim": 64, **kw})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)  # (zero heads would hide mistakes)
    return model.eval()


def as_ckpt(model: torch.nn.Module) -> Checkpoint:
    return Checkpoint(
        Path("mem"), model.cfg, PreprocessConfig.for_model(model.cfg), dict(model.state_dict())
    )


def cache_folder(cache: Path, repo_id: str, folder: Path, revision: str = "main") -> Path:
    """``folder``'s files as huggingface_hub caches them: blobs named by content hash, the
    snapshot's files symlinks into blobs/, refs/REVISION holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(folder.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    ref = repo / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    return snap


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    c = tmp_path / "hub"
    c.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(c))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return c


def same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(
    ("fmt", "repo_id"),
    [("hf", "google/vit-tiny-test"), ("timm", "timm/vit_tiny_test.augreg_in21k")],
)
def test_load_by_id_equals_load_by_path(cache: Path, tmp_path: Path, fmt: str, repo_id: str):
    model = tiny()
    folder = write_checkpoint(as_ckpt(model), tmp_path / "src", fmt)  # type: ignore[arg-type]
    snap = cache_folder(cache, repo_id, folder)
    hub = pytest.importorskip("huggingface_hub")
    found = hub.snapshot_download(repo_id, cache_dir=cache, local_files_only=True)
    assert Path(found) == snap  # (the layout written is the real one)
    by_id, by_path = read_checkpoint(repo_id), read_checkpoint(folder)
    assert by_id.format == by_path.format == fmt and by_id.path == snap
    assert by_id.model_config == by_path.model_config and by_id.preprocess == by_path.preprocess
    same_state(by_id.state_dict, by_path.state_dict)
    same_state(by_id.state_dict, model.state_dict())
    assert by_id.meta["converted_from"]["model_id"] == repo_id
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(vitkit.load(repo_id)(x), vitkit.load(folder)(x))


def test_revision_by_ref_and_by_commit(cache: Path, tmp_path: Path):
    a = write_checkpoint(as_ckpt(tiny(0)), tmp_path / "a", "hf")
    b = write_checkpoint(as_ckpt(tiny(1)), tmp_path / "b", "hf")
    cache_folder(cache, "org/m", a)
    snap_b = cache_folder(cache, "org/m", b, revision="v2")
    same_state(read_checkpoint("org/m").state_dict, read_checkpoint(a).state_dict)
    same_state(read_checkpoint("org/m@v2").state_dict, read_checkpoint(b).state_dict)
    same_state(read_checkpoint(f"org/m@{snap_b.name}").state_dict, read_checkpoint(b).state_dict)
    with pytest.raises(VitkitError, match=r"org/m@v3: .*no revision 'v3' \(.* holds main, v2\)"):
        read_checkpoint("org/m@v3")


def test_a_local_path_of_the_same_name_wins(cache: Path, tmp_path: Path):
    cache_folder(cache, "org/m", write_checkpoint(as_ckpt(tiny(0)), tmp_path / "a", "hf"))
    local = write_checkpoint(as_ckpt(tiny(1)), tmp_path / "org" / "m", "timm")
    ckpt = read_checkpoint("org/m")  # (the cwd is tmp_path)
    assert ckpt.format == "timm" and ckpt.path == Path("org/m")
    same_state(ckpt.state_dict, read_checkpoint(local).state_dict)


def test_not_cached_is_one_line_with_the_download_command(cache: Path):
    with pytest.raises(VitkitError) as e:
        read_checkpoint("google/vit-base-patch16-224")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("google/vit-base-patch16-224: ")
    assert str(cache) in msg and "models--google--vit-base-patch16-224" in msg
    assert "hf download google/vit-base-patch16-224'" in msg
    with pytest.raises(VitkitError, match=r"hf download org/m --revision v2'"):
        read_checkpoint("org/m@v2")


def test_snapshot_without_weights_or_with_a_missing_blob(cache: Path, tmp_path: Path):
    folder = write_checkpoint(as_ckpt(tiny()), tmp_path / "src", "hf")
    snap = cache_folder(cache, "org/m", folder)
    (snap / "model.safetensors").unlink()  # e.g. 'hf download org/m config.json'
    with pytest.raises(VitkitError) as e:
        read_checkpoint("org/m")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("org/m: the cached snapshot")
    assert "no weights vitkit reads" in msg and "config.json, preprocessor_config.json" in msg
    assert "hf download org/m'" in msg
    snap = cache_folder(cache, "org/n", folder)
    blob = (snap / "model.safetensors").resolve()
    blob.unlink()  # an interrupted clean-up: the link is left, its blob is gone
    with pytest.raises(VitkitError, match=r"org/n: .*model.safetensors: links to missing blobs"):
        read_checkpoint("org/n")
    (snap / "config.json").unlink()
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(VitkitError, match=r"org/n: .* has no config.json \(it holds model"):
        read_checkpoint("org/n")


def test_cache_location_follows_huggingface_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitkit.checkpoints.hf.hub_cache import hub_cache_dir

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub_cache_dir() == tmp_path / "c"


def test_cli_by_id(cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    folder = write_checkpoint(as_ckpt(tiny(in_chans=1)), tmp_path / "s", "hf")
    snap = cache_folder(cache, "org/digits-vit", folder)
    assert main(["inspect", "org/digits-vit", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(snap) and info["format"] == "hf" and info["num_classes"] == 10
    Image.new("L", (8, 8), 128).save(tmp_path / "x.png")
    assert main(["predict", "x.png", "--from", "org/digits-vit", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["top_k"]) == 5
    assert main(["eval", "--from", "org/digits-vit", "--data", "digits"]) == 0
    assert (tmp_path / "org--digits-vit_eval_test" / "eval.json").is_file()  # not in the cache
    assert not list(cache.rglob("eval.json"))
    assert main(["inspect", "org/not-there"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "org/not-there" in err and "hf download org/not-there" in err


@pytest.mark.parametrize("model_args", [True, False])  # (hub folders often have none)
def test_a_timm_hub_folder_by_id_equals_timm(cache: Path, tmp_path: Path, model_args: bool):
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=7)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    save_for_hf(ref, str(tmp_path / "src"), safe_serialization=True)
    if not model_args:
        hub = json.loads((tmp_path / "src" / "config.json").read_text())
        del hub["model_args"]
        (tmp_path / "src" / "config.json").write_text(json.dumps(hub))
    cache_folder(cache, "timm/vit_tiny_test.augreg_in21k", tmp_path / "src")
    if not model_args:  # width 32 is no standard size: the heads are asked for
        with pytest.raises(VitkitError, match=r"^timm/vit_tiny_test.augreg_in21k: .*num_heads"):
            vitkit.load("timm/vit_tiny_test.augreg_in21k")
    model = vitkit.load("timm/vit_tiny_test.augreg_in21k", num_heads=2)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        diff = (model(x) - ref(x)).abs().max().item()
    print(f"timm hub folder by id vs timm: max |logit diff| {diff:.2e}")
    assert diff <= 1e-5


def test_the_guide_s_model_id_example_runs(cache: Path, tmp_path: Path) -> None:
    """docs/guide/checkpoints.md's model-id lines, as written (the placeholder line aside)."""
    from doc_commands import page_commands

    lines = page_commands("docs/guide/checkpoints.md", "Model ids from the local cache")
    lines = [line for line in lines if "ORG/NAME" not in line]
    assert len(lines) == 2, lines
    for fmt, repo_id in (
        ("hf", "google/vit-base-patch16-224"),
        ("timm", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"),
    ):
        folder = write_checkpoint(as_ckpt(tiny()), tmp_path / fmt, fmt)  # type: ignore[arg-type]
        cache_folder(cache, repo_id, folder)
    Image.new("RGB", (20, 12), (200, 120, 40)).save(tmp_path / "cat.jpg")
    for line in lines:
        assert main(shlex.split(line)[1:]) == 0, line


def test_a_ref_or_snapshot_leading_outside_the_cache_is_refused(cache: Path, tmp_path: Path):
    """refs/NAME is a commit hash and snapshots/HASH a folder of the cache: anything else
    would read files from elsewhere under the name of a model id."""
    outside = write_checkpoint(as_ckpt(tiny(0)), tmp_path / "elsewhere" / "x", "hf")
    snap = cache_folder(cache, "org/m", write_checkpoint(as_ckpt(tiny(1)), tmp_path / "a", "hf"))
    refs = snap.parent.parent / "refs"
    (refs / "evil").write_text(os.path.relpath(outside, snap.parent))
    with pytest.raises(VitkitError, match=r"org/m@evil: .*refs/evil holds '\.\./.*not a commit"):
        read_checkpoint("org/m@evil")
    away = snap.parent / ("f" * 40)  # a snapshot that is a link out of the cache
    away.symlink_to(outside, target_is_directory=True)
    (refs / "away").write_text("f" * 40)
    for rev in ("away", "f" * 40):
        with pytest.raises(VitkitError, match=r"leads outside .*snapshots"):
            read_checkpoint(f"org/m@{rev}")
    (refs / "link").symlink_to(tmp_path / "elsewhere" / "ref")
    (tmp_path / "elsewhere" / "ref").write_text(snap.name)
    with pytest.raises(VitkitError, match=r"leads outside .*refs"):
        read_checkpoint("org/m@link")
    same_state(read_checkpoint("org/m").state_dict, read_checkpoint(snap).state_dict)
