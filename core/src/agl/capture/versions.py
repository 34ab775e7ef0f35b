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

Versions and ranges are compared as PEP 440 says, as pip does: by ``packaging``, except
where both are plain (a version of release numbers only, ``1.8.3``, and a range of
``>=``/``>``/``<=``/``<``/``==``/``!=`` clauses on such numbers, as every ``TESTED`` is),
which compare here as ``packaging`` would, without importing it (``packaging.specifiers``
and ``packaging.requirements`` bring in half a MiB of modules a capturing process has no
other use for).
"""

from __future__ import annotations

import importlib.metadata
import itertools
import operator
import re
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from agl.capture.flags import env_flag
from agl.env import STRICT_VERSIONS
from agl.errors import AglError

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*")
_RELEASE = r"[0-9]+(?:\.[0-9]+)*"
_PLAIN_VERSION = re.compile(_RELEASE)
_PLAIN_CLAUSE = re.compile(rf"\s*(>=|<=|==|!=|<|>)\s*({_RELEASE})\s*")
_COMPARE: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
PlainRange = list[tuple[str, tuple[int, ...]]]


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _plain_requirement(requirement: str) -> tuple[str, PlainRange] | None:
    """``"name>=1.0,<2"`` → ``("name", [(">=", (1, 0)), ("<", (2,))])``; None for any other form
    (extras, markers, ``~=``, wildcards, pre-releases...), which :mod:`packaging` reads."""
    name = _NAME.match(requirement)
    if name is None:
        return None
    rest = requirement[name.end() :]
    clauses: PlainRange = []
    if rest:
        for text in rest.split(","):
            clause = _PLAIN_CLAUSE.fullmatch(text)
            if clause is None:
                return None
            clauses.append((clause.group(1), _release(clause.group(2))))
    return name.group(1), clauses


def _within(version: tuple[int, ...], clauses: PlainRange) -> bool:
    """Whether a plain release is in a plain range, compared as PEP 440 does (shorter releases
    padded with zeros; for a plain release, ``<`` and ``>`` exclude nothing more)."""
    for op, bound in clauses:
        width = max(len(version), len(bound))
        padded = tuple(itertools.islice(itertools.chain(version, itertools.repeat(0)), width))
        if not _COMPARE[op](padded, bound + (0,) * (width - len(bound))):
            return False
    return True


class UntestedVersionWarning(UserWarning):
    """An integration instruments a framework version outside the range it was tested with."""


class UnsupportedVersionError(AglError, RuntimeError):
    """An untested framework version with ``AGL_STRICT_VERSIONS`` on."""


def parse_requirement(requirement: str) -> tuple[str, SpecifierSet]:
    """``"openai-agents>=0.24,<0.25"`` → ``("openai-agents", SpecifierSet(">=0.24,<0.25"))``;
    ``ValueError`` for text that is not a requirement."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        raise ValueError(f"not a requirement agl can read: {requirement!r} ({exc})") from None
    return parsed.name, parsed.specifier


def satisfies(version: str, requirement: str) -> bool:
    """Whether ``version`` is inside ``requirement``'s range (its name is ignored), pre-releases
    included (as in PEP 440, ``<V`` still leaves out the pre-releases of ``V`` itself);
    ``ValueError`` for a version that is not PEP 440."""
    plain = _plain_requirement(requirement)
    if plain is not None and _PLAIN_VERSION.fullmatch(version):
        return _within(_release(version), plain[1])
    from packaging.version import InvalidVersion, Version

    _, specifier = parse_requirement(requirement)
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion as exc:
        raise ValueError(f"not a version agl can compare: {version!r}") from exc


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
    plain = _plain_requirement(tested)
    distribution = plain[0] if plain is not None else parse_requirement(tested)[0]
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
    if env_flag(STRICT_VERSIONS):
        raise UnsupportedVersionError(f"{message}, or unset {STRICT_VERSIONS} to instrument anyway with a warning.")
    message += f", or set {STRICT_VERSIONS}=1 to make this an error."
    with _lock:
        seen = (integration, distribution, version)
        first = seen not in _warned
        _warned.add(seen)
    if first:
        warnings.warn(message, UntestedVersionWarning, stacklevel=3)
    return False
