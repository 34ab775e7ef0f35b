"""The store over HTTP beside another commit's, in one run: ``bench_store --beside COMMIT``.

The other commit's tree is exported (``git archive``) into a temporary directory and its
store server started from there as a separate process, exactly as this checkout's is
started: ``python -c '<its CLI>' store serve`` over a fresh SQLite file, with that tree's
sources first on ``PYTHONPATH``. Both servers then get the same workload from the same
load generator (the small asyncio client of :mod:`tests.benchmarks.raw_http`, sending
bytes built once, so the client costs the same against either):

- enqueue: ``N`` rollouts in requests of 500 (timed alone);
- then ``clients`` concurrent clients each, until the queue is empty: claim a rollout,
  add its 6 spans one request at a time, add its 6 LLM calls (500 prompt and 100 response
  token ids with logprobs, packed as the clients send them) in one request, add a reward, finish it.

The bodies carry only fields both commits know. The two servers take turns (the order
swapped each repeat), so a busy second on this shared host slows both alike, and the
median of each side's turns is printed with the ratio: rollouts/s, enqueued rollouts/s and
the server's CPU seconds per rollout (user + system, from ``psutil``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import psutil

from agl.credentials import new_token
from tests.benchmarks.raw_http import ConnectionPool, Endpoint
from tests.conftest import stop_process

ROOT = Path(__file__).resolve().parents[2]
SPANS_PER_ROLLOUT = 6
_RID = "@RID@"  # where each body template takes its rollout's id
_RID_BYTES = _RID.encode()


def add_other_checkout(parser: argparse.ArgumentParser, against: str) -> None:
    """An A/B benchmark's ``--other`` (a checkout) and ``--against`` (a commit, exported without ``--other``)."""
    parser.add_argument("--other", type=Path, help="the other checkout (a worktree); default: --against's tree")
    parser.add_argument("--against", default=against, help=f"the other commit, exported (default {against})")


def other_checkout(args: argparse.Namespace, stack: contextlib.ExitStack) -> Path:
    """The checkout ``--other`` names, else ``--against``'s tree, exported for the life of ``stack``."""
    return args.other.resolve() if args.other else stack.enter_context(exported_tree(args.against))


@contextlib.contextmanager
def exported_tree(commit: str) -> Iterator[Path]:
    """The tree of ``commit`` of this repository, exported into a temporary directory."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--beside {commit}: git archive failed: {archive.stderr.decode().strip()}")
    with tempfile.TemporaryDirectory(prefix=f"agl-{commit[:12]}-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def _serve_command(tree: Path, db: Path, port: int, token: str) -> list[str]:
    """The ``store serve`` command of the tree's own CLI (agl-trainer's, or agl-core's before the split)."""
    if (tree / "trainer/src/agl_trainer/cli").is_dir():
        code, token_flag = "from agl_trainer.cli import main", "--admin-token"
    else:
        code, token_flag = "from agl.cli import main", "--token"
    launcher = f"import sys; {code}; sys.exit(main())"
    serve = ["store", "serve", "--store", f"sqlite:///{db}", "--port", str(port), f"{token_flag}={token}"]
    return [sys.executable, "-c", launcher, *serve]


