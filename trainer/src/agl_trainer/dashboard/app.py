"""The dashboard's ASGI app: login, runs, rollouts, one rollout, traces, attaching a reward.

Every page needs the store's admin token: ``Authorization: Bearer <token>``, or the
cookie the login form sets after it was given the token (``HttpOnly``,
``SameSite=Strict``): a session id made for that login alone, which logout ends on the
server (:mod:`agl_trainer.dashboard.sessions`). Pages are HTML rendered here, with inline
CSS and SVG; the runs page refetches its charts every few seconds with a few lines of script.

A request body is refused (413) past ``max_body_bytes`` (64 KiB: the forms here are a few
fields), before it is read when its length is declared, else as soon as it passes the limit;
a form holds no file, so nothing is written to disk.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from agl.credentials import bearer, same_token
from agl.errors import NotFound
from agl.schema import Reward, RolloutStatus
from agl.store.base import Store
from agl_trainer.dashboard import queries, steps
from agl_trainer.dashboard.html import attr, csp, e, number, page, path_id, seconds, url, when
from agl_trainer.dashboard.rollout import rollout_page
from agl_trainer.dashboard.sessions import Sessions
from agl_trainer.http import BODY_ERRORS, BodyLimits
from agl_trainer.transitions import TransitionConfig

COOKIE = "agl_dashboard"
REFRESH_MS = 5000
MAX_BODY_BYTES = 64 * 1024
"""The largest request body the dashboard reads: its forms hold a few short fields."""
MAX_FORM_FIELDS = 50
"""The most fields a form may have (and no file)."""


LOGIN_HINT = (
    "the token <code>agl store serve</code> or <code>agl dashboard</code> printed when it started "
    "(or the one it was given with --admin-token)"
)
"""What the login page says to log in with: the token the server printed, not the name of a variable
the user may never have set."""


class Dashboard:
    """The pages, bound to a store, the admin token and the path prefix they are served under."""

    def __init__(self, store: Store, token: str, prefix: str, config: TransitionConfig | None):
        if not token:
            raise ValueError("token: the dashboard needs a non-empty token")
        self.store = store
        self.token = token
        self.prefix = prefix.rstrip("/")
        self.config = config or TransitionConfig()
        self.sessions = Sessions()

    # -- auth ------------------------------------------------------------------------
    def _authorized(self, request: Request) -> bool:
        if same_token(bearer(request.headers.get("authorization")), self.token):
            return True
        return self.sessions.live(request.cookies.get(COOKIE))

    def _login_redirect(self, request: Request) -> Response:
        if request.headers.get("accept", "").startswith("application/json") or request.method != "GET":
            return JSONResponse(
                {"error": {"type": "Unauthorized", "field": "Authorization", "reason": "missing or wrong token"}},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return RedirectResponse(url(f"{self.prefix}/login", [("next", request.url.path)]), status_code=303)

    def guarded(self, handler):
        async def wrapped(request: Request) -> Response:
            if not self._authorized(request):
                return self._login_redirect(request)
            return await handler(request)

        return wrapped

    async def login_form(self, request: Request) -> Response:
        return self._login_page(request.query_params.get("next", ""), None)

    def _login_page(self, next_path: str, error: str | None, status: int = 200) -> Response:
        msg = f'<p class="err">{e(error)}</p>' if error else ""
        body = (
            f'<div class="card" style="max-width:420px"><h2>Log in</h2>{msg}'
            f'<form method="post" action={attr(self.prefix + "/login")}>'
            f'<input type="hidden" name="next" value={attr(next_path)}>'
            '<label>Store token <input type="password" name="token" autocomplete="current-password" required></label> '
            "<button>Log in</button></form>"
            f'<p class="muted">{LOGIN_HINT}</p></div>'
        )
        return HTMLResponse(page("Log in", body, prefix=self.prefix, logged_in=False), status_code=status)

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        next_path = str(form.get("next") or "")
        if not same_token(str(form.get("token") or ""), self.token):
            return self._login_page(next_path, "token: wrong token", status=401)
        if not next_path.startswith(self.prefix + "/") or next_path.startswith("//"):
            next_path = f"{self.prefix}/runs"
        self.sessions.end(request.cookies.get(COOKIE))  # a login replaces the session it came with
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(
            COOKIE, self.sessions.start(), httponly=True, samesite="strict", path=self.prefix or "/", secure=False
        )
        return response

    async def logout(self, request: Request) -> Response:
        self.sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{self.prefix}/login", status_code=303)
        response.delete_cookie(COOKIE, path=self.prefix or "/")
        return response

    # -- pages -----------------------------------------------------------------------
    def _html(self, title: str, body: str, active: str, script: str = "", status: int = 200) -> Response:
        nonce = secrets.token_urlsafe(16)
        text = page(title, body, prefix=self.prefix, active=active, script=script, nonce=nonce)
        return HTMLResponse(text, status_code=status, headers={"Content-Security-Policy": csp(nonce)})

    async def home(self, request: Request) -> Response:
        return RedirectResponse(f"{self.prefix}/runs", status_code=303)

    async def rollouts(self, request: Request) -> Response:
        return await self._rollout_list(request, "rollouts", "Rollouts")

    async def traces(self, request: Request) -> Response:
        return await self._rollout_list(request, "traces", "Traces captured outside training")

    async def _rollout_list(self, request: Request, active: str, title: str) -> Response:
        params = request.query_params
        if active == "traces" and "mode" not in params:
            params = _with(params, mode="production")
        try:
            flt = queries.RolloutFilter.from_params(params)
        except queries.BadFilter as exc:
            body = f'<p class="err">{e(exc)}</p><p><a href={attr(self.prefix + "/" + active)}>reset the filters</a></p>'
            return self._html(title, body, active, status=422)
        rows, total = await anyio.to_thread.run_sync(queries.list_rollouts, self.store, flt)
        extra = ""
        if active == "traces":
            loose = await anyio.to_thread.run_sync(queries.production_span_count, self.store)
            extra = (
                '<p class="muted">Rollouts that <code>agl run</code> and captured programs recorded outside training '
                f"(mode production). {loose} span(s) of gateway traffic belong to no rollout. "
                "Open a rollout to attach a reward to it.</p>"
            )
        return self._html(title, f"<h2>{e(title)}</h2>{extra}" + self._list_body(flt, rows, total, active), active)

    def _list_body(self, flt: queries.RolloutFilter, rows: list[queries.RolloutRow], total: int, active: str) -> str:
        base = f"{self.prefix}/{active}"

        def field(name: str, label: str, value: Any) -> str:
            return f"<label>{label}<input name={attr(name)} value={attr('' if value is None else value)}></label>"

        status_opts = "".join(
            f"<option value={attr(s.value)}{' selected' if s.value in flt.status else ''}>{e(s.value)}</option>"
            for s in RolloutStatus
        )
        mode_opts = '<option value="">any</option>' + "".join(
            f"<option{' selected' if m == flt.mode else ''}>{m}</option>" for m in queries.MODES
        )
        form = (
            f'<form class="filters" method="get" action={attr(base)}>'
            + field("task", "task", flt.task)
            + f'<label>status<select name="status" multiple size="2">{status_opts}</select></label>'
            + f'<label>mode<select name="mode">{mode_opts}</select></label>'
            + field("agent", "agent", flt.agent)
            + field("model", "model version", flt.model)
            + field("step", "step", flt.step)
            + field("reward_min", "reward ≥", flt.reward_min)
            + field("reward_max", "reward ≤", flt.reward_max)
            + field("duration_min", "duration ≥ s", flt.duration_min)
            + field("duration_max", "duration ≤ s", flt.duration_max)
            + field("error", "error contains (* any)", flt.error)
            + f'<input type="hidden" name="sort" value={attr(flt.sort)}>'
            + f'<input type="hidden" name="dir" value={attr("desc" if flt.desc else "asc")}>'
            + f'<input type="hidden" name="size" value={attr(flt.size)}>'
            + f"<button>Filter</button> <a href={attr(base)}>reset</a></form>"
        )
        heads = [
            ("rollout", "rollout"),
            ("task", "task"),
            ("status", "status"),
            ("mode", "mode"),
            ("step", "step"),
            ("model", "model version"),
            ("agent", "agent"),
            ("reward", "reward"),
            ("duration", "duration"),
            ("attempt", "attempt"),
            ("created", "created"),
            ("error", "error"),
        ]
        ths = []
        for key, label in heads:
            desc = not flt.desc if key == flt.sort else True
            arrow = (" ▼" if flt.desc else " ▲") if key == flt.sort else ""
            link = url(base, flt.params(sort=key, desc=desc, page=1))
            ths.append(f'<th><a href={attr(link)} data-sort="{key}">{e(label)}{arrow}</a></th>')
        trs = []
        for r in rows:
            href = f"{self.prefix}/rollouts/{path_id(r.rollout_id)}"
            err = (r.error or "")[:120]
            trs.append(
                f'<tr class="rollout-row" data-rollout-id={attr(r.rollout_id)}>'
                f"<td><a href={attr(href)}>{e(r.rollout_id)}</a></td>"
                f"<td>{e(r.task_id)}</td><td class='s-{e(r.status)}'>{e(r.status)}</td><td>{e(r.mode)}</td>"
                f"<td class='num'>{e(r.step)}</td><td>{e(r.model_version)}</td><td>{e(r.agent)}</td>"
                f"<td class='num reward'>{e(number(r.reward, 6))}</td><td class='num'>{e(seconds(r.duration_s))}</td>"
                f"<td class='num'>{r.attempt}</td><td>{e(when(r.created_at))}</td><td class='err'>{e(err)}</td></tr>"
            )
        pages = max(1, math.ceil(total / flt.size))
        pager = [
            f'<span class="total">{total} rollout{"s" if total != 1 else ""}</span>',
            f"<span>page {flt.page} of {pages}</span>",
        ]
        if flt.page > 1:
            pager.append(f'<a rel="prev" href={attr(url(base, flt.params(page=flt.page - 1)))}>← previous</a>')
        if flt.page < pages:
            pager.append(f'<a rel="next" href={attr(url(base, flt.params(page=flt.page + 1)))}>next →</a>')
        empty = '<tr><td colspan="12" class="muted">no rollouts match</td></tr>'
        return (
            form
            + f'<div class="pager">{"".join(pager)}</div>'
            + f'<table class="rollouts"><tr>{"".join(ths)}</tr>{"".join(trs) or empty}</table>'
        )

    def _config_for(self, rollout_id: str) -> tuple[TransitionConfig, str]:
        """The transitions config of the training run that made this rollout (its id starts with
        the run's id), else the dashboard's own; and where it came from, for the page."""
        for run_id, config in queries.run_transition_configs(self.store).items():
            if rollout_id.startswith(run_id + "-"):
                try:
                    return TransitionConfig.model_validate(config), f"run {run_id}'s config"
                except ValueError:
                    break
        return self.config, "the dashboard's config"

    async def rollout(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]

        def render() -> str:
            config, origin = self._config_for(rollout_id)
            return rollout_page(self.store, rollout_id, prefix=self.prefix, config=config, config_origin=origin)

        try:
            body = await anyio.to_thread.run_sync(render)
        except NotFound:
            return self._html("Not found", f'<p class="err">no rollout {e(rollout_id)}</p>', "rollouts", status=404)
        return self._html(f"Rollout {rollout_id}", body, "rollouts")

    async def add_reward(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        form = await _form(request)
        try:
            reward = reward_from_form(rollout_id, dict(form))
            await anyio.to_thread.run_sync(self.store.get_rollout, rollout_id)
        except ValueError as exc:
            return self._html("Bad reward", f'<p class="err">{e(exc)}</p>', "rollouts", status=422)
        except NotFound:
            return self._html("Not found", f'<p class="err">no rollout {e(rollout_id)}</p>', "rollouts", status=404)
        await anyio.to_thread.run_sync(self.store.add_rewards, [reward])
        return RedirectResponse(f"{self.prefix}/rollouts/{path_id(rollout_id)}", status_code=303)

    async def runs(self, request: Request) -> Response:
        all_runs = await anyio.to_thread.run_sync(queries.runs, self.store)
        run_id = request.query_params.get("run") or (all_runs[0].run_id if all_runs else None)
        if run_id is None:
            body = (
                "<h2>Runs</h2><p class='muted'>No step records yet: <code>agl train</code> writes one into the "
                "store after each training step.</p>"
            )
            return self._html("Runs", body, "runs")
        options = "".join(
            f"<option value={attr(r.run_id)}{' selected' if r.run_id == run_id else ''}>{e(r.run_id)} "
            f"({r.records} records{'' if r.last_at is None else ', ' + e(when(r.last_at))})</option>"
            for r in all_runs
        )
        picker = (
            f'<form method="get" action={attr(self.prefix + "/runs")}><label>run '
            f'<select name="run" id="run-picker">{options}</select></label></form>'
        )
        charts_html = await anyio.to_thread.run_sync(self._charts, run_id)
        fragment = url(f"{self.prefix}/runs/charts", [("run", run_id)])
        script = (
            "document.getElementById('run-picker').addEventListener('change',"
            "function(ev){ev.target.form.submit()});"
            f"setInterval(function(){{fetch({_js_string(fragment)},{{credentials:'same-origin'}})"
            ".then(function(r){return r.ok?r.text():null}).then(function(t){"
            "if(t!==null)document.getElementById('charts').innerHTML=t})}," + str(REFRESH_MS) + ");"
        )
        body = f"<h2>Run {e(run_id)}</h2>{picker}<div id='charts'>{charts_html}</div>"
        return self._html(f"Run {run_id}", body, "runs", script=script)

    async def run_charts(self, request: Request) -> Response:
        run_id = request.query_params.get("run")
        if not run_id:
            return HTMLResponse('<p class="err">run: missing</p>', status_code=422)
        return HTMLResponse(await anyio.to_thread.run_sync(self._charts, run_id))

    def _charts(self, run_id: str) -> str:
        return steps.run_charts(self.store.step_records(run_id))


def reward_from_form(rollout_id: str, form: dict[str, Any]) -> Reward:
    """The reward a form (or an API body) attaches to a rollout; ValueError naming the bad field."""
    raw = str(form.get("value", "")).strip()
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"value: expected a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"value: must be finite, got {raw!r}")
    name = str(form.get("name") or "reward").strip() or "reward"
    source = str(form.get("source") or "human").strip() or "human"
    if len(name) > 200 or len(source) > 200:
        raise ValueError("name: at most 200 characters" if len(name) > 200 else "source: at most 200 characters")
    return Reward(rollout_id=rollout_id, value=value, name=name, source=source)


async def _form(request: Request) -> Any:
    """The request's form: no file, at most :data:`MAX_FORM_FIELDS` fields (400 otherwise); its
    size is bounded by :class:`~agl_trainer.http.BodyLimits` around the app (413)."""
    return await request.form(max_files=0, max_fields=MAX_FORM_FIELDS)


def _too_large(exc: Exception) -> Response:
    """The answer to a body over the limit (or not readable): the error named, the connection closed
    (the rest of the body is not wanted)."""
    error = {"type": type(exc).__name__, "field": exc.field, "reason": str(exc)}
    return JSONResponse(
        {"error": error | ({"limit": exc.limit} if hasattr(exc, "limit") else {})},
        status_code=exc.status,
        headers={"Connection": "close"},
    )


def _with(params: Any, **values: str) -> Any:
    from starlette.datastructures import QueryParams

    items = [(k, v) for k, v in params.multi_items() if k not in values] + list(values.items())
    return QueryParams(items)


def _js_string(text: str) -> str:
    import json

    # </script> cannot end the script early: "<" is written as an escape.
    return json.dumps(text).replace("<", "\\u003c")


def dashboard_app(
    store: Store,
    *,
    token: str,
    prefix: str = "/ui",
    config: TransitionConfig | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Any:
    """The dashboard as an ASGI app whose routes live under ``prefix`` (listed in its ``routes``).

    ``config`` is the transition config credit assignment and the agent filter follow
    on the rollout page (the default: :class:`~agl_trainer.transitions.TransitionConfig`'s).
    A request body past ``max_body_bytes`` is refused with 413.
    """
    d = Dashboard(store, token, prefix, config)
    p, g = d.prefix, d.guarded
    routes = [
        Route(f"{p}/login", d.login_form, methods=["GET"]),
        Route(f"{p}/login", d.login, methods=["POST"]),
        Route(f"{p}/logout", d.logout, methods=["POST"]),
        Route(p or "/", g(d.home), methods=["GET"]),
        Route(f"{p}/", g(d.home), methods=["GET"]),
        Route(f"{p}/runs", g(d.runs), methods=["GET"]),
        Route(f"{p}/runs/charts", g(d.run_charts), methods=["GET"]),
        Route(f"{p}/rollouts", g(d.rollouts), methods=["GET"]),
        Route(f"{p}/traces", g(d.traces), methods=["GET"]),
        Route(f"{p}/rollouts/{{rollout_id:path}}/reward", g(d.add_reward), methods=["POST"]),
        Route(f"{p}/rollouts/{{rollout_id:path}}", g(d.rollout), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={kind: lambda r, exc: _too_large(exc) for kind in BODY_ERRORS})
    app.state.dashboard = d
    return _Hardened(BodyLimits(app, max_body_bytes, _too_large), app)


class _Hardened:
    """ASGI: every dashboard answer gets a strict Content-Security-Policy (unless it set its own),
    is not to be framed, sniffed, cached or told in a Referer."""

    HEADERS = (
        (b"content-security-policy", csp().encode()),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-store"),
    )

    def __init__(self, app: Any, starlette: Starlette):
        self.app = app
        self.state = starlette.state
        self.routes = starlette.routes

    async def __call__(self, scope, receive, send) -> None:
        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                have = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in self.HEADERS if n not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
