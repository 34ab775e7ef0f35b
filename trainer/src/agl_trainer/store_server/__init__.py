"""The store over HTTP: a JSON API that exposes every :class:`agl.store.Store` method.

``agl store serve`` runs it (:func:`serve`); :class:`ServerThread` serves it in a thread of
the caller's process; :class:`agl.store.http.HttpStore` is its client. The package holds
the app and its routes (:mod:`.app`), its request bodies (:mod:`.bodies`), its error answers
(:mod:`.errors`), who may call what (:mod:`.auth`), the expiry of silent runners' rollouts
(:mod:`.expiry`) and the server's life cycle (:mod:`.server`); its limit on bodies is the one
all agl's servers share (:mod:`agl_trainer.http`).

Every route except ``/healthz`` needs ``Authorization: Bearer <credential>`` (the
scheme in any case): the admin token opens every route, a runner token what running
rollouts needs, a rollout key its own rollout only (:mod:`.auth`).
Bodies are JSON; queries answer NDJSON (one model per line), streamed straight
from the store's iterators, so reading a million spans never holds them all.

Routes (``{x}`` is a path parameter; "list body" means ``{"<name>": [ ... ]}``):

==========  ===================================  =============================================
method      path                                 store method / answer
==========  ===================================  =============================================
GET         /healthz                             ``{"ok": true}`` (no token needed)
GET         /v1/stats                            ``stats()``
POST        /v1/flush                            ``flush()``
POST        /v1/tasks                            ``add_tasks``; list body ``tasks``
GET|POST    /v1/tasks/query                      ``query_tasks``; NDJSON of tasks
GET         /v1/tasks/{task_id}                  ``get_task``
POST        /v1/rollouts                         ``enqueue``; list body ``rollouts``
GET|POST    /v1/rollouts/query                   ``query_rollouts``; NDJSON of rollouts
GET         /v1/rollouts/{rollout_id}            ``get_rollout``
GET         /v1/rollouts/{rollout_id}/attempts   ``attempts``; ``{"attempts": [...]}``
POST        /v1/rollouts/{rollout_id}/finish     ``finish``; ``{"status", "error", "output"}``
POST        /v1/claims                           ``claim``; ``{"runner_id", "limit", "claim_id"}``
POST        /v1/heartbeats                       ``heartbeat``; ``{"runner_id", "rollout_ids"}``
POST        /v1/cancellations                    ``cancel``; ``{"rollout_ids"}``
POST        /v1/expirations                      ``expire``; ``{"heartbeat_timeout_s", "now"}``
POST        /v1/spans | /v1/llm_calls | /v1/rewards   ``add_*``; list body of that name
GET|POST    /v1/spans/query (and llm_calls, rewards)  ``query_*``; NDJSON
POST        /v1/model_versions                   ``add_model_version``; the model version
GET         /v1/model_versions/latest            ``latest_model_version`` (``null`` if none)
GET         /v1/model_versions/{version}         ``get_model_version``
POST|GET    /v1/run_steps                        ``add_step_record`` (``{"run_id", "record"}``) / ``step_records``
POST        /v1/batch                            several callers' writes in one request
==========  ===================================  =============================================

Ids in paths may contain ``/`` (``task-set/17``), percent-encoded or not; the
fixed routes (``/v1/tasks/query``, ``/v1/model_versions/latest``) take precedence.
Query filters come as a JSON body (POST) or as query parameters (GET, lists as
repeated parameters: ``?status=queued&status=running``); both are validated by
the same model. ``/v1/batch`` is what the client's write coalescing sends:
``{"spans": [...], "llm_calls": [...], "rewards": [...], "claims": [{runner_id,
limit, claim_id}], "finishes": [{rollout_id, status, error, output, attempt}]}``; the
observations are stored together and the answer has one result per claim and
per finish, each ``{"rollouts": [...]}`` / ``{"rollout": {...}}`` or
``{"error": {...}}``, so one caller's unknown rollout fails only that caller.
When the SQL store's writer is idle, a batch runs on the event loop (it commits at
once, sparing two thread hand-offs); otherwise, and for a second after one of those
took over ``INLINE_MAX_S``, it runs on a worker thread.

Errors answer ``{"error": {"type", "field", "reason", ...}}``: 401 without a valid
credential (or with a rollout key whose attempt ended), 403 for a route or a rollout
outside the credential's scope, 404 for an unknown id (``NotFound``, with ``kind`` and ``ident``),
409 for a status change the status machine forbids (``InvalidTransition``, naming
the rollout's status), 413 for a body over the limit (``max_body_bytes``, on every
route, plugin routes included; a ``gzip`` or ``deflate`` body is inflated as it is
read and may not inflate past the same limit), 415 for another
``Content-Encoding``, 422 for a body that fails validation (``field`` is the
dotted path of the first bad value: NaN, infinity, integers past 64 bits and JSON
nested past :data:`agl.schema.MAX_JSON_DEPTH` are refused), 503 with
``Retry-After`` when the database stays unavailable (a locked SQLite database is
waited on for at most ``max_lock_wait_s``, less than the client's timeout).
A 5xx names no path, URL or database message: those go to the server's log
under a request id, which the answer gives in its body (``request_id``) and in
an ``X-Request-Id`` header.
A query that fails after its first line ends with one line ``{"agl_stream_error":
{...}}``. Writes are idempotent by id; an ``Idempotency-Key`` header additionally
lets the server answer a retried request from a small cache of recent answers.

Late data: a span, LLM call or reward for a rollout that already ended is stored
like any other and shows in every later query; nothing is dropped.

Expiry: the server takes back the rollouts of runners gone silent (no heartbeat for
``heartbeat_timeout_s``, 60 s by default) every ``expire_every_s`` (10 s), so they do
not stay ``running`` when no trainer calls ``expire`` (see :mod:`.expiry`).

Dashboard: under ``/ui`` the server serves the web pages of :mod:`agl_trainer.dashboard` (a
SQLite or PostgreSQL store), which take the admin token as a bearer token or through a login
form's cookie; ``/v1/run_steps`` holds the trainer's step records they chart.
"""

from agl_trainer.http import DEFAULT_MAX_BODY_BYTES
from agl_trainer.store_server.app import DEFAULT_MAX_LOCK_WAIT_S, create_app
from agl_trainer.store_server.auth import BearerAuth
from agl_trainer.store_server.server import DEFAULT_EXPIRE_EVERY_S, DEFAULT_HEARTBEAT_TIMEOUT_S, ServerThread, serve

__all__ = [
    "DEFAULT_EXPIRE_EVERY_S",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_LOCK_WAIT_S",
    "BearerAuth",
    "ServerThread",
    "create_app",
    "serve",
]
