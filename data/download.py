"""Downloads checked against known SHA-256 hashes (pooch), resumable, and an atomic unzip.

`download(url, dest, sha256=...)` hands the file to pooch, which keeps it only if its SHA-256 matches
the known hash (a mismatch removes it and says so) and reuses a file already there whose hash matches.
Pooch restarts an interrupted download from zero; for multi-GB COCO zips the kit gives it a resuming
downloader instead: bytes go to `<file>.part`, and the next run asks the server for the rest (HTTP
Range) and appends them. A zip is tested (CRC of every member) and extracted into a hidden temporary
folder renamed into place only when complete, with a `.complete` marker inside (pooch's own Unzip
processor extracts in place, so a half-extracted folder would carry the final name).
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import time
import urllib.request
import zipfile
from pathlib import Path

import pooch
from tqdm.auto import tqdm

COMPLETE_MARKER = ".complete"


class DownloadError(RuntimeError):
    """A download or extraction that did not produce a complete, verified result."""


def _total_from_headers(headers, resumed_from: int):
    cr = headers.get("Content-Range")  # "bytes 100-999/1000" or "bytes */1000"
    if cr:
        m = re.search(r"/(\d+)\s*$", cr)
        if m:
            return int(m.group(1))
    cl = headers.get("Content-Length")
    return int(cl) + resumed_from if cl is not None else None


class ResumingDownloader:
    """A pooch downloader (`downloader(url, output_file, pooch)`) that resumes from `<dest>.part`.

    Raises DownloadError if the bytes received do not add up to the size the server announced or to
    `expected_size`; the `.part` file is kept for the next run, except when it cannot be the start of
    the file (larger than expected, or the server refuses the range).
    """

    def __init__(self, part: Path, expected_size: int | None = None, timeout: float = 60.0,
                 chunk_size: int = 1 << 20, progress: bool = True):
        self.part, self.expected_size, self.timeout = part, expected_size, timeout
        self.chunk_size, self.progress = chunk_size, progress

    def __call__(self, url: str, output_file, pooch_obj=None, check_only: bool = False) -> None:
        part, expected = self.part, self.expected_size
        have = part.stat().st_size if part.exists() else 0
        if expected is not None and have > expected:
            part.unlink()
            have = 0
        headers = {"User-Agent": "attention-course-kit"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=self.timeout)
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:  # nothing left to send: the .part may already be complete
                if _total_from_headers(e.headers, 0) == have and expected in (None, have):
                    os.replace(part, output_file)
                    return
                part.unlink()
                raise DownloadError(f"server refused to resume {url} (HTTP 416); the partial file was "
                                    f"removed, run the command again") from e
            raise DownloadError(f"cannot download {url}: HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError) as e:
            raise DownloadError(f"cannot download {url}: {e}") from e
        with resp:
            if have and getattr(resp, "status", None) == 206:
                mode, total = "ab", _total_from_headers(resp.headers, have)
            else:  # the server ignored the Range header (or a file:// URL): start over
                have, mode = 0, "wb"
                total = _total_from_headers(resp.headers, 0)
            if total is not None and expected is not None and total != expected:
                raise DownloadError(f"{url} is {total} bytes, expected {expected}")
            with open(part, mode) as out, tqdm(total=total, initial=have, unit="B", unit_scale=True,
                                               unit_divisor=1024, desc=part.name.removesuffix(".part"),
                                               disable=not self.progress) as bar:
                while block := self._read(resp, url, out):
                    out.write(block)
                    bar.update(len(block))
        size = part.stat().st_size
        want = expected if expected is not None else total
        if want is not None and size != want:
            if size > want:
                part.unlink()
            raise DownloadError(f"incomplete download of {url}: {size} of {want} bytes in {part}; "
                                f"run the same command again to resume")
        os.replace(part, output_file)

    def _read(self, resp, url: str, out) -> bytes:
        try:
            return resp.read(self.chunk_size)
        except (http.client.HTTPException, OSError) as e:  # connection dropped mid-way
            out.flush()
            raise DownloadError(f"download of {url} interrupted ({type(e).__name__}) after {out.tell()} bytes, "
                                f"kept in {self.part}; run the same command again to resume") from e


def download(url: str, dest, sha256: str | None = None, expected_size: int | None = None,
             timeout: float = 60.0, chunk_size: int = 1 << 20, progress: bool = True) -> Path:
    """Download `url` to `dest` (resuming `dest.part` if present) and return `dest`.

    With `sha256`, the file is kept only if its SHA-256 matches (else a DownloadError naming both
    hashes; the bytes are removed, so the next run downloads afresh), and an existing `dest` whose hash
    matches is reused without network access. Without it (no published hash), an existing `dest` of
    `expected_size` (or any size, if that is None too) is reused and the caller checks the content.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if sha256 is None and dest.exists():
        if expected_size is None or dest.stat().st_size == expected_size:
            return dest
        dest.unlink()  # a wrong-size final file cannot come from this function; start again
    fetch = ResumingDownloader(dest.with_name(dest.name + ".part"), expected_size, timeout, chunk_size, progress)
    logging.getLogger("pooch").setLevel(logging.WARNING)  # the kit's progress bar says what pooch would
    try:
        pooch.retrieve(url, known_hash=f"sha256:{sha256}" if sha256 else None, fname=dest.name,
                       path=dest.parent, downloader=fetch)
    except ValueError as e:  # pooch: the hash does not match (the downloaded bytes are already removed)
        raise DownloadError(f"{dest.name} is corrupt or not the published file ({e}); it was removed, "
                            f"run the same command again to download it afresh") from e
    return dest


def is_complete(folder) -> bool:
    """True if `folder` was produced by `extract_zip_atomic` (has the completion marker)."""
    return (Path(folder) / COMPLETE_MARKER).is_file()


def extract_zip_atomic(zip_path, dest_dir, progress: bool = True) -> Path:
    """Extract `zip_path` so that its content ends up in `dest_dir`, all or nothing.

    If the zip holds a single top-level folder, that folder's content becomes `dest_dir`. A
    pre-existing `dest_dir` without the completion marker (a partial copy) is moved aside to
    `<dest_dir>.incomplete-<time>`, never trusted.
    """
    zip_path, dest_dir = Path(zip_path), Path(dest_dir)
    if is_complete(dest_dir):
        return dest_dir
    tmp = dest_dir.with_name(f".{dest_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            with zipfile.ZipFile(zip_path) as z:
                bad = z.testzip()
                if bad is not None:
                    raise DownloadError(f"{zip_path} is corrupt (bad CRC in {bad}); delete it and "
                                        f"download again")
                members = z.infolist()
                for m in tqdm(members, desc=f"unzip {zip_path.name}", unit="file",
                              disable=not progress):
                    z.extract(m, tmp)
        except zipfile.BadZipFile as e:
            raise DownloadError(f"{zip_path} is not a valid zip ({e}); delete it and download "
                                f"again") from e
        tops = [p for p in tmp.iterdir() if p.name != "__MACOSX"]
        src = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
        (src / COMPLETE_MARKER).write_text(json.dumps(
            {"zip": zip_path.name, "bytes": zip_path.stat().st_size, "time": time.time()}))
        if dest_dir.exists():
            dest_dir.rename(dest_dir.with_name(f"{dest_dir.name}.incomplete-{int(time.time())}"))
        os.replace(src, dest_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest_dir
