"""HTML pieces of the dashboard: the page frame, escaping, small formatters.

Every value that reaches a page goes through :func:`e` (or :func:`attr`), so span text,
task inputs and model output show as text, never as markup.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any
from urllib.parse import quote, urlencode

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfd8ea;text-decoration:none}header a.on{color:#fff;font-weight:600}
header form{margin-left:auto}main{padding:16px}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border-bottom:1px solid #e3e6ec;padding:4px 8px;text-align:left;vertical-align:top}
th a{color:inherit}td.num{text-align:right;font-variant-numeric:tabular-nums}
.card{background:#fff;border:1px solid #e3e6ec;border-radius:6px;padding:12px;margin:0 0 14px}
.charts{display:flex;flex-wrap:wrap;gap:14px}.charts .card{flex:0 0 auto}
.err{color:#b3261e}.muted{color:#6b7384}pre{white-space:pre-wrap;word-break:break-word;margin:4px 0}
.s-succeeded{color:#1b7f3b}.s-failed,.s-timed_out{color:#b3261e}.s-running,.s-queued{color:#8a6d00}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin-bottom:10px}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#6b7384}
form.filters input,form.filters select{width:110px}
.tree{position:relative}.span{display:flex;align-items:center;gap:6px;border-bottom:1px solid #f0f1f4}
.span .name{flex:0 0 330px;box-sizing:border-box;overflow:hidden;white-space:nowrap;text-overflow:ellipsis}
.span .lane{flex:1;position:relative;height:16px;background:#f6f7f9}
.span .bar{position:absolute;top:2px;height:12px;border-radius:2px;min-width:2px}
.k-agent{background:#5b7be0}.k-llm{background:#c2185b}.k-tool{background:#f39c12}
.k-reward{background:#1b7f3b}.k-custom{background:#8a94a6}
.kind{font-size:11px;padding:0 4px;border-radius:3px;color:#fff}
.tok{font-family:monospace;font-size:12px;padding:1px 2px;margin:1px;display:inline-block;border-radius:2px}
.msg{border-left:3px solid #cfd8ea;padding-left:8px;margin:6px 0}.role{font-weight:600;font-size:12px}
svg text{font-size:11px;fill:#4a5263}.pager a,.pager span{margin-right:10px}
"""


def e(value: Any) -> str:
    """Text for an HTML element's content or a quoted attribute: markup characters escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def attr(value: Any) -> str:
    """A quoted attribute value."""
    return f'"{e(value)}"'


def url(path: str, params: list[tuple[str, str]] | None = None) -> str:
    """``path`` with ``params`` as a query string (for an ``href``, still to be escaped with :func:`attr`)."""
    return path + ("?" + urlencode(params) if params else "")


def path_id(ident: str) -> str:
    """An id for a URL path segment (ids may hold ``/``, kept as it is: the routes take paths)."""
    return quote(ident, safe="/")


def when(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"


def number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}g}"


def pretty_json(value: Any) -> str:
    """A JSON value as indented text (escaped)."""
    return e(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def csp(nonce: str | None = None) -> str:
    """The Content-Security-Policy of a page: nothing from elsewhere, inline styles, and no script
    but the page's own (the one carrying ``nonce``), so markup that got past escaping cannot run."""
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    return (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src {script}; connect-src 'self'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


def page(
    title: str,
    body: str,
    *,
    prefix: str,
    active: str = "",
    logged_in: bool = True,
    script: str = "",
    nonce: str = "",
) -> str:
    """A whole page: the navigation bar, ``body`` (already HTML) and an optional inline script
    (which runs only under a policy naming its ``nonce``, see :func:`csp`)."""
    nav = ""
    if logged_in:
        links = [("runs", "Runs"), ("rollouts", "Rollouts"), ("traces", "Traces")]
        nav = "".join(
            f'<a href={attr(f"{prefix}/{name}")} class="{"on" if name == active else ""}">{label}</a>'
            for name, label in links
        )
        nav += f'<form method="post" action={attr(prefix + "/logout")}><button>Log out</button></form>'
    tail = f'<script nonce="{e(nonce)}">{script}</script>' if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} · agl</title><style>{CSS}</style></head>"
        f"<body><header><strong>agl</strong>{nav}</header><main>{body}</main>{tail}</body></html>"
    )
