"""A throwaway local PostgreSQL server (loopback only, trust auth, deleted afterwards): for the tests, the
benchmarks, and an instructor who wants to try several grading workers without a database of their own.

CI installs PostgreSQL (`.ci/run`); elsewhere the tests that need it are skipped when no server
binaries are found. As root, the server runs as the `postgres` user (PostgreSQL refuses root).
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def available() -> bool:
    return all(find_bin(n) for n in ("initdb", "pg_ctl", "postgres"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_URL = "postgresql+psycopg2://postgres@127.0.0.1:{port}"


def fresh_database(url: str, name: str) -> str:
    """A new, empty database `name` on the server of `url` (a URL that `server` yielded): a gradebook of its own
    without starting another server. Its URL."""
    import psycopg2
    from sqlalchemy.engine import make_url

    server = make_url(url)
    conn = psycopg2.connect(host=server.host, port=server.port, user=server.username, dbname="postgres")
    conn.autocommit = True
    try:
        conn.cursor().execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return server.set(database=name).render_as_string(hide_password=False)


@contextmanager
def server():
    """Yield a SQLAlchemy URL of a fresh database on a private server."""
    tmp = Path(tempfile.mkdtemp(prefix="pgtest-"))
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(tmp, "postgres", "postgres")
    data, port = tmp / "data", _free_port()
    env = dict(os.environ, LC_ALL="C")
    run = dict(check=True, capture_output=True, env=env, cwd="/")
    subprocess.run(prefix + [find_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"], **run)
    subprocess.run(prefix + [find_bin("pg_ctl"), "-D", str(data), "-l", str(tmp / "log"), "-w", "-t", "60", "-o",
                             f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c max_connections=50", "start"], **run)
    try:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE gradebook")
        conn.close()
        yield f"{SERVER_URL.format(port=port)}/gradebook"
    finally:
        subprocess.run(prefix + [find_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, env=env, cwd="/")
        shutil.rmtree(tmp, ignore_errors=True)
