"""The dashboard's server response time with 100,000 rollouts in the store.

Run: ``.venv/bin/python -m tests.benchmarks.bench_dashboard [--rollouts N] [--repeat R]``

A SQLite store is filled with N rollouts (100,000) over 1,000 tasks and 100 steps, each
ended (a tenth failed, with an error), with a reward, an agent span and, for one in
fifty, an LLM call; plus 100 step records. The store server serves it (``ServerThread``,
uvicorn on loopback) and each dashboard page is fetched R times (20) with the bearer
token. Printed: the server's time (request in to the response's last byte out, measured
by a middleware around the app: the median and the slowest), and the median time the client
saw on loopback (which adds TCP's delayed acknowledgement, about 40 ms, to small answers).

Baselines from the same run and the same server: the store API's ``GET
/v1/rollouts/{id}`` (one indexed row: the floor of a request) and ``GET /v1/stats``
(counts over every table). The target is each page at most 200 ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from agl.schema import LLMCall, Reward, Rollout, Span, Task
from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread

TOKEN = "bench-token"
TARGET_MS = 200.0
CHUNK = 5000


def fill(store: SqliteStore, n: int) -> None:
    """``n`` ended rollouts with rewards, agent spans and some LLM calls, and 100 step records."""
    store.add_tasks([Task(task_id=f"task-{k}", input={"q": k}) for k in range(1000)])
    t0 = time.time() - n
    for start in range(0, n, CHUNK):
        ids = range(start, min(n, start + CHUNK))
        store.enqueue(
            [
                Rollout(
                    rollout_id=f"ro-{i:06d}",
                    task_id=f"task-{i % 1000}",
                    step=i * 100 // n,
                    model_version=f"v{i * 100 // n}",
                )
                for i in ids
            ]
        )
        store.add_spans(
            Span(
                span_id=f"sp-{i}",
                rollout_id=f"ro-{i:06d}",
                name="agent",
                kind="agent",
                start_time=t0 + i,
                end_time=t0 + i + (i % 17) / 10,
                attributes={"gen_ai.agent.name": ("solver", "critic", "planner")[i % 3]},
            )
            for i in ids
        )
        store.add_rewards(Reward(rollout_id=f"ro-{i:06d}", value=(i % 101) / 100) for i in ids)
        store.add_llm_calls(
            LLMCall(
                call_id=f"call-{i}",
                rollout_id=f"ro-{i:06d}",
                request={"messages": [{"role": "user", "content": "hello"}]},
                response={"choices": [{"message": {"content": "hi"}}]},
                prompt_ids=list(range(200)),
                response_ids=list(range(50)),
                response_logprobs=[-0.1] * 50,
            )
            for i in ids
            if i % 50 == 0
        )
    # Ending 100,000 rollouts through claim and finish would time the store's writes, not
    # the dashboard: their end is written in one statement instead (what finish would store).
    conn = store.dialect.connect(writer=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE rollouts SET status = CASE WHEN pk % 10 = 0 THEN 'failed' ELSE 'succeeded' END, attempt = 1, "
            "started_at = created_at, ended_at = created_at + (pk % 17) / 10.0, "
            "error = CASE WHEN pk % 10 = 0 THEN 'tool raised ValueError ' || pk ELSE NULL END"
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    for step in range(1, 101):
        store.add_step_record(
            "run-bench",
            {
                "kind": "train",
                "step": step,
                "reward_mean": step / 100,
                "reward_std": 0.1,
                "success_rate": step / 100,
                "response_length_mean": 50.0,
                "kl": 0.01,
                "entropy": 1.0,
                "tokens_per_s": 1000.0,
                "time_rollout_s": 2.0,
                "time_update_s": 1.0,
            },
        )


PAGES = [
    ("API GET /v1/rollouts/{id} (baseline)", "/v1/rollouts/{mid}"),
    ("API GET /v1/stats (baseline)", "/v1/stats"),
    ("runs page", "/ui/runs"),
    ("runs chart fragment (live refresh)", "/ui/runs/charts?run=run-bench"),
    ("rollouts, newest first", "/ui/rollouts"),
    ("rollouts, a page in the middle (OFFSET)", "/ui/rollouts?page={half_pages}"),
    ("rollouts, 200 a page", "/ui/rollouts?size=200"),
    ("rollouts sorted by reward", "/ui/rollouts?sort=reward"),
    ("rollouts sorted by duration", "/ui/rollouts?sort=duration&dir=asc"),
    ("rollouts sorted by task", "/ui/rollouts?sort=task"),
    ("filter status=failed", "/ui/rollouts?status=failed"),
    ("filter task", "/ui/rollouts?task=task-7"),
    ("filter step + model version", "/ui/rollouts?step=42&model=v42"),
    ("filter agent", "/ui/rollouts?agent=critic"),
    ("filter reward range", "/ui/rollouts?reward_min=0.2&reward_max=0.3"),
    ("filter duration", "/ui/rollouts?duration_min=1.2"),
    ("filter error contains", "/ui/rollouts?error=ValueError"),
    ("traces (production rollouts)", "/ui/traces"),
    ("one rollout (with an LLM call)", "/ui/rollouts/{mid}"),
]


class ServerClock:
    """ASGI middleware: how long the server took from a request's arrival to its response's last byte."""

    def __init__(self, app):
        self.app = app
        self.close = getattr(app, "close", lambda: None)
        self.last_ms = 0.0

    async def __call__(self, scope, receive, send) -> None:
        started = time.perf_counter()

        async def timed(message: dict) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.last_ms = (time.perf_counter() - started) * 1000

        await self.app(scope, receive, timed)


def measure(client: httpx.Client, clock: ServerClock, path: str, repeat: int) -> tuple[float, float, float, int]:
    """Median and slowest server time, median client-seen time (ms), and the answer's size."""
    client.get(path)  # warm: the first request of a statement prepares it
    server, seen = [], []
    size = 0
    for _ in range(repeat):
        t = time.perf_counter()
        answer = client.get(path)
        seen.append((time.perf_counter() - t) * 1000)
        server.append(clock.last_ms)
        if answer.status_code != 200:
            raise SystemExit(f"{path}: HTTP {answer.status_code}: {answer.text[:200]}")
        size = len(answer.content)
    return statistics.median(server), max(server), statistics.median(seen), size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "agl.db")
        started = time.monotonic()
        fill(store, args.rollouts)
        print(f"filled {args.rollouts} rollouts in {time.monotonic() - started:.0f}s", flush=True)
        over = []
        try:
            clocks: list[ServerClock] = []
            server = ServerThread(
                store, token=TOKEN, middleware=lambda app: clocks.append(ServerClock(app)) or clocks[0]
            )
            clock = clocks[0]
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with server, httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
                print(f"{'page':44} {'server median ms':>16} {'max':>7} {'client median':>13} {'KiB':>5}")
                mid = f"ro-{args.rollouts // 2 - args.rollouts // 2 % 50:06d}"  # one with an LLM call
                for name, template in PAGES:
                    path = template.format(mid=mid, half_pages=max(1, args.rollouts // 100))
                    median, worst, seen, size = measure(client, clock, path, args.repeat)
                    flag = "" if median <= TARGET_MS or "baseline" in name else "  OVER TARGET"
                    if flag:
                        over.append(name)
                    print(f"{name:44} {median:16.1f} {worst:7.1f} {seen:13.1f} {size / 1024:5.0f}{flag}", flush=True)
        finally:
            store.close()
    print(f"target: each page's median at most {TARGET_MS:.0f} ms; over: {', '.join(over) or 'none'}")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
