"""A throwaway PostgreSQL server for tests and benchmarks.

``postgres_server()`` creates a cluster in a temporary directory, starts it on
127.0.0.1 and a free port, yields its base URL (no database in it) and stops and
deletes it afterwards. It works from pytest and from a plain script::

    from tests.pg import postgres_server, create_database

    with postgres_server() as base_url:
        url = create_database(base_url)          # postgresql://agl:…@127.0.0.1:PORT/agl_…
        store = PostgresStore(url)

PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres``
system user (created by Debian's ``postgresql`` package) and its commands run
through ``runuser``. The binaries come from ``/usr/lib/postgresql/*/bin``; run
``scripts/ensure-postgres.sh`` to install them. Password authentication (SCRAM)
guards the cluster, since other local users could reach the loopback port.

``shared_server_url()`` starts one server per process on first use and stops it
at interpreter exit; test modules share it and create a database per test.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

USER = "agl"


class PostgresNotInstalled(RuntimeError):
    """The PostgreSQL server binaries are missing."""


def _bindir() -> Path:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(re.search(r"/postgresql/(\d+)", p).group(1)),
    )
    if not found:
        raise PostgresNotInstalled(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: run scripts/ensure-postgres.sh"
        )
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_owner(argv: list[str]) -> list[str]:
    """Run as the ``postgres`` system user when we are root, as ourselves otherwise."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def _run(argv: list[str]) -> None:
    proc = subprocess.run(_as_owner(argv), check=False, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{Path(argv[0]).name} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
        )


def _owned_tempdir() -> Path:
    # As root, the postgres user must be able to reach the directory, so keep it in /tmp
    # (a TMPDIR under /root would be out of its reach) and give it to that user.
    root = os.geteuid() == 0
    path = Path(tempfile.mkdtemp(prefix="agl-pg-", dir="/tmp" if root else None))
    if root:
        shutil.chown(path, "postgres", "postgres")
    return path


@contextlib.contextmanager
def postgres_server(*, durable: bool = False, max_connections: int = 400) -> Iterator[str]:
    """Start a fresh PostgreSQL cluster on 127.0.0.1; yield ``postgresql://agl:PASSWORD@127.0.0.1:PORT``.

    ``durable=False`` (the default, for tests) turns fsync off: a crash of the machine
    could lose commits, a crash of a client cannot. Benchmarks that report durable
    write figures pass ``durable=True``.
    """
    bindir = _bindir()
    workdir = _owned_tempdir()
    data = workdir / "data"
    password = secrets.token_hex(16)
    pwfile = workdir / "pwfile"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres", "postgres")
    pwfile.chmod(0o600)
    started = False
    try:
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "-A",
                "scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        pwfile.unlink()
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "",
            "max_connections": str(max_connections),
            "fsync": "on" if durable else "off",
            "synchronous_commit": "on" if durable else "off",
            "full_page_writes": "on" if durable else "off",
        }
        for attempt in range(3):  # a free port can be taken between the check and the start
            port = _free_port()
            options = " ".join(f"-c {k}={v!r}" if v == "" else f"-c {k}={v}" for k, v in settings.items())
            try:
                _run(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(workdir / "server.log"),
                        "-w",
                        "-t",
                        "60",
                        "-o",
                        f"-p {port} {options}",
                        "start",
                    ]
                )
                started = True
                break
            except RuntimeError:
                if attempt == 2:
                    log = (workdir / "server.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"PostgreSQL did not start; its log ends with:\n{log}") from None
        watchdog = _start_watchdog(bindir, workdir)
        url = f"postgresql://{USER}:{password}@127.0.0.1:{port}"
        _clusters[url] = (bindir, data, f"-p {port} {options}")
        yield url
    finally:
        _clusters.pop(locals().get("url", ""), None)
        if started:
            with contextlib.suppress(Exception):
                _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(workdir, ignore_errors=True)
        if started:
            watchdog.stdin.close()
            watchdog.wait(30)


_clusters: dict[str, tuple[Path, Path, str]] = {}  # base URL → (binaries, data directory, server options)


def restart(base_url: str, *, down_s: float = 0.0) -> None:
    """Stop the server at ``base_url`` (a fast shutdown that ends every connection),
    keep it down for ``down_s`` seconds, and start it again on the same port."""
    if base_url not in _clusters:
        raise ValueError(f"base_url: {base_url!r} is not a server started by postgres_server()")
    bindir, data, options = _clusters[base_url]
    _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
    time.sleep(down_s)
    _run(
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(data.parent / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        ]
    )


_WATCHDOG = """
import shutil, subprocess, sys
sys.stdin.read()  # returns when the process that started the server ends, however it ends
subprocess.run(sys.argv[2:], capture_output=True)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def _start_watchdog(bindir: Path, workdir: Path) -> subprocess.Popen:
    """A process that stops the server and deletes its files once our process is gone,
    so a test run killed by a timeout or a signal leaves no server behind."""
    stop = _as_owner([str(bindir / "pg_ctl"), "-D", str(workdir / "data"), "-m", "immediate", "stop"])
    return subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(workdir), *stop],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def create_database(base_url: str, name: str | None = None) -> str:
    """Create a database on the server at ``base_url``; return its URL."""
    import psycopg

    name = name or f"agl_{secrets.token_hex(6)}"
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"name: {name!r} is not a plain lower-case database name")
    with psycopg.connect(f"{base_url}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{base_url}/{name}"


def drop_database(url: str) -> None:
    """Drop the database at ``url``, closing whatever connections it still has."""
    import psycopg

    base_url, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base_url}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


_shared: contextlib.ExitStack | None = None
_shared_url: str | None = None
_shared_lock = threading.Lock()


def shared_server_url() -> str:
    """The base URL of one server per process, started on first use and stopped at exit."""
    global _shared, _shared_url
    with _shared_lock:
        if _shared_url is None:
            stack = contextlib.ExitStack()
            _shared_url = stack.enter_context(postgres_server())
            _shared = stack
            atexit.register(stack.close)
        return _shared_url
