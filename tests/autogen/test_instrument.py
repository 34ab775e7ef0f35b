"""AGL_AUTOGEN_INSTRUMENT: the installed .pth file instruments at interpreter start, read by agl.capture.env_flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = "import sys; print('agl_autogen' in sys.modules); import agl_autogen; print(agl_autogen.instrumented())"


def _start(tmp_path, value: str) -> subprocess.CompletedProcess[str]:
    env = {"AGL_AUTOGEN_INSTRUMENT": value, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("value", "loaded", "on"),
    [("1", True, True), (" ON ", True, True), ("0", False, False), ("", False, False), ("no", False, False)],
)
def test_env_var_instruments_at_startup(tmp_path, value, loaded, on):
    out = _start(tmp_path, value)
    assert out.stdout.split() == [str(loaded), str(on)], out.stderr
    assert "agl_autogen" not in out.stderr


@pytest.mark.slow
def test_a_value_env_flag_refuses_is_reported_and_leaves_capture_off(tmp_path):
    out = _start(tmp_path, "enabled")
    assert out.stdout.split() == ["True", "False"], out.stderr
    assert "AGL_AUTOGEN_INSTRUMENT='enabled': use 1, true, yes or on" in out.stderr
