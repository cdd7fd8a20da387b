"""Shards in object storage, against a real S3 API served locally (moto's server mode, with
IAM authentication on) and a plain HTTP server: `vitkit shards` writes there, training streams
from there to bitwise the weights of training from the same shards on disk (DataLoader workers
included), resumes mid-epoch to the same order, and a wrong credential, a truncated object and a
bucket that disappears mid-epoch are each one line that never shows a credential."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto")
import boto3  # noqa: E402 (after the skips)
import fsspec  # noqa: E402

from vitkit.checkpoints import LATEST, load_checkpoint  # noqa: E402
from vitkit.cli import main  # noqa: E402
from vitkit.data import load_dataset, make_loader  # noqa: E402
from vitkit.errors import VitkitError  # noqa: E402

TINY = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
TRAIN = ["train", "--model", "Ti/2", *TINY, "--no-progress", "--batch-size", "32", "--epochs", "1"]
TRAIN += ["--max-steps", "6", "--ckpt-every", "3", "--keep-checkpoints", "9", "--threads", "1"]
TRAIN += ["--precision", "fp32", "--num-workers", "2"]
POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fresh_clients() -> None:
    """Forget fsspec's cached S3 client (it holds the credentials it was made with)."""
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local S3 server that checks credentials; its endpoint and a valid key in the
    environment (as AWS's tools read them); bucket 'shards' holding digits as shards."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}  # then every request is signed
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_ACCESS_KEY_ID", "bootstrap")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "bootstrap")
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, log.read_text()
                time.sleep(0.2)
        iam = boto3.session.Session().client("iam")
        iam.create_user(UserName="trainer")
        arn = iam.create_policy(PolicyName="s3", PolicyDocument=json.dumps(POLICY))
        iam.attach_user_policy(UserName="trainer", PolicyArn=arn["Policy"]["Arn"])
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        mp.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        mp.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        _fresh_clients()
        client = boto3.session.Session().client("s3")
        client.create_bucket(Bucket="shards")
        local = tmp_path_factory.mktemp("local") / "digits"
        for out in (str(local), "s3://shards/digits/"):
            assert main(["shards", "digits", out, "--shard-size", "100"]) == 0
        try:
            yield {
                "local": str(local),
                "url": "s3://shards/digits/",
                "secret": key["SecretAccessKey"],
            }
        finally:
            _fresh_clients()
            server.terminate()
            server.wait(timeout=30)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run).state_dict


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]


