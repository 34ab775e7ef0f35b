"""Text-completion LLMs, retrievers and recorded chain inputs/outputs."""

from __future__ import annotations

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import FakeListLLM
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda

import agl
from agl_langchain import AglCallbackHandler


class KeywordRetriever(BaseRetriever):
    """Returns the stored documents that contain the query."""

    docs: list[str]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=d, metadata={"i": i}) for i, d in enumerate(self.docs) if query in d]


def test_text_completion_llm(cap):
    llm = FakeListLLM(responses=["forty-two"])
    with agl.use_rollout(cap.ctx):
        assert llm.invoke("the answer?", config={"callbacks": [AglCallbackHandler()]}) == "forty-two"
    (span,) = cap.spans(kind="llm")
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert span.attributes["gen_ai.input.messages"] == [{"role": "user", "content": "the answer?"}]
    assert span.attributes["gen_ai.output.messages"] == [{"role": "assistant", "content": "forty-two"}]


def test_retriever_and_chain_io(cap):
    retriever = KeywordRetriever(docs=["owls hunt at night", "bats fly", "owls hoot"])
    chain = retriever | RunnableLambda(lambda docs: len(docs)).with_config(run_name="count")
    with agl.use_rollout(cap.ctx):
        assert chain.invoke("owls", config={"callbacks": [AglCallbackHandler(record_chain_io=True)]}) == 2
    by_name = {s.name: s for s in cap.spans()}
    tool = by_name["KeywordRetriever"]
    assert tool.kind == "tool" and tool.attributes["agl.retriever.query"] == "owls"
    assert [d["page_content"] for d in tool.attributes["agl.retriever.documents"]] == [
        "owls hunt at night",
        "owls hoot",
    ]
    count = by_name["count"]
    assert count.attributes["agl.chain.outputs"] == 2
    assert count.attributes["agl.chain.inputs"][0]["page_content"] == "owls hunt at night"
