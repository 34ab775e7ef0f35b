"""Test support for the integrations' framework-version checks (agl.capture.versions)."""

from __future__ import annotations


def fake_installed_version(monkeypatch, dist: str, version: str) -> None:
    """Make ``agl.capture.versions`` see ``version`` installed for ``dist``, with nothing warned yet."""
    from agl.capture import versions

    real = versions.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda d: version if d == dist else real(d))
    monkeypatch.setattr(versions, "_warned", set())
