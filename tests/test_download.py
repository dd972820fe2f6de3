"""Resumable verified downloads and the dataset sources, against a local fault-injecting HTTP server."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import socket
import struct
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hotcold.data.sources.download import DownloadError, download, file_sha256
from hotcold.data.sources.catalog import (describe_local, fetch_criteo_kaggle, fetch_criteo_terabyte,
                                  locate_taobao)

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    """Serves ``server.root`` with ``Range: bytes=N-`` support and the faults in ``server.faults``.

    Faults per path: ``fail`` (statuses answered first, one per request), ``cut_after`` (first
    response stops after that many body bytes), ``stall_after`` (likewise, then hangs until
    teardown), ``reset_after`` (likewise, then a TCP reset), ``chunked_cut`` (first response
    chunked, cut after one chunk of that size), ``ignore_range`` (always 200), ``range_from_zero``
    (206 that starts at byte 0), ``redirect`` (302 to that path).
    """

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            srv.requests.append((self.path, self.headers.get("Range")))
            fault = srv.faults.setdefault(self.path, {})
            status = fault["fail"].pop(0) if fault.get("fail") else None
            cut = fault.pop("cut_after", None)
            stall = fault.pop("stall_after", None)
            reset = fault.pop("reset_after", None)
            chunked = fault.pop("chunked_cut", None)
        if status is not None:
            self.send_error(status)
            return
        if fault.get("redirect"):
            self.send_response(302)
            self.send_header("Location", fault["redirect"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        file = srv.root / self.path.lstrip("/")
        if not file.is_file():
            self.send_error(404)
            return
        data = file.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        start = 0
        if m and not fault.get("ignore_range"):
            start = 0 if fault.get("range_from_zero") else int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        body = data[start:]
        if chunked is not None:
            self.protocol_version = "HTTP/1.1"
        self.send_response(206 if m and not fault.get("ignore_range") else 200)
        if m and not fault.get("ignore_range"):
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if chunked is not None:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n" % (chunked, body[:chunked]))
            self.close_connection = True
            return
        if fault.get("content_type"):
            self.send_header("Content-Type", fault["content_type"])
        if not fault.get("no_length"):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        limit = next((x for x in (cut, stall, reset) if x is not None), None)
        self.wfile.write(body if limit is None else body[:limit])
        self.wfile.flush()
        if stall is not None:
            srv.release.wait(10)
        if reset is not None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = False  # server_close() joins the handler threads
    srv.root, srv.faults, srv.requests = root, {}, []
    srv.lock, srv.release = threading.Lock(), threading.Event()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()
    thread.join(5)
    assert not thread.is_alive()


def _serve(server, name: str = "f.bin", data: bytes = PAYLOAD) -> str:
    path = server.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return f"{server.url}/{name}"


def _get(url: str, dest: Path, **kw) -> str:
    kw = {"backoff": 0, "progress": False, **kw}
    return download(url, dest, **kw)


def test_plain_download_with_progress(server, tmp_path):
    dest = tmp_path / "out" / "f.bin"
    assert _get(_serve(server), dest, sha256=SHA.upper(), size=len(PAYLOAD), progress=True) == SHA
    assert dest.read_bytes() == PAYLOAD
    assert not dest.with_name("f.bin.part").exists()
    assert server.requests == [("/f.bin", None)]


def test_resume_after_cut_connection(server, tmp_path):
    url, k = _serve(server), 30_001
    server.faults["/f.bin"] = {"cut_after": k}
    dest = tmp_path / "f.bin"
    assert _get(url, dest, chunk=4096) == SHA
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/f.bin", None), ("/f.bin", f"bytes={k}-")]


def test_resume_existing_part_hashes_whole_file(server, tmp_path):
    url = _serve(server)
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.part").write_bytes(PAYLOAD[:5000])
    assert _get(url, dest, sha256=SHA) == SHA
    assert server.requests == [("/f.bin", "bytes=5000-")]


def test_timeout_is_retried_and_resumed(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"stall_after": 777}
    dest = tmp_path / "f.bin"
    assert _get(url, dest, timeout=0.3, sha256=SHA) == SHA
    assert server.requests[-1] == ("/f.bin", "bytes=777-")


def test_connection_reset_is_retried(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"reset_after": 20_000}
    dest = tmp_path / "f.bin"
    assert _get(url, dest, sha256=SHA) == SHA
    assert dest.read_bytes() == PAYLOAD and len(server.requests) == 2


def test_incomplete_chunked_read_is_resumed(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"chunked_cut": 4321}
    dest = tmp_path / "f.bin"
    assert _get(url, dest, sha256=SHA) == SHA
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=4321-")]


def test_redirect_keeps_range(server, tmp_path):
    _serve(server, "real.bin")
    server.faults["/alias.bin"] = {"redirect": "/real.bin"}
    server.faults["/real.bin"] = {"cut_after": 999}
    dest = tmp_path / "f.bin"
    assert _get(f"{server.url}/alias.bin", dest, sha256=SHA) == SHA
    assert server.requests[-1] == ("/real.bin", "bytes=999-")


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"ignore_range": True, "cut_after": 10_000}
    dest = tmp_path / "f.bin"
    assert _get(url, dest, sha256=SHA) == SHA
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=10000-")]


def test_range_answered_from_wrong_start_restarts(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"range_from_zero": True}
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.part").write_bytes(b"x" * 100)
    assert _get(url, dest) == SHA
    assert server.requests == [("/f.bin", "bytes=100-"), ("/f.bin", None)]


def test_complete_part_answered_416_is_verified(server, tmp_path):
    url = _serve(server)
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.part").write_bytes(PAYLOAD)
    assert _get(url, dest, sha256=SHA) == SHA
    assert server.requests == [("/f.bin", f"bytes={len(PAYLOAD)}-")]


def test_oversized_part_answered_416_restarts(server, tmp_path):
    url = _serve(server)
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.part").write_bytes(PAYLOAD + b"junk")
    assert _get(url, dest) == SHA
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/f.bin", f"bytes={len(PAYLOAD) + 4}-"), ("/f.bin", None)]


def test_transient_503_then_success(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"fail": [503, 502]}
    assert _get(url, tmp_path / "f.bin", sha256=SHA) == SHA
    assert len(server.requests) == 3


def test_retries_exhausted(server, tmp_path):
    url = _serve(server)
    server.faults["/f.bin"] = {"fail": [503] * 5}
    dest = tmp_path / "f.bin"
    with pytest.raises(DownloadError, match="503") as err:
        _get(url, dest, retries=2)
    assert url in str(err.value)
    assert len(server.requests) == 3 and not dest.exists()


def test_404_fails_at_once(server, tmp_path):
    url = f"{server.url}/missing.bin"
    dest = tmp_path / "missing.bin"
    with pytest.raises(DownloadError, match="404") as err:
        _get(url, dest)
    assert url in str(err.value)
    assert len(server.requests) == 1
    assert not dest.exists()


def test_wrong_sha256_keeps_the_download_aside_and_fails_once(server, tmp_path):
    url, typo = _serve(server), SHA[:-1] + ("0" if SHA[-1] != "0" else "1")
    dest = tmp_path / "f.bin"
    with pytest.raises(DownloadError) as err:
        _get(url, dest, sha256=typo)
    assert typo in str(err.value) and SHA in str(err.value)
    assert server.requests == [("/f.bin", None)]                 # fetched once, not three times
    kept = tmp_path / f"f.bin.sha256-{SHA[:12]}"
    assert str(kept) in str(err.value) and kept.read_bytes() == PAYLOAD and not dest.exists()
    assert _get(url, dest, sha256=SHA) == SHA                    # the corrected checksum finds it
    assert dest.read_bytes() == PAYLOAD and not kept.exists() and len(server.requests) == 1


def test_stale_part_with_wrong_sha256_is_fetched_from_scratch_once(server, tmp_path):
    url = _serve(server)
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.part").write_bytes(b"x" * 5000)       # another version of the file
    assert _get(url, dest, sha256=SHA) == SHA
    assert server.requests == [("/f.bin", "bytes=5000-"), ("/f.bin", None)]


def test_wrong_size_fails_without_reading_body(server, tmp_path):
    url = _serve(server)
    dest = tmp_path / "f.bin"
    with pytest.raises(DownloadError, match=f"expected 123 bytes.*{len(PAYLOAD)}"):
        _get(url, dest, size=123)
    assert len(server.requests) == 1 and not dest.exists()


def test_existing_file_failing_its_checksum_is_kept_and_not_refetched(server, tmp_path):
    url, typo = _serve(server), "ab" * 32
    dest = tmp_path / "f.bin"
    dest.write_bytes(PAYLOAD)                                   # a good multi-GB archive, a typo in the config
    with pytest.raises(DownloadError, match="left in place") as err:
        _get(url, dest, sha256=typo)
    assert typo in str(err.value) and SHA in str(err.value)
    assert dest.read_bytes() == PAYLOAD and server.requests == []


def test_good_dest_makes_no_request(server, tmp_path):
    dest = tmp_path / "f.bin"
    dest.write_bytes(PAYLOAD)
    url = f"{server.url}/f.bin"  # not served: any request would fail
    assert _get(url, dest, sha256=SHA, size=len(PAYLOAD)) == SHA
    assert _get(url, dest, size=len(PAYLOAD)) == SHA
    assert _get(url, dest) == SHA
    assert server.requests == []


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_fetch_criteo_kaggle(server, tmp_path):
    train = b"0\t1\t\ta\n1\t2\t3\tb\n0\t\t4\tc\n"
    archive = _tar_gz({"readme.txt": b"hi\n", "train.txt": train, "test.txt": b"x\n"})
    url = _serve(server, "dac.tar.gz", archive)
    out = tmp_path / "kaggle"
    prov = fetch_criteo_kaggle(out, url=url, sha256=hashlib.sha256(archive).hexdigest(), progress=False)
    assert (out / "train.txt").read_bytes() == train
    assert prov["url"] == url and prov["bytes"] == len(archive)
    assert prov["sha256"] == hashlib.sha256(archive).hexdigest()
    assert prov["files"] == [{"name": "train.txt", "bytes": len(train),
                              "sha256": hashlib.sha256(train).hexdigest(), "lines": 3}]
    assert json.loads((out / "source.json").read_text()) == prov
    assert not list(out.glob("*.part")) and not list(out.glob("*.tmp"))
    mtime = (out / "train.txt").stat().st_mtime_ns
    assert fetch_criteo_kaggle(out, url=url, progress=False) == prov
    assert (out / "train.txt").stat().st_mtime_ns == mtime
    (out / "train.txt").unlink()
    assert fetch_criteo_kaggle(out, url=url, progress=False) == prov
    assert (out / "train.txt").read_bytes() == train
    assert len(server.requests) == 1


def test_fetch_criteo_kaggle_without_train_txt(server, tmp_path):
    url = _serve(server, "dac.tar.gz", _tar_gz({"readme.txt": b"hi\n"}))
    with pytest.raises(DownloadError, match="train.txt"):
        fetch_criteo_kaggle(tmp_path / "k", url=url, progress=False)


def test_fetch_criteo_terabyte(server, tmp_path):
    days = {d: gzip.compress(f"day {d}\n".encode()) for d in (0, 1, 2)}
    for d, data in days.items():
        _serve(server, f"tb/day_{d}.gz", data)
    out = tmp_path / "tb"
    prov = fetch_criteo_terabyte(out, days=[1, 0], base_url=f"{server.url}/tb/", progress=False)
    assert [f["name"] for f in prov["files"]] == ["day_0.gz", "day_1.gz"]
    for f, d in zip(prov["files"], (0, 1)):
        assert (out / f["name"]).read_bytes() == days[d]
        assert f["sha256"] == hashlib.sha256(days[d]).hexdigest() and f["url"].startswith(server.url)
    assert prov["bytes"] == len(days[0]) + len(days[1])
    fetch_criteo_terabyte(out, days=[2], base_url=f"{server.url}/tb", progress=False)
    recorded = json.loads((out / "source.json").read_text())
    assert [f["day"] for f in recorded["files"]] == [0, 1, 2]


@pytest.mark.parametrize("days", [[0, 24], [-1], [], [True], ["3"]])
def test_fetch_criteo_terabyte_bad_days(server, tmp_path, days):
    with pytest.raises(ValueError, match="0..23"):
        fetch_criteo_terabyte(tmp_path, days=days, base_url=server.url, progress=False)
    assert server.requests == []


def test_locate_taobao(tmp_path):
    for source in (None, "", str(tmp_path / "nowhere" / "UserBehavior.csv")):
        with pytest.raises(FileNotFoundError) as err:
            locate_taobao(source)
        msg = str(err.value)
        for needle in ("UserBehavior.csv", "tianchi.aliyun.com/dataset/649", "datasets.taobao.source",
                       "user_id,item_id,category_id,behavior_type,timestamp"):
            assert needle in msg
    assert "nowhere" in msg
    csv = tmp_path / "UserBehavior.csv"
    csv.write_bytes(b"1,2,3,pv,1511544070\n")
    assert locate_taobao(str(csv)) == csv
    assert locate_taobao(tmp_path) == csv
    info = describe_local(csv)
    assert info["sha256"] == file_sha256(csv) and info["bytes"] == csv.stat().st_size
    assert info["files"] == [{"name": "UserBehavior.csv", "bytes": info["bytes"], "sha256": info["sha256"]}]


GZ = gzip.compress(bytes(range(256)) * 4000 + PAYLOAD)


def test_existing_file_without_checksum_is_verified(server, tmp_path):
    url = _serve(server, "d.gz", GZ)
    dest = tmp_path / "d.gz"
    dest.write_bytes(GZ[:-100])                                 # cut short, e.g. copied in by hand
    assert _get(url, dest, fmt="gzip") == hashlib.sha256(GZ).hexdigest()
    assert dest.read_bytes() == GZ and (tmp_path / "d.gz.rejected").read_bytes() == GZ[:-100]
    assert len(server.requests) == 1
    assert _get(url, dest, fmt="gzip") == hashlib.sha256(GZ).hexdigest() and len(server.requests) == 1


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/octet-stream"])
def test_error_page_with_status_200_is_not_saved(server, tmp_path, content_type):
    url = _serve(server, "d.gz", b"<!DOCTYPE html><html><body>Please log in</body></html>\n")
    server.faults["/d.gz"] = {"content_type": content_type}
    dest = tmp_path / "out" / "d.gz"
    with pytest.raises(DownloadError, match=r"text/html|not a gzip file: it starts with '<!DOCTYPE html>"):
        _get(url, dest, fmt="gzip")
    assert list(dest.parent.iterdir()) == []
    _serve(server, "d.gz", GZ)
    server.faults["/d.gz"] = {}
    assert _get(url, dest, fmt="gzip") == hashlib.sha256(GZ).hexdigest()     # and is fetched again later


def test_reply_without_length_cut_short_is_resumed(server, tmp_path):
    url = _serve(server, "d.gz", GZ)
    server.faults["/d.gz"] = {"no_length": True, "cut_after": len(GZ) // 2}
    dest = tmp_path / "d.gz"
    assert _get(url, dest, fmt="gzip") == hashlib.sha256(GZ).hexdigest()
    assert dest.read_bytes() == GZ
    assert server.requests == [("/d.gz", None), ("/d.gz", f"bytes={len(GZ) // 2}-")]


def test_terabyte_checksums_per_day_are_honoured(server, tmp_path):
    days = {d: gzip.compress(f"day {d}\n".encode()) for d in (0, 1)}
    for d, data in days.items():
        _serve(server, f"tb/day_{d}.gz", data)
    good = {0: hashlib.sha256(days[0]).hexdigest(), 1: "cd" * 32}
    with pytest.raises(DownloadError, match="day_1.gz.*" + "cd" * 32):
        fetch_criteo_terabyte(tmp_path / "tb", days=[0, 1], base_url=f"{server.url}/tb", sha256=good,
                              progress=False)
    assert (tmp_path / "tb" / "day_0.gz").read_bytes() == days[0]


def test_every_checksum_key_of_the_schema_is_honoured(server, tmp_path):
    from hotcold.config import ConfigError
    from hotcold.data.sources.prepare import fetch, preprocess
    from hotcold.data.sources.source_config import SourceConfig

    with pytest.raises(ConfigError, match="criteo-terabyte has one file per day"):
        SourceConfig.from_dict({"kind": "criteo-terabyte", "sha256": SHA})
    with pytest.raises(ConfigError, match="criteo-kaggle has one file"):
        SourceConfig.from_dict({"kind": "criteo-kaggle", "sha256": {0: SHA}})
    with pytest.raises(ConfigError, match="days 0..23"):
        SourceConfig.from_dict({"kind": "criteo-terabyte", "sha256": {24: SHA}})
    with pytest.raises(ConfigError, match="64 hex digits"):
        SourceConfig.from_dict({"kind": "taobao", "sha256": "abc"})
    assert SourceConfig.from_dict({"kind": "criteo-terabyte", "sha256": {"3": SHA.upper()}}).sha256 == {3: SHA}
    for d in (0, 1):
        _serve(server, f"tb/day_{d}.gz", gzip.compress(f"day {d}\n".encode()))
    cfg = SourceConfig.from_dict({"kind": "criteo-terabyte", "url": f"{server.url}/tb", "days": [0, 1],
                                  "sha256": {"1": "ef" * 32}})
    with pytest.raises(DownloadError, match="ef" * 32):
        fetch(cfg, tmp_path / "tb", name="terabyte", progress=False)
    csv = tmp_path / "UserBehavior.csv"
    csv.write_bytes(b"1,2,3,pv,1511544070\n")
    taobao = SourceConfig.from_dict({"kind": "taobao", "path": str(csv), "sha256": "ab" * 32})
    with pytest.raises(ValueError, match="sha256 mismatch.*" + "ab" * 32):
        fetch(taobao, tmp_path / "raw", name="taobao", progress=False)
    taobao = SourceConfig.from_dict({"kind": "taobao", "path": str(csv), "sha256": file_sha256(csv)})
    fetch(taobao, tmp_path / "raw", name="taobao", progress=False)
    csv.write_bytes(b"1,2,3,pv,1511544071\n")                  # changed after the download step
    with pytest.raises(ValueError, match="configured checksum"):
        preprocess(taobao, tmp_path / "raw", tmp_path / "ds", name="taobao", progress=False)


def test_terabyte_fetches_every_day_then_lists_the_failed_ones(server, tmp_path):
    days = {d: gzip.compress(f"day {d}\n".encode()) for d in range(4)}
    for d in (0, 1, 2):                                          # day 3 is missing on the server: 404
        _serve(server, f"tb/day_{d}.gz", days[d])
    sums = {d: hashlib.sha256(days[d]).hexdigest() for d in range(4)}
    sums[1] = "cd" * 32                                          # day 1's checksum is wrong
    out = tmp_path / "tb"
    with pytest.raises(DownloadError) as err:
        fetch_criteo_terabyte(out, days=[0, 1, 2, 3], base_url=f"{server.url}/tb", sha256=sums, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "2 of 4 day files failed (day_1.gz, day_3.gz)" in msg
    assert "cd" * 32 in msg and "404" in msg
    assert sorted(p for p, _ in server.requests) == [f"/tb/day_{d}.gz" for d in range(4)]   # every day tried
    assert (out / "day_0.gz").read_bytes() == days[0] and (out / "day_2.gz").read_bytes() == days[2]
    assert [f["day"] for f in json.loads((out / "source.json").read_text())["files"]] == [0, 2]


HTML = b"<!DOCTYPE html>\n<html><head><title>Error</title></head><body>Quota exceeded</body></html>\n"


@pytest.mark.parametrize("fmt", ["gzip", "tar", None])
@pytest.mark.parametrize("body", [HTML, b"\n  <html><body>Please log in</body></html>",
                                  b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code></Error>"])
def test_error_page_with_a_configured_sha256_is_named_and_not_kept(server, tmp_path, fmt, body):
    url = _serve(server, "d.gz", body)
    server.faults["/d.gz"] = {"content_type": "application/octet-stream"}
    dest = tmp_path / "out" / "d.gz"
    with pytest.raises(DownloadError) as err:
        _get(url, dest, sha256=SHA, fmt=fmt)
    msg = str(err.value)
    page = "XML" if body.startswith(b"<?xml") else "HTML"
    assert f"the server returned an {page} page" in msg and url in msg and "\n" not in msg
    assert "correct the configured sha256" not in msg and "kept as" not in msg
    assert list(dest.parent.iterdir()) == []                    # nothing half-written, nothing kept aside


def test_text_html_reply_is_named_an_html_page(server, tmp_path):
    url = _serve(server, "d.gz", HTML)
    server.faults["/d.gz"] = {"content_type": "text/html; charset=utf-8"}
    dest = tmp_path / "out" / "d.gz"
    with pytest.raises(DownloadError, match=r"returned an HTML page \(text/html\)"):
        _get(url, dest, sha256=SHA, fmt="gzip")
    assert list(dest.parent.iterdir()) == []


def test_archive_with_a_wrong_sha256_is_still_kept_aside(server, tmp_path):
    url = _serve(server, "d.gz", GZ)                             # a real gzip: the checksum may be the typo
    dest = tmp_path / "d.gz"
    with pytest.raises(DownloadError, match="correct the configured sha256"):
        _get(url, dest, sha256=SHA, fmt="gzip")
    assert (tmp_path / f"d.gz.sha256-{hashlib.sha256(GZ).hexdigest()[:12]}").read_bytes() == GZ


def test_existing_error_page_with_a_configured_sha256_is_set_aside_and_fetched(server, tmp_path):
    url = _serve(server, "d.gz", GZ)
    dest = tmp_path / "d.gz"
    dest.write_bytes(HTML)                                       # saved by an older version
    assert _get(url, dest, sha256=hashlib.sha256(GZ).hexdigest(), fmt="gzip") == hashlib.sha256(GZ).hexdigest()
    assert dest.read_bytes() == GZ and (tmp_path / "d.gz.rejected").read_bytes() == HTML


def test_kaggle_archive_replaced_by_an_error_page(server, tmp_path):
    url = _serve(server, "dac.tar.gz", HTML)
    out = tmp_path / "kaggle"
    with pytest.raises(DownloadError, match="the server returned an HTML page"):
        fetch_criteo_kaggle(out, url=url, sha256=SHA, progress=False)
    assert list(out.iterdir()) == []
