"""Every environment variable agl reads or sets, each named once here.

Code reads a variable through its constant (``os.environ.get(env.STORE_URL)``), never
through a string of its own, so a name cannot drift between the places that use it;
a test holds the rest of the code to that; the environment reference is generated from it. Each
constant is a :class:`Variable`: a ``str`` (the name) that also carries what the
variable holds, who reads it and what applies when it is unset.

The one exception is the one-line ``.pth`` file of each integration
(``AGL_<FRAMEWORK>_INSTRUMENT``): Python runs it at interpreter start, before any
import could be trusted to succeed, so it spells the name out; its test checks that it
spells the same name as :data:`LANGCHAIN_INSTRUMENT` and the others.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping


class Variable(str):
    """The name of an environment variable, usable wherever a ``str`` is, with its documentation."""

    what: str
    """What the variable holds."""
    read_by: str
    """Who reads it (and, for the variables ``agl run`` hands its child, that it does)."""
    default: str
    """What applies when it is unset."""

    def __new__(cls, name: str, *, what: str, read_by: str, default: str) -> Variable:
        if not name.startswith("AGL_"):
            raise ValueError(f"{name}: agl's variables start with AGL_")
        self = super().__new__(cls, name)
        self.what, self.read_by, self.default = what, read_by, default
        return self

    def get(self) -> str | None:
        """The variable's value in this process's environment, None when unset."""
        return os.environ.get(self)


# -- where the store is, and the credentials for it ------------------------------------
STORE_URL = Variable(
    "AGL_STORE_URL",
    what="the store every command, the trainer and the capture writer use when none is named",
    read_by="every agl command, agl train, capture in an agent's process; agl run sets it for its child",
    default="`.agl/agl.db` in the current directory",
)
STORE_TOKEN = Variable(
    "AGL_STORE_TOKEN",
    what="the bearer token for an http:// store (an admin or runner token); the admin token of "
    "`agl store serve` and of `agl dashboard`'s pages",
    read_by="the HTTP store client, `--store-token` of every command, `--admin-token` of "
    "`agl store serve` and `agl dashboard`",
    default="none (servers make one up and print it)",
)
STORE_RUNNER_TOKEN = Variable(
    "AGL_STORE_RUNNER_TOKEN",
    what="the store server's runner token: claim, heartbeat, finish, write running rollouts' observations",
    read_by="`--runner-token` of `agl store serve`",
    default="none: no runner scope",
)

# -- the gateway and the engines behind it ---------------------------------------------
GATEWAY_URL = Variable(
    "AGL_GATEWAY_URL",
    what="the gateway's root URL, e.g. http://127.0.0.1:8088",
    read_by="`--gateway` of `agl run` and `agl runner`",
    default="no gateway: the agent's OpenAI variables are left as they are",
)
GATEWAY_TOKEN = Variable(
    "AGL_GATEWAY_TOKEN",
    what="the gateway's bearer token for production traffic (calls with no rollout)",
    read_by="`--gateway-token` of `agl gateway serve` and `agl runner`",
    default="none (the gateway makes one up and prints it)",
)
GATEWAY_ADMIN_TOKEN = Variable(
    "AGL_GATEWAY_ADMIN_TOKEN",
    what="the bearer token of the gateway's `/admin` routes",
    read_by="`--admin-token` of `agl gateway serve`",
    default="none (the gateway makes one up and prints it)",
)
ENGINE_API_KEY = Variable(
    "AGL_ENGINE_API_KEY",
    what="the bearer token the inference engines expect",
    read_by="`--engine-token` of `agl engine serve` and `agl gateway serve`",
    default="none (`agl engine serve` makes one up and prints it)",
)

# -- rollout keys, and what `agl run` hands its child ----------------------------------
ROLLOUT_KEY_SECRET = Variable(
    "AGL_ROLLOUT_KEY_SECRET",
    what="the secret rollout keys are made and checked with (at least 16 bytes)",
    read_by="`--rollout-key-secret-file` of `agl store serve`, `agl gateway serve`, `agl run`, "
    "`agl runner`; the trainer",
    default="none: the gateway makes one up; the store server hands out no keys",
)
ROLLOUT_KEY = Variable(
    "AGL_ROLLOUT_KEY",
    what="one rollout's own key: the agent's gateway key and store credential",
    read_by="the HTTP store client and `agl run --rollout-id`; `agl run` sets it for its child",
    default="none",
)
ROLLOUT_ID = Variable(
    "AGL_ROLLOUT_ID",
    what="the rollout the process is: its spans belong to it",
    read_by="capture in the agent's process; `agl run` sets it for its child, `agl runner --set-env` for its agent",
    default="none: each top-level run is a production rollout of its own",
)
TASK_INPUT = Variable(
    "AGL_TASK_INPUT",
    what="the rollout's task input as JSON",
    read_by="the program `agl run` starts, which it sets it for",
    default="none",
)
RESOURCES_DIR = Variable(
    "AGL_RESOURCES_DIR",
    what="a folder holding the rollout's resources as files: <name>.txt for a text (a prompt), <name>.json "
    "for anything else (few-shot examples); removed when the program ends",
    read_by="the program `agl run` starts, which it sets it for when the rollout has resources "
    "(a prompt an optimizer such as agl-apo chose)",
    default="none",
)

# -- plugins and framework capture -----------------------------------------------------
LOAD_PLUGINS = Variable(
    "AGL_LOAD_PLUGINS",
    what="which installed plugins load: comma-separated entry-point names (empty: none)",
    read_by="`agl.plugins`, in every process",
    default="all installed plugins",
)
STRICT_VERSIONS = Variable(
    "AGL_STRICT_VERSIONS",
    what="on (1, true, yes, on): an untested framework version is an error, not a warning",
    read_by="each integration's version check",
    default="off: a warning",
)
LANGCHAIN_INSTRUMENT = Variable(
    "AGL_LANGCHAIN_INSTRUMENT",
    what="on (1, true, yes, on): capture every LangChain run with no code change",
    read_by="agl-langchain's `.pth` file, at interpreter start",
    default="off",
)
AUTOGEN_INSTRUMENT = Variable(
    "AGL_AUTOGEN_INSTRUMENT",
    what="on (1, true, yes, on): capture every AutoGen AgentChat model client with no code change",
    read_by="agl-autogen's `.pth` file, at interpreter start",
    default="off",
)
OPENAI_AGENTS_INSTRUMENT = Variable(
    "AGL_OPENAI_AGENTS_INSTRUMENT",
    what="on (1, true, yes, on): capture every OpenAI Agents SDK run with no code change",
    read_by="agl-openai-agents' `.pth` file, at interpreter start",
    default="off",
)

# -- models ----------------------------------------------------------------------------
MODEL_CACHE = Variable(
    "AGL_MODEL_CACHE",
    what="where converted models are kept",
    read_by="agl-verl's model presets: `agl engine serve --preset`, `agl engine model-path`",
    default="`~/.cache/agl/models`",
)

VARIABLES: tuple[Variable, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Variable))
"""Every variable above, in the order they are listed."""

RETIRED: dict[str, Variable] = {
    "AGL_UPSTREAM_API_KEY": ENGINE_API_KEY,
}
"""Variables agl read once, each with the one that took its place (a reader that would have
read one refuses to start while it is set, naming its successor)."""

RENAMED: dict[str, Variable] = {
    "AGL_LANGCHAIN": LANGCHAIN_INSTRUMENT,
}
"""Names agl's switches had before they were renamed, each with its present name: nothing reads
them any more (unlike :data:`RETIRED`, setting one stops nothing), so :func:`warn_unknown` names
the present one."""

MISSPELLING_DISTANCE = 2
"""How many single-character edits (insertions, deletions, substitutions, swaps of two neighbours)
an ``AGL_*`` name may be from one of agl's variables to count as its misspelling."""