def test_shards_written_to_s3_are_those_written_to_disk(
    s3: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fs = fsspec.filesystem("s3")
    local = Path(s3["local"])
    index = json.loads((local / "shards.json").read_text())
    assert json.loads(fs.cat_file(s3["url"] + "shards.json")) == index
    files = [e for split in index["splits"].values() for e in split]
    assert len(files) >= 10 and all(e["bytes"] > 0 for e in files)
    for e in files:
        assert fs.cat_file(s3["url"] + e["file"]) == (local / e["file"]).read_bytes()
    assert main(["shards", "digits", s3["url"], "--shard-size", "100"]) == 2
    err = capsys.readouterr().err
    assert "s3://shards/digits/shards.json exists; pass --overwrite" in err


def test_training_from_s3_equals_training_from_disk_and_resumes(
    s3: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two DataLoader workers per run: each reads its own shards, from S3 or from disk; the
    same samples in the same order give bitwise the same weights. Killed after step 3, the S3
    run continues mid-epoch (reading through a local cache) to the same weights again."""
    disk, cloud = tmp_path / "disk", tmp_path / "cloud"
    assert main([*TRAIN, "--data", s3["local"], "--out-dir", str(disk)]) == 0
    assert main([*TRAIN, "--data", s3["url"], "--out-dir", str(cloud)]) == 0
    _assert_bitwise(_weights(cloud), _weights(disk))
    killed = tmp_path / "killed"
    (killed / "checkpoints").mkdir(parents=True)
    shutil.copy(cloud / "train_config.json", killed)
    shutil.copytree(
        cloud / "checkpoints" / "step_00000003", killed / "checkpoints" / "step_00000003"
    )
    (killed / "checkpoints" / LATEST).write_text("step_00000003\n")
    cache = tmp_path / "cache"
    args = ["--data", s3["url"], "--out-dir", str(killed), "--shard-cache", str(cache)]
    assert main([*TRAIN, *args, "--resume", "auto"]) == 0
    _assert_bitwise(_weights(killed), _weights(cloud))
    assert len(list(cache.glob("*.tar"))) >= 2  # the shards read were kept
    out = capsys.readouterr()
    for text in [out.out, out.err, *(p.read_text() for p in killed.glob("*.json*"))]:
        assert s3["secret"] not in text


def _train_loader(url: str, read_ahead: int = 2) -> Iterator[object]:
    data = load_dataset(url, "train", image_size=None)
    loader = make_loader(data, 32, shuffle=True, drop_last=True, seed=0, read_ahead=read_ahead)
    return iter(loader)


def test_a_wrong_credential_is_one_line_without_the_secret(
    s3: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789")
    _fresh_clients()
    try:
        code = main([*TRAIN, "--data", s3["url"], "--out-dir", str(tmp_path / "run")])
    finally:
        monkeypatch.undo()
        _fresh_clients()
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "s3://shards/digits/shards.json: access denied" in err
    assert "check the credentials the environment gives" in err
    assert "not-the-secret-0123456789" not in err and s3["secret"] not in err


def test_a_truncated_object_and_a_vanished_bucket_are_one_line(s3: dict[str, str]) -> None:
    client = boto3.session.Session().client("s3")
    for bucket in ("cut", "gone"):
        client.create_bucket(Bucket=bucket)
        for name in os.listdir(s3["local"]):
            data = (Path(s3["local"]) / name).read_bytes()
            client.put_object(Bucket=bucket, Key=f"digits/{name}", Body=data)
    index = json.loads((Path(s3["local"]) / "shards.json").read_text())
    first = index["splits"]["train"][0]
    whole = (Path(s3["local"]) / first["file"]).read_bytes()
    client.put_object(Bucket="cut", Key=f"digits/{first['file']}", Body=whole[: len(whole) // 2])
    with pytest.raises(
        VitkitError, match=r"truncated object, [\d,]+ bytes where shards.json records"
    ):
        for _ in _train_loader("s3://cut/digits/"):
            pass

    with pytest.raises(VitkitError, match=r"s3://cut/nothing/shards.json: not found; shards in"):
        _train_loader("s3://cut/nothing/")

    batches = _train_loader("s3://gone/digits/", read_ahead=1)
    next(batches)  # reading has begun; then the bucket disappears
    listed = client.list_objects_v2(Bucket="gone")["Contents"]
    client.delete_objects(Bucket="gone", Delete={"Objects": [{"Key": o["Key"]} for o in listed]})
    client.delete_bucket(Bucket="gone")
    with pytest.raises(
        VitkitError,
        match=r"s3://gone/digits/train-\d+\.tar: not found, the object or its bucket is gone",
    ):
        for _ in batches:
            pass


class _Flaky(http.server.SimpleHTTPRequestHandler):
    """Serves a directory; the first request for each shard is answered 503 (a busy server)."""

    failed: set[str] = set()

    def do_GET(self) -> None:
        if self.path.endswith(".tar") and self.path not in self.failed:
            self.failed.add(self.path)
            self.send_error(503, "busy")
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


def test_shards_over_plain_https_style_http(s3: dict[str, str], tmp_path: Path) -> None:
    """The same shards served by a plain HTTP server (as a CDN or https:// bucket would), whose
    first answer for every shard is 503: each is retried, and training reads them to the
    weights of the run from disk."""
    handler = functools.partial(_Flaky, directory=s3["local"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        short = [a if a != "6" else "3" for a in TRAIN]
        assert main([*short, "--data", url, "--out-dir", str(tmp_path / "http")]) == 0
        assert main([*short, "--data", s3["local"], "--out-dir", str(tmp_path / "disk")]) == 0
    finally:
        server.shutdown()
    assert len(_Flaky.failed) >= 2  # (each shard read was refused once, then retried)
    _assert_bitwise(_weights(tmp_path / "http"), _weights(tmp_path / "disk"))
