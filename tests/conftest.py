"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable

import httpx
import pytest

# Test modules import torch before agl_verl; OpenMP workers should sleep here as in agl (agl_verl.threads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate ``proc`` and wait for it; kill it if it has not ended within ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout_s: float = 10.0,
    *,
    step_s: float = 0.01,
    detail: Callable[[], object] | None = None,
) -> float:
    """Call ``condition`` every ``step_s`` until it answers true; the seconds that took.

    Fails the test with "timed out after N s waiting until <what>" (and ``detail()``, say a
    log's tail, read at that moment) when ``timeout_s`` passes first. ``timeout_s`` bounds a
    broken test; it is not a margin to assert on, so make it generous and assert on what the
    condition saw. An exception from ``condition`` (an ``assert`` that a helper process still
    runs, say) ends the wait at once. A plain function rather than a fixture: helper threads,
    helper classes and other conftest modules call it as it is, with nothing to pass down.
    """
    started = time.monotonic()
    while not condition():
        waited = time.monotonic() - started
        if waited > timeout_s:
            more = "" if detail is None else f"\n{detail()}"
            pytest.fail(f"timed out after {waited:.1f} s waiting until {what}{more}")
        time.sleep(step_s)
    return time.monotonic() - started


def wait_until_serving(
    url: str, proc: subprocess.Popen, timeout_s: float = 30.0, output: Callable[[], str] | None = None
) -> None:
    """Wait until ``GET url`` answers 200, failing at once (with ``output()``, else the process's
    piped stdout) if ``proc``, the server's process, exits first; killed if it never answers."""

    def serving() -> bool:
        if proc.poll() is not None:
            said = output() if output is not None else _piped_output(proc)
            pytest.fail(f"{url}: the server process exited {proc.returncode} before it answered:\n{said}")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(serving, f"{url} answers 200", timeout_s, step_s=0.05)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise


def _piped_output(proc: subprocess.Popen) -> str:
    if proc.stdout is None:
        return "(its output was not piped)"
    out = proc.stdout.read()
    return out.decode(errors="replace") if isinstance(out, bytes) else out


@pytest.fixture
def sqlite_store(tmp_path):
    from agl.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "agl.db")
    yield store
    store.close()


@pytest.fixture
async def openai_client():
    """Makes ``AsyncOpenAI`` clients (no retries) and closes them when the test ends, on its own loop.

    An unclosed client is closed by the garbage collector on whatever loop runs then, which
    logs a "Task exception was never retrieved" (``Event loop is closed``) into a later test.
    """
    from openai import AsyncOpenAI

    made: list[AsyncOpenAI] = []

    def make(base_url: str, api_key: str, **options) -> AsyncOpenAI:
        made.append(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, **options))
        return made[-1]

    yield make
    for client in made:
        await client.close()


@pytest.fixture(autouse=True)
def _plugins_registered_by_a_test_end_with_it():
    """Unregister every agl plugin a test registered (an example's ``train.main`` registers its reward
    plugin for the process, as a user's script does): a reward plugin left behind would score the
    rollouts of every later test."""
    from agl.plugins import get_plugin_manager

    before = {name for name, _ in get_plugin_manager().list_name_plugin()}
    yield
    pm = get_plugin_manager()
    for name, plugin in pm.list_name_plugin():
        if name not in before and plugin is not None:
            pm.unregister(name=name)


async def read_asgi_body(receive) -> bytes:
    """A request's whole body from an ASGI ``receive``, however many messages it comes in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
