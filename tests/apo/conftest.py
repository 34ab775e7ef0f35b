import pytest

import agl_apo.plugin
from agl.plugins import get_plugin_manager, register, unregister
from tests.apo.scripted_model import ScriptedModel
from tests.fake_engine import FakeEngine


@pytest.fixture(scope="module", autouse=True)
def apo_registered():
    """The ``apo`` backend by name, as the package's entry point registers it once installed."""
    if get_plugin_manager().is_registered(agl_apo.plugin):
        yield
        return
    register(agl_apo.plugin, name="agl_apo-tests")
    yield
    unregister(name="agl_apo-tests")


@pytest.fixture
def scripted():
    with ScriptedModel() as model:
        yield model


@pytest.fixture
def engine():
    with FakeEngine() as eng:
        yield eng
