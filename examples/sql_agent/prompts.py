"""The prompts: a one-line schema and three worked examples, kept short for a 135M model.

SmolLM2-135M-Instruct writes prose when shown the full ``CREATE TABLE`` schema; a
compact ``Table(col, ...)`` line and example answers in fenced blocks get SQL out of it
(see docs/results/sql-agent.md). No example's question is of a template's kind.

The writer's instructions and worked examples can be changed per rollout by a prompt optimizer
(agl-apo): the rollout's resources ``writer_system`` (a text) and ``few_shot`` (``Question:
<q>\nAnswer: <a>`` texts) replace :data:`WRITER_SYSTEM` and :data:`WRITER_EXAMPLES` when given.
Without them (every RL arm) the messages are exactly these defaults.
"""

from __future__ import annotations

import re
from typing import Any

import agl

SCHEMA = (
    "Artist(ArtistId, Name) Album(AlbumId, Title, ArtistId) "
    "Track(TrackId, Name, AlbumId, GenreId, Composer, Milliseconds) Genre(GenreId, Name) "
    "Customer(CustomerId, FirstName, LastName, City, Country, Email) "
    "Invoice(InvoiceId, CustomerId, InvoiceDate, BillingCity, BillingCountry, Total)"
)

WRITER_SYSTEM = f"Write an SQLite query for the question. Tables: {SCHEMA}"
EXAMPLE_QUESTION = "Which tracks are longer than 900000 milliseconds?"
EXAMPLE_SQL = "SELECT Name FROM Track WHERE Milliseconds > 900000"
EXAMPLE_ANSWER = f"```sql\n{EXAMPLE_SQL}\n```"
WRITER_EXAMPLES = (
    (EXAMPLE_QUESTION, EXAMPLE_SQL),
    ("How many tracks are longer than 900000 milliseconds?", "SELECT COUNT(*) FROM Track WHERE Milliseconds > 900000"),
    ("What is the name of the genre with id 3?", "SELECT Name FROM Genre WHERE GenreId = 3"),
)
"""The writer's and the rewriter's worked examples: a filter, a count and a lookup by id, each of
no template's kind (see docs/results/sql-agent.md for what they changed on validation)."""

CHECKER_SYSTEM = "Does the SQL answer the question? Reply YES, or NO and the mistake."
CHECK_USER = "Question: {question}\nSQL: {sql}"
NO_QUERY = "(none)"
"""What the checker and the rewriter are shown when the answer held no query."""
CHECK_EXAMPLES = (
    (CHECK_USER.format(question=EXAMPLE_QUESTION, sql=EXAMPLE_SQL), "YES"),
    (CHECK_USER.format(question=EXAMPLE_QUESTION, sql=NO_QUERY), "NO, there is no query."),
)

_CHECKED = re.compile(
    re.escape(CHECK_USER)
    .replace(re.escape("{question}"), "(?P<question>.*?)")
    .replace(re.escape("{sql}"), "(?P<sql>.*)"),
    re.DOTALL,
)


def checked_query(text: str) -> str | None:
    """The query a checker's last message (:data:`CHECK_USER`) showed it: "" when it was shown
    :data:`NO_QUERY`, None when ``text`` is not such a message."""
    match = _CHECKED.fullmatch(text or "")
    if match is None:
        return None
    sql = match.group("sql")
    return "" if sql == NO_QUERY else sql


REWRITE_USER = "{question}\nThis query is wrong: {sql}\nReviewer: {feedback}\nWrite the correct query."


WRITER_SYSTEM_RESOURCE = "writer_system"
FEW_SHOT_RESOURCE = "few_shot"
DEFAULT_RESOURCES = {
    WRITER_SYSTEM_RESOURCE: WRITER_SYSTEM,
    FEW_SHOT_RESOURCE: [f"Question: {q}\nAnswer: ```sql\n{sql}\n```" for q, sql in WRITER_EXAMPLES],
}
"""The writer's resources as a prompt optimizer starts from them: the texts above."""


def _resources() -> dict[str, Any]:
    """The current rollout's resources (none outside a rollout)."""
    ctx = agl.current_rollout()
    return ctx.resources if ctx is not None else {}


def _writer_system() -> str:
    return _resources().get(WRITER_SYSTEM_RESOURCE, WRITER_SYSTEM)


def _worked_examples() -> list[tuple[str, str]]:
    demos = _resources().get(FEW_SHOT_RESOURCE)
    if demos is None:
        return [m for question, sql in WRITER_EXAMPLES for m in (("human", question), ("ai", f"```sql\n{sql}\n```"))]
    pairs = [demo.removeprefix("Question: ").partition("\nAnswer: ") for demo in demos]
    return [m for question, _, answer in pairs for m in (("human", question), ("ai", answer))]


def writer_messages(question: str) -> list[tuple[str, str]]:
    """The messages that ask for a first query."""
    return [("system", _writer_system()), *_worked_examples(), ("human", question)]


def checker_messages(question: str, sql: str) -> list[tuple[str, str]]:
    """The messages that ask whether ``sql`` answers ``question``."""
    shots = [m for user, reply in CHECK_EXAMPLES for m in (("human", user), ("ai", reply))]
    return [("system", CHECKER_SYSTEM), *shots, ("human", CHECK_USER.format(question=question, sql=sql))]


def rewriter_messages(question: str, sql: str, feedback: str) -> list[tuple[str, str]]:
    """The messages that ask for a corrected query, with the checker's words."""
    user = REWRITE_USER.format(question=question, sql=sql, feedback=feedback.strip() or "NO")
    return [("system", _writer_system()), *_worked_examples(), ("human", user)]


_FENCE = re.compile(r"```(?:sql|sqlite)?\s*(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_SELECT = re.compile(r"\b(SELECT|WITH)\b.*", re.DOTALL | re.IGNORECASE)


def extract_sql(text: str) -> str:
    """The query in a model's answer: the first fenced block, else from the first SELECT/WITH on.

    Only the first statement is kept (up to a ``;``); an answer with no query gives "".
    """
    text = text or ""
    match = _FENCE.search(text)
    body = match.group(1) if match else text
    query = _SELECT.search(body)
    if query is None:
        return ""
    return query.group(0).split(";", 1)[0].strip()


def accepted(verdict: str) -> bool:
    """Whether the checker's reply accepts the query (it begins with "yes")."""
    return verdict.strip().lstrip("*#\"' ").lower().startswith("yes")
