"""This package's error guard: its failures never reach the user's agent (see agl.capture.guard)."""

from agl.capture.guard import ErrorGuard

guard = ErrorGuard("agl_otel")
errors = guard.errors
report = guard.report
safe_emit = guard.emit
