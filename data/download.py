"""Resumable HTTP(S)/file download with a progress bar, size verification and atomic unzip.

A download goes to `<file>.part` and is renamed to `<file>` only once its size matches the size the
server announced (and `expected_size`, if given). An interrupted run leaves the `.part` file; the next
run asks the server for the remaining bytes (HTTP Range) and appends them. A zip is tested (CRC of
every member) and extracted into a hidden temporary folder which is renamed into place only when
complete, with a `.complete` marker inside: a half-extracted folder never has the final name.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import time
import urllib.request
import zipfile
from pathlib import Path

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


def download(url: str, dest, expected_size: int | None = None, timeout: float = 60.0,
             chunk_size: int = 1 << 20, progress: bool = True) -> Path:
    """Download `url` to `dest` (resuming `dest.part` if present) and return `dest`.

    Raises DownloadError if the bytes received do not add up to the announced size or to
    `expected_size`. An existing `dest` of the right size is reused without network access.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    if dest.exists():
        if expected_size is None or dest.stat().st_size == expected_size:
            return dest
        dest.unlink()  # a wrong-size final file cannot come from this function; start again
    have = part.stat().st_size if part.exists() else 0
    if expected_size is not None and have > expected_size:
        part.unlink()
        have = 0
    headers = {"User-Agent": "attention-course-kit"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to send: the .part may already be complete
            total = _total_from_headers(e.headers, 0)
            if total == have and (expected_size in (None, have)):
                os.replace(part, dest)
                return dest
            part.unlink()
            raise DownloadError(f"server refused to resume {url} (HTTP 416); the partial file was "
                                f"removed, run the command again") from e
        raise DownloadError(f"cannot download {url}: HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"cannot download {url}: {e}") from e
    with resp:
        status = getattr(resp, "status", None)
        if have and status == 206:
            mode, total = "ab", _total_from_headers(resp.headers, have)
        else:  # the server ignored the Range header (or a file:// URL): start over
            have, mode = 0, "wb"
            total = _total_from_headers(resp.headers, 0)
        if total is not None and expected_size is not None and total != expected_size:
            raise DownloadError(f"{url} is {total} bytes, expected {expected_size}")
        with open(part, mode) as out, tqdm(total=total, initial=have, unit="B", unit_scale=True,
                                           unit_divisor=1024, desc=dest.name,
                                           disable=not progress) as bar:
            while True:
                try:
                    block = resp.read(chunk_size)
                except (http.client.HTTPException, OSError) as e:  # connection dropped mid-way
                    out.flush()
                    raise DownloadError(f"download of {url} interrupted ({type(e).__name__}) after "
                                        f"{out.tell()} bytes, kept in {part}; run the same command "
                                        f"again to resume") from e
                if not block:
                    break
                out.write(block)
                bar.update(len(block))
    size = part.stat().st_size
    want = expected_size if expected_size is not None else total
    if want is not None and size != want:
        if size > want:
            part.unlink()
        raise DownloadError(f"incomplete download of {url}: {size} of {want} bytes in {part}; "
                            f"run the same command again to resume")
    os.replace(part, dest)
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
