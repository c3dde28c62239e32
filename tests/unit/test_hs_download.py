"""The download path (pooch), against a local HTTP server on 127.0.0.1 (never the real site)."""

from __future__ import annotations

import functools
import http.server
import io
import shutil

import numpy as np
import pytest

from hyperspectral.datasets import DatasetError, download, load_scene
from hyperspectral.datasets.download import download_file, git_blob_sha1, sha256_of

from .hs_fixtures import empty_dir, fake_info, serve_directory, write_fake_scene


@pytest.fixture(autouse=True)
def no_retry(monkeypatch):
    """A failure is final at once (pooch would wait 1 s, then 2 s, between retries)."""
    monkeypatch.setattr(download, "RETRIES", 0)


@pytest.fixture()
def served(tmp_path, monkeypatch):
    """A folder with the fake scene, served on loopback; the user cache is a fresh folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("LBTRAIN_DATA", raising=False)
    src = tmp_path / "remote"
    write_fake_scene(src)
    with serve_directory(src) as url:
        yield src, url


def test_download_writes_the_file_and_reports_progress(served, tmp_path):
    src, url = served
    progress = io.StringIO()
    dest = download_file(
        url + "fake_cube.mat",
        tmp_path / "dl" / "cube.mat",
        sha256_of(src / "fake_cube.mat"),
        progress=progress,
    )
    assert dest.read_bytes() == (src / "fake_cube.mat").read_bytes()
    # tqdm's bar, since the server sends Content-Length; it ends full.
    assert "downloading cube.mat:" in progress.getvalue()
    assert "100%|" in progress.getvalue() and progress.getvalue().endswith("\n")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["cube.mat"]  # no temp left


def test_a_verified_file_already_there_is_not_downloaded_again(served, tmp_path):
    """pooch's cache: a matching file is kept, one that does not match is replaced."""
    src, url = served
    good, dest = sha256_of(src / "fake_cube.mat"), tmp_path / "dl" / "cube.mat"
    download_file(url + "fake_cube.mat", dest, good, progress=None)
    # No server at this address: the file already there is returned as it is.
    assert download_file("http://127.0.0.1:9/fake_cube.mat", dest, good, progress=None) == dest
    dest.write_bytes(b"damaged")
    download_file(url + "fake_cube.mat", dest, good, progress=None)
    assert dest.read_bytes() == (src / "fake_cube.mat").read_bytes()


def test_checksum_mismatch_discards_the_download(served, tmp_path):
    """pooch's ValueError becomes one line: the address, both digests and the fix."""
    src, url = served
    dest = tmp_path / "dl" / "cube.mat"
    with pytest.raises(DatasetError) as err:
        download_file(url + "fake_cube.mat", dest, "0" * 64, progress=None)
    msg = str(err.value)
    got = sha256_of(src / "fake_cube.mat")
    assert msg.startswith(f"checksum mismatch for {url}fake_cube.mat: sha256 {got}, ")
    assert f"expected {'0' * 64} (1 try); the file was discarded, check the address" in msg
    assert "\n" not in msg
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # pooch's temporary file is gone too


def test_missing_remote_file_is_a_clear_error(served, tmp_path):
    """A 404 (requests' HTTPError) becomes one line with the address, the status and the fix."""
    _src, url = served
    with pytest.raises(DatasetError) as err:
        download_file(url + "nothere.mat", tmp_path / "x.mat", None, progress=None)
    msg = str(err.value)
    assert msg == (
        f"could not download {url}nothere.mat (HTTP 404 File not found, 1 try); "
        f"download it by hand and place it at {tmp_path / 'x.mat'}"
    )
    assert list(tmp_path.iterdir()) == [tmp_path / "remote"]  # nothing written


def test_refused_connection_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError) as err:
        download_file("http://127.0.0.1:9/f.mat", tmp_path / "f.mat", None, progress=None)
    msg = str(err.value)
    assert msg.startswith("could not download http://127.0.0.1:9/f.mat (ConnectionError: ")
    assert "Connection refused" in msg and "place it at" in msg and "\n" not in msg


class _FlakyHandler(http.server.SimpleHTTPRequestHandler):
    """Answers 503 to the first request, then serves the folder."""

    hits = 0

    def do_GET(self) -> None:  # noqa: N802 - stdlib hook name
        type(self).hits += 1
        if type(self).hits == 1:
            self.send_error(503)
        else:
            super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_a_failed_attempt_is_retried(served, tmp_path, monkeypatch):
    """pooch's retry_if_failed: one 503, then the file (after pooch's 1 s wait)."""
    src, _url = served
    monkeypatch.setattr(download, "RETRIES", 1)
    handler = type("Flaky", (_FlakyHandler,), {"hits": 0})
    with serve_directory(src, functools.partial(handler, directory=str(src))) as url:
        dest = download_file(
            url + "fake_gt.mat", tmp_path / "gt.mat", sha256_of(src / "fake_gt.mat"), progress=None
        )
    assert handler.hits == 2
    assert dest.read_bytes() == (src / "fake_gt.mat").read_bytes()


