"""`hotcold download` and `hotcold preprocess` turn bad input and failed downloads into one line and exit 2."""
from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from hotcold.cli import main


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, expect exit 2 and one error line; return it."""
    assert main([*argv, "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hotcold {argv[0]}: error: "), lines
    return lines[0]


def download(url: str, tmp_path: Path, **spec) -> list[str]:
    return ["download", "--spec", json.dumps({"kind": "criteo-kaggle", "url": url, **spec}),
            "--out", str(tmp_path / "raw"), "--name", "kaggle"]


def tar_gz(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_failed_download(tmp_path: Path, file_server: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = file_server
    assert "HTTP 404" in fails(capsys, *download(f"{url}/missing.tar.gz", tmp_path))


def test_truncated_archive(tmp_path: Path, file_server: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url, root = file_server
    (root / "dac.tar.gz").write_bytes(tar_gz("train.txt", bytes(range(256)) * 1000)[:-200])
    assert "cut short" in fails(capsys, *download(f"{url}/dac.tar.gz", tmp_path))


def test_corrupt_tar(tmp_path: Path, file_server: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url, root = file_server
    raw = bytearray(gzip.decompress(tar_gz("train.txt", b"0\t1\n")))
    raw[148:156] = b"0000000\0"                        # wrong header checksum, magic intact
    (root / "dac.tar.gz").write_bytes(gzip.compress(bytes(raw)))
    line = fails(capsys, *download(f"{url}/dac.tar.gz", tmp_path))
    assert "dac.tar.gz: corrupt archive" in line


def preprocess(tmp_path: Path, spec: dict) -> list[str]:
    return ["preprocess", "--spec", json.dumps(spec), "--raw", str(tmp_path / "raw"), "--out",
            str(tmp_path / "ds"), "--name", "terabyte"]


def test_truncated_gz_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    text = b"".join(b"1" + b"\t%d" % i * 13 + b"\t%08x" % (i * 7919) * 26 + b"\n" for i in range(300))
    (raw / "day_0.gz").write_bytes(gzip.compress(text))
    (raw / "day_1.gz").write_bytes(gzip.compress(text)[:-300])
    (raw / "day_2.gz").write_bytes(b"")
    files = [{"name": f"day_{d}.gz", "day": d} for d in (0, 1)]
    (raw / "source.json").write_text(json.dumps({"files": files}))
    spec = {"kind": "criteo-terabyte", "days": [0, 1]}
    line = fails(capsys, *preprocess(tmp_path, spec))
    assert "day_1.gz: truncated or corrupt gzip file" in line
    files[1] = {"name": "day_2.gz", "day": 1}
    (raw / "source.json").write_text(json.dumps({"files": files}))
    assert "day_2.gz: truncated or corrupt gzip file" in fails(capsys, *preprocess(tmp_path, spec))
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("source", ["{}", '{"files": []}', '{"files": [{"bytes": 3}]}', "not json"])
def test_incomplete_source_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "source.json").write_text(source)
    line = fails(capsys, *preprocess(tmp_path, {"kind": "criteo-kaggle"}))
    assert "source.json" in line and "hotcold download" in line


def test_missing_day(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "source.json").write_text(json.dumps({"files": [{"name": "day_0.gz", "day": 0}]}))
    line = fails(capsys, *preprocess(tmp_path, {"kind": "criteo-terabyte", "days": [0, 1]}))
    assert "day(s) [1]" in line