@contextlib.contextmanager
def tree_server(tree: Path, db: Path) -> Iterator[tuple[str, str, int]]:
    """The store server of ``tree`` in a subprocess over a SQLite file; yields (url, token, pid)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = new_token(16)
    # every package of the tree, so the plugins the installed entry points name are the tree's own too
    sources = sorted(tree.glob("*/src")) + sorted(tree.glob("*/*/src"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in sources))
    proc = subprocess.Popen(_serve_command(tree, db, port, token), cwd=tree, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the store server of {tree} did not start") from None
                time.sleep(0.05)
        yield url, token, proc.pid
    finally:
        stop_process(proc)


def _template(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _packed(typecode: str, values: Iterable[float]) -> str:
    """Token ids or logprobs as the agl clients send them: little-endian, base64."""
    packed = array(typecode, values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def _messages(prompt: str, answer: str) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """A chat turn as the integrations record it: a system and a user message in, a tool call and text out."""
    sent = [
        {"role": "system", "content": prompt[:300]},
        {"role": "user", "content": [{"type": "text", "text": prompt[300:]}]},
    ]
    call = {"id": "call-1", "type": "function", "function": {"name": "calculator", "arguments": '{"expr": "2 + 2"}'}}
    return sent, [{"role": "assistant", "content": answer, "tool_calls": [call]}]


class Bodies:
    """The request bodies of one rollout, built once as bytes with a place for its id.

    Spans and LLM calls hold structured JSON as the integrations and the gateway record it
    (messages as lists of objects, the engine's answer as the OpenAI response object), about
    2 KB of text each.
    """

    def __init__(self) -> None:
        prompt = ("You are a careful assistant. Solve the task step by step and answer briefly. " * 13)[:1000]
        answer = ("Let me think about this. First we add the numbers, then we check the result. " * 13)[:1000]
        sent, received = _messages(prompt, answer)
        now = time.time()
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "policy",
            "gen_ai.agent.name": "solver",
            "gen_ai.request.temperature": 1.0,
            "gen_ai.usage.input_tokens": 500,
            "gen_ai.usage.output_tokens": 100,
            "gen_ai.input.messages": sent,
            "gen_ai.output.messages": received,
        }
        self.spans = [
            _template(
                {
                    "spans": [
                        {
                            "span_id": f"{_RID}-{k}",
                            "trace_id": f"trace-{_RID}",
                            "rollout_id": _RID,
                            "seq": k,
                            "name": "chat",
                            "kind": "llm",
                            "status": "ok",
                            "start_time": now,
                            "end_time": now + 0.5,
                            "attributes": attributes | {"gen_ai.response.id": f"chatcmpl-{_RID}-{k}"},
                        }
                    ]
                }
            )
            for k in range(SPANS_PER_ROLLOUT)
        ]
        choice = {"index": 0, "message": received[0], "finish_reason": "tool_calls", "logprobs": None}
        usage = {"prompt_tokens": 500, "completion_tokens": 100, "total_tokens": 600}
        calls = [
            {
                "call_id": f"chatcmpl-{_RID}-{k}",
                "rollout_id": _RID,
                "seq": k,
                "requested_model": "policy",
                "request": {"model": "policy", "messages": sent, "temperature": 1.0, "max_tokens": 256},
                "response": {
                    "id": f"chatcmpl-{_RID}-{k}",
                    "object": "chat.completion",
                    "created": int(now),
                    "model": "policy",
                    "choices": [choice],
                    "usage": usage,
                },
                "prompt_ids": _packed("i", range(1000, 1500)),
                "response_ids": _packed("i", range(2000, 2100)),
                "response_logprobs": _packed("f", [-0.25] * 100),
                "model_version": "v0",
                "latency_s": 0.05,
            }
            for k in range(SPANS_PER_ROLLOUT)
        ]
        self.calls = _template({"llm_calls": calls})
        self.reward = _template({"rewards": [{"reward_id": f"rw-{_RID}", "rollout_id": _RID, "value": 1.0}]})
        self.finish = _template({"status": "succeeded", "output": {"answer": "4", "score": 1.0}})


async def _post(pool: ConnectionPool, path: str, body: bytes) -> bytes:
    answer = await pool.request("POST", path, body)
    content = await answer.read()
    if answer.status != 200:
        raise RuntimeError(f"POST {path}: {answer.status} {content[:300]!r}")
    return content


async def _enqueue(pool: ConnectionPool, rollouts: int) -> float:
    """Tasks, then ``rollouts`` rollouts in requests of 500; the seconds the rollouts took."""
    tasks = [{"task_id": f"task-{i}", "input": {"question": f"{i} + {i}?", "answer": 2 * i}} for i in range(100)]
    await _post(pool, "/v1/tasks", _template({"tasks": tasks}))
    t0 = time.perf_counter()
    for start in range(0, rollouts, 500):
        batch = [{"task_id": f"task-{i % 100}"} for i in range(start, min(rollouts, start + 500))]
        await _post(pool, "/v1/rollouts", _template({"rollouts": batch}))
    return time.perf_counter() - t0


async def _client(pool: ConnectionPool, bodies: Bodies, runner_id: str) -> int:
    claim = _template({"runner_id": runner_id, "limit": 1})
    done = 0
    while True:
        claimed = json.loads(await _post(pool, "/v1/claims", claim))["rollouts"]
        if not claimed:
            return done
        rid_text = claimed[0]["rollout_id"]
        rid = rid_text.encode()
        for span in bodies.spans:
            await _post(pool, "/v1/spans", span.replace(_RID_BYTES, rid))
        await _post(pool, "/v1/llm_calls", bodies.calls.replace(_RID_BYTES, rid))
        await _post(pool, "/v1/rewards", bodies.reward.replace(_RID_BYTES, rid))
        await _post(pool, f"/v1/rollouts/{rid_text}/finish", bodies.finish)
        done += 1


async def _workload(url: str, token: str, clients: int, rollouts: int, bodies: Bodies) -> tuple[float, float]:
    pool = ConnectionPool(Endpoint.parse(url), headers={"Authorization": f"Bearer {token}"})
    try:
        enqueue_s = await _enqueue(pool, rollouts)
        t0 = time.perf_counter()
        done = await asyncio.gather(*(_client(pool, bodies, f"runner-{i}") for i in range(clients)))
        elapsed = time.perf_counter() - t0
    finally:
        await pool.close()
    if sum(done) != rollouts:
        raise RuntimeError(f"finished {sum(done)} of {rollouts} rollouts")
    return enqueue_s, elapsed


def run_once(tree: Path, db: Path, clients: int, rollouts: int) -> dict[str, float]:
    """The workload against a fresh server of ``tree``: rollouts/s, enqueued/s, server CPU ms per rollout."""
    with tree_server(tree, db) as (url, token, pid):
        server = psutil.Process(pid)
        before = server.cpu_times()
        enqueue_s, elapsed = asyncio.run(_workload(url, token, clients, rollouts, Bodies()))
        after = server.cpu_times()
    cpu_s = (after.user - before.user) + (after.system - before.system)
    return {
        "rollouts/s": rollouts / elapsed,
        "enqueued/s": rollouts / enqueue_s,
        "cpu ms/rollout": cpu_s / rollouts * 1000,
    }


FIGURES = ("rollouts/s", "enqueued/s", "cpu ms/rollout")


def compare(commit: str, client_counts: list[int], rollouts: int, repeat: int) -> list[dict[str, object]]:
    """This checkout's store server beside ``commit``'s, taking turns ``repeat`` times per client count;
    prints each turn and, per client count, both medians and their ratio (this / that)."""
    rows: list[dict[str, object]] = []
    print(f"store over HTTP, this checkout beside {commit}: {rollouts} rollouts a run, {repeat} turns", flush=True)
    with exported_tree(commit) as other, tempfile.TemporaryDirectory(prefix="agl-beside-") as tmp:
        sides = {"this": ROOT, commit: other}
        for clients in client_counts:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
            for turn in range(repeat):
                order = list(sides) if turn % 2 == 0 else list(reversed(sides))
                for name in order:
                    db = Path(tmp) / f"{name}-{clients}-{turn}.db"
                    result = run_once(sides[name], db, clients, rollouts)
                    runs[name].append(result)
                    figures = "  ".join(f"{k} {v:.2f}" for k, v in result.items())
                    print(f"  {clients:>3} clients  turn {turn}  {name:>10}:  {figures}", flush=True)
            row: dict[str, object] = {"clients": clients}
            for figure in FIGURES:
                mine = statistics.median(r[figure] for r in runs["this"])
                theirs = statistics.median(r[figure] for r in runs[commit])
                row[figure] = (mine, theirs, mine / theirs)
            rows.append(row)
            print(
                f"  {clients:>3} clients, medians (this / {commit} = ratio): "
                + "; ".join(f"{k} {v[0]:.2f} / {v[1]:.2f} = {v[2]:.2f}x" for k, v in row.items() if k != "clients"),
                flush=True,
            )
    return rows
