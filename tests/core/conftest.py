import pytest

from tests.core.backends import BACKENDS


@pytest.fixture(params=sorted(BACKENDS))
def store(request, tmp_path):
    """A fresh store of each backend in turn."""
    if request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
    with BACKENDS[request.param].open_backend(tmp_path) as s:
        yield s
