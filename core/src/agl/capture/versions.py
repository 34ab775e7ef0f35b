"""The framework versions an integration was tested with, checked when it instruments.

Each integration declares a wide install range in its pyproject (up to the framework's next
major) and a narrower *tested* range, as OpenTelemetry's instrumentations keep an
``_instruments`` tuple::

    TESTED = "openai-agents>=0.24,<0.25"

and calls :func:`check_version` when it instruments. Inside the range nothing happens.
Outside it, the integration still instruments but warns once, with an
:class:`UntestedVersionWarning` that names the installed version, the tested range and what
still works; with ``AGL_STRICT_VERSIONS=1`` it raises :class:`UnsupportedVersionError`
instead, before touching the framework. A framework that is importable but not installed as
a distribution (no metadata) is not checked.

The comparison covers the specifiers the integrations use (``>=``, ``>``, ``<=``, ``<``,
``==``, ``!=``; release numbers with optional ``a``/``b``/``rc``/``.post``/``.dev`` parts),
without depending on ``packaging``.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
import warnings

from agl.capture.env import env_flag
from agl.errors import AglError

STRICT_ENV = "AGL_STRICT_VERSIONS"
"""Set to ``1`` (see :func:`agl.capture.env_flag`) to make an untested framework version an error."""


class UntestedVersionWarning(UserWarning):
    """An integration instruments a framework version outside the range it was tested with."""


class UnsupportedVersionError(AglError, RuntimeError):
    """An untested framework version with ``AGL_STRICT_VERSIONS`` on."""


_VERSION = re.compile(
    r"^\s*v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+[a-z0-9.]+)?\s*$",
    re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_SPEC = re.compile(r"^\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<version>[^\s,]+)\s*$")
_REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<specs>.*)$")


def _key(version: str) -> tuple[tuple[int, ...], tuple[int, int], int, tuple[int, int]]:
    """An ordering key: release numbers (trailing zeros dropped), pre-release, post-release, dev."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"not a version agl can compare: {version!r}")
    release = tuple(int(part) for part in match["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    dev = (0, int(match["dev"] or 0)) if match["dev"] is not None else (1, 0)
    if match["pre"] is not None:
        pre = (_PRE_RANK[match["pre"].lower()], int(match["pre_n"] or 0))
    elif match["dev"] is not None and match["post"] is None:
        pre = (-1, 0)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (3, 0)  # a final release
    post = int(match["post"] or 0) + 1 if match["post"] is not None else 0
    return release, pre, post, dev


def _is_prerelease(version: str) -> bool:
    match = _VERSION.match(version)
    return match is not None and (match["pre"] is not None or match["dev"] is not None)


def parse_requirement(requirement: str) -> tuple[str, list[tuple[str, str]]]:
    """``"openai-agents>=0.24,<0.25"`` → ``("openai-agents", [(">=", "0.24"), ("<", "0.25")])``."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement agl can read: {requirement!r}")
    specs = []
    for part in filter(None, (p.strip() for p in match["specs"].split(","))):
        spec = _SPEC.match(part)
        if spec is None:
            raise ValueError(f"not a version specifier agl can read: {part!r} in {requirement!r}")
        _key(spec["version"])  # refuse an unreadable bound now, not at comparison time
        specs.append((spec["op"], spec["version"]))
    return match["name"], specs


def satisfies(version: str, requirement: str) -> bool:
    """Whether ``version`` is inside ``requirement``'s range (its name is ignored).

    As in PEP 440, ``<V`` leaves out the pre-releases of ``V`` itself (``0.25.0rc1`` is not
    ``<0.25``).
    """
    _, specs = parse_requirement(requirement)
    key = _key(version)
    for op, bound in specs:
        other = _key(bound)
        if op == ">=" and not key >= other:
            return False
        if op == ">" and not key > other:
            return False
        if op == "<=" and not key <= other:
            return False
        if op == "<":
            if not key < other:
                return False
            if _is_prerelease(version) and not _is_prerelease(bound) and key[0] == other[0]:
                return False
        if op == "==" and key != other:
            return False
        if op == "!=" and key == other:
            return False
    return True


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it has no metadata."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


_warned: set[tuple[str, str, str]] = set()
_lock = threading.Lock()


def check_version(integration: str, tested: str, *, still_works: str, may_break: str) -> bool:
    """Check the installed framework against the ``tested`` range when ``integration`` instruments.

    Returns True inside the range (or when the framework has no installed metadata).
    Outside it, raises :class:`UnsupportedVersionError` if ``AGL_STRICT_VERSIONS`` is on, and
    otherwise warns once per integration and version with an :class:`UntestedVersionWarning`
    and returns False; the caller goes on instrumenting. ``still_works`` and ``may_break``
    complete the message: what rests on the framework's public API, and what does not.
    """
    distribution, _ = parse_requirement(tested)
    version = installed_version(distribution)
    if version is None:
        return True
    try:
        inside = satisfies(version, tested)
    except ValueError:
        inside = False  # a version agl cannot read is not one it was tested with
    if inside:
        return True
    message = (
        f"{integration} was tested with {tested}, but {distribution} {version} is installed. "
        f"Still works: {still_works}. May not work on this version: {may_break}; agl's failures "
        f"there are counted in {integration}.errors and never raised into the agent. "
        f"Install a tested version (pip install '{tested}')"
    )
    if env_flag(STRICT_ENV):
        raise UnsupportedVersionError(f"{message}, or unset {STRICT_ENV} to instrument anyway with a warning.")
    message += f", or set {STRICT_ENV}=1 to make this an error."
    with _lock:
        seen = (integration, distribution, version)
        first = seen not in _warned
        _warned.add(seen)
    if first:
        warnings.warn(message, UntestedVersionWarning, stacklevel=3)
    return False
