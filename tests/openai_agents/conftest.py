"""Fixtures for agl-openai-agents: the real gateway and one rollout, agl's processor added once."""

from __future__ import annotations

import pytest
from agents.tracing import TracingProcessor


class Collecting(TracingProcessor):
    """The user's own processor: it must keep seeing everything next to agl's."""

    def __init__(self):
        self.ended: list = []

    def on_trace_start(self, trace):
        pass

    def on_trace_end(self, trace):
        pass

    def on_span_start(self, span):
        pass

    def on_span_end(self, span):
        self.ended.append(span)

    def shutdown(self):
        pass

    def force_flush(self):
        pass


@pytest.fixture(scope="session")
def user_processor():
    from agents import add_trace_processor

    import agl_openai_agents

    processor = Collecting()
    add_trace_processor(processor)
    agl_openai_agents.instrument()
    return processor


@pytest.fixture
def gateway_rollout(sqlite_store, user_processor):
    from tests.autogen.gateway_rig import gateway_rollout as rig

    with rig(sqlite_store) as r:
        yield r