READ_ELSEWHERE: dict[str, str] = {
    "AGL_FUZZ_SEED": "tests/reliability: the fuzzer's seed, to replay a failure",
    "AGL_FUZZ_REQUESTS": "tests/reliability: how many requests the fuzzer sends each server",
    "AGL_TEST_INSTRUMENT": "tests/core: the switch the capture tests set and read",
    "AGL_VLLM_VENV": "tests/vllm: the virtual environment vLLM is installed in",
    "AGL_TORCH_INDEX": "scripts/setup-vllm.sh: an extra package index for torch",
}
"""``AGL_*`` variables that the test suite and setup scripts read, not agl: set, they are not
mistakes, so :func:`warn_unknown` leaves them alone."""


def retired_in_use() -> list[str]:
    """One line per retired variable set in this process's environment, naming the one to use instead."""
    return [f"${old} is no longer read: set ${new} instead" for old, new in RETIRED.items() if old in os.environ]


_KNOWN = frozenset(map(str, VARIABLES)) | RETIRED.keys() | READ_ELSEWHERE.keys()
_log = logging.getLogger(__name__)
_warned: set[str] = set()


def edit_distance(a: str, b: str, limit: int = MISSPELLING_DISTANCE) -> int:
    """The optimal-string-alignment distance between ``a`` and ``b`` (Levenshtein's, with a swap of
    two neighbouring characters one edit), or ``limit + 1`` for any distance past ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] | None = None
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        now = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            now[j] = min(row[j] + 1, now[j - 1] + 1, row[j - 1] + (ca != cb))
            if before is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                now[j] = min(now[j], before[j - 2] + 1)
        before, row = row, now
    return min(row[-1], limit + 1)


def likely_meant(name: str) -> str | None:
    """The agl variable an ``AGL_*`` name that nothing reads most likely meant: the present name
    of a renamed switch, else the nearest of agl's variables within :data:`MISSPELLING_DISTANCE`
    edits (None: not a name of agl's, such as a user's own ``AGL_REPO``)."""
    if name in RENAMED:
        return str(RENAMED[name])
    distances = {str(v): edit_distance(name, v) for v in VARIABLES}
    nearest = min(distances, key=distances.__getitem__)
    return nearest if distances[nearest] <= MISSPELLING_DISTANCE else None


def unknown(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``AGL_*`` variables set in ``environ`` (default: this process's) that nothing reads and that
    look meant for agl, each with the variable it most likely meant: a misspelling of one of
    agl's variables or a renamed switch's old name. Other ``AGL_*`` names (a user's own
    ``AGL_REPO``) are none of agl's business and are left out."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name in environ:
        if name.startswith("AGL_") and name not in _KNOWN and (target := likely_meant(name)) is not None:
            found[name] = target
    return found


def unknown_line(name: str, meant: str | None) -> str:
    """The warning for one unknown variable ``name``, naming ``meant`` when there is one."""
    return f"${name} is set but agl reads no such variable" + (f"; did you mean ${meant}?" if meant else "")


def warn_unknown() -> list[str]:
    """Warn (logger ``agl.env``) about each unknown ``AGL_*`` variable of this process, once per
    process and variable however many readers call this; the lines warned now."""
    lines = [unknown_line(name, meant) for name, meant in unknown().items() if name not in _warned]
    _warned.update(unknown())
    for line in lines:
        _log.warning("%s", line)
    return lines