class _TruncatingHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib hook name
        self.send_response(200)
        self.send_header("Content-Length", "10000")
        self.end_headers()
        self.wfile.write(b"x" * 100)  # then hang up early

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_truncated_download_leaves_nothing_behind(tmp_path):
    with serve_directory(tmp_path, _TruncatingHandler) as url:
        with pytest.raises(DatasetError, match=r"could not download .*100 bytes read, 9900 more"):
            download_file(url + "f.mat", tmp_path / "dl" / "f.mat", None, progress=None)
    assert list((tmp_path / "dl").iterdir()) == []


def test_load_scene_downloads_into_cache_then_reads_offline(served, tmp_path):
    src, url = served
    info = fake_info(
        cube_sha=sha256_of(src / "fake_cube.mat"), gt_sha=sha256_of(src / "fake_gt.mat")
    )
    scene = load_scene(info, empty_dir(tmp_path), mirror=url, progress=None)
    cache = tmp_path / "xdg" / "lbtrain"
    assert (cache / "fake_cube.mat").is_file() and (cache / "fake_gt.mat").is_file()
    # Once cached, no server is needed: point the mirror at a closed port.
    again = load_scene(info, empty_dir(tmp_path), mirror="http://127.0.0.1:9/", progress=None)
    np.testing.assert_array_equal(scene.cube, again.cube)


def test_a_failed_download_says_to_put_the_file_in_the_folder_the_user_named(served, tmp_path):
    # The folder holds the cube only: the fix once named the user cache instead.
    src, _url = served
    mine = empty_dir(tmp_path)
    shutil.copy(src / "fake_cube.mat", mine)
    with pytest.raises(DatasetError) as err:
        load_scene(fake_info(), mine, mirror="http://127.0.0.1:9/", progress=None)
    assert str(err.value).endswith(f"place it at {mine / 'fake_gt.mat'}"), err.value


def test_load_scene_with_wrong_checksum_fails_and_caches_nothing(served, tmp_path):
    _src, url = served
    info = fake_info(cube_sha="f" * 64)
    with pytest.raises(DatasetError, match="not found in .*checksum mismatch"):
        load_scene(info, empty_dir(tmp_path), mirror=url, progress=None)
    assert not (tmp_path / "xdg" / "lbtrain" / "fake_cube.mat").exists()


def test_download_checked_by_git_blob_id_when_no_sha256_is_known(served, tmp_path):
    src, url = served
    blob = git_blob_sha1(src / "fake_gt.mat")
    dest = download_file(
        url + "fake_gt.mat", tmp_path / "a" / "gt.mat", git_sha1=blob, progress=None
    )
    assert git_blob_sha1(dest) == blob
    with pytest.raises(DatasetError, match="checksum mismatch.*git blob sha1 [0-9a-f]{40}, exp"):
        download_file(
            url + "fake_gt.mat", tmp_path / "b" / "gt.mat", git_sha1="2" * 40, progress=None
        )
    assert list((tmp_path / "b").iterdir()) == []  # checked before pooch's rename
    # A file already there with the wrong id is downloaded again.
    dest.write_bytes(b"damaged")
    download_file(url + "fake_gt.mat", dest, git_sha1=blob, progress=None)
    assert git_blob_sha1(dest) == blob


def test_load_scene_downloads_from_the_registered_address(served, tmp_path, monkeypatch):
    """No mirror: the registry's own URL (here on loopback) is used, progress is shown."""
    src, url = served
    info = fake_info(base_url=url, cube_sha=sha256_of(src / "fake_cube.mat"))
    progress = io.StringIO()
    scene = load_scene(info, empty_dir(tmp_path), progress=progress)
    assert scene.cube.shape == (6, 5, 4)
    assert "downloading fake_cube.mat:" in progress.getvalue()
    assert "downloading fake_gt.mat:" in progress.getvalue()
    # With downloads off and nothing local, the message names both folders and the address.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh"))
    with pytest.raises(
        DatasetError,
        match=r"fake_cube.mat for scene Fake not found in .*"
        r"empty, .*lbtrain; download it from http",
    ):
        load_scene(fake_info(name="Fake"), empty_dir(tmp_path), download=False)


def test_progress_none_silences_pooch_log_too(served, tmp_path):
    """pooch logs each download on its own logger; ``progress=None`` keeps that quiet."""
    import logging

    import pooch

    src, url = served
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    pooch.get_logger().addHandler(handler)
    try:
        download_file(url + "fake_gt.mat", tmp_path / "a" / "gt.mat", progress=None)
        assert records == []
        download_file(url + "fake_gt.mat", tmp_path / "b" / "gt.mat", progress=io.StringIO())
        assert any("Downloading file 'gt.mat'" in r.getMessage() for r in records)
    finally:
        pooch.get_logger().removeHandler(handler)
