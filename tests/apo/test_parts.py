"""The ``apo`` backend's parts: settings errors that name the field, what it refuses at setup, the
optimizer's answers from a weak model (counted, never raised), and ``engine: true``.

The optimizer is tests/apo/scripted_model.py: a real HTTP server whose answers are a script.
"""

from __future__ import annotations

import socket

import pytest

from agl.errors import ConfigError
from agl.plugins import resolve
from agl.schema import Task
from agl_apo.backend import ApoBackend
from agl_apo.optimizer import Failure, OptimizerModel, extract_prompts
from agl_apo.settings import OptimizerSettings
from agl_trainer.backend import BackendContext
from agl_trainer.engine import Engine
from tests.apo.scripted_model import CRITIQUE, OPTIMIZER


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "backend.config: optimizer: needed for textual_gradient"),
        ({"methods": []}, "backend.config.methods: List should have at least 1 item"),
        ({"methods": ["bootstrap_demos", "gradient"]}, "backend.config.methods.1: Input should be 'textual_gradient'"),
        (
            {"methods": ["bootstrap_demos", "bootstrap_demos"]},
            "backend.config.methods: bootstrap_demos given more than once",
        ),
        ({"methods": ["bootstrap_demos"], "beam_width": 0}, "backend.config.beam_width: Input should be greater"),
        ({"methods": ["bootstrap_demos"], "beam": 2}, "backend.config.beam: not a setting of apo (the keys there: "),
        ({"methods": ["bootstrap_demos"], "beam_widht": 2}, "not a setting of apo (did you mean beam_width?)"),
        ({"optimizer": {"base_url": "http://x/v1"}}, "backend.config.optimizer: model: needed with base_url"),
        ({"optimizer": {"model": "m"}}, "backend.config.optimizer: give base_url"),
        ({"optimizer": {"engine": True, "base_url": "http://x/v1"}}, "give base_url or engine: true, not both"),
        (
            {"optimizer": {"engine": True, "key": "k"}},
            "backend.config.optimizer.key: not a setting of apo (did you mean optimizer.api_key?)",
        ),
        (
            {"methods": ["bootstrap_demos"], "demos_resource": "system_prompt"},
            "backend.config: demos_resource: must differ from resource",
        ),
    ],
)
def test_bad_settings_name_the_field(config, message):
    with pytest.raises(ConfigError) as err:
        resolve("backend", "apo", config)
    assert message in str(err.value)


def _backend(**config) -> ApoBackend:
    return ApoBackend(**{"methods": ["bootstrap_demos"], **config})


def _context(**fields) -> BackendContext:
    """A trainer's context for apo: a scorer that scores 0 and one task to score, with ``fields`` over them."""
    scores = {
        "score": lambda tasks, version, resources: [0.0 for _ in tasks],
        "score_tasks": [Task(task_id="v0", input={})],
    }
    return BackendContext(**{**scores, **fields})


def test_setup_refuses_what_the_run_does_not_declare(scripted):
    gradients = _backend(methods=["textual_gradient"], optimizer={"base_url": scripted.url, "model": "m"})
    with pytest.raises(ConfigError, match=r"resources.system_prompt: apo rewrites it \(backend.config.resource\)"):
        gradients.setup(None, _context(initial_resources=("r0", {"prompt": "x"})))
    demos = _backend()
    with pytest.raises(ConfigError, match="resources.few_shot: demonstrations go there, so it must be a list"):
        demos.setup(None, _context(initial_resources=("r0", {"few_shot": "not a list"})))
    alone = _backend()
    with pytest.raises(ConfigError, match="needs the trainer's score"):
        alone.setup(None, _context(score=None))
    with pytest.raises(ConfigError, match="needs the trainer's score"):
        alone.setup(None)  # outside a trainer
    nothing = _backend()
    with pytest.raises(ConfigError, match="no tasks to score candidates on"):
        nothing.setup(None, _context(score_tasks=[]))
    engine_less = _backend(methods=["textual_gradient"], optimizer={"engine": True})
    with pytest.raises(ConfigError, match="optimizer.engine: true needs the run's engine"):
        engine_less.setup(None, _context(initial_resources=("r0", {"system_prompt": "x"})))
    with pytest.raises(ConfigError, match=r"optimizer.api_key_env: \$APO_TEST_UNSET_KEY is not set"):
        OptimizerSettings(base_url=scripted.url, model="m", api_key_env="APO_TEST_UNSET_KEY").key()


@pytest.mark.parametrize(
    ("answer", "prompts", "fenced"),
    [
        ("```\nBe brief.\n```\n```text\nBe exact.\n```", ["Be brief.", "Be exact."], True),
        ("Sure! ```\nBe brief.\n``` and again ```\nBe brief.\n```", ["Be brief."], True),  # a repeat goes
        ("```\nAnswer.\n```", [], True),  # the parent again is no candidate
        ("Be polite and exact.", ["Be polite and exact."], False),  # no fence: the answer as a prompt
        ("```\nBe brief.", [], False),  # a fence never closed (cut off at max_tokens)
        ("", [], False),
        ("x" * 5000, [], False),  # too long to be the prompt
    ],
)
def test_prompts_are_taken_from_fenced_blocks_or_a_plausible_answer(answer, prompts, fenced):
    assert extract_prompts(answer, "Answer.", limit=2000) == (prompts, fenced)


class _ScriptedEngine(Engine):
    """An agl Engine whose replica is the scripted server: what ``optimizer.engine: true`` calls."""

    def __init__(self, url: str):
        self.url = url

    def start(self) -> list[str]:
        return [self.url]

    def load_version(self, version) -> None:
        raise AssertionError("apo never loads weights")

    @property
    def model_version(self) -> str | None:
        return "base"


def test_the_optimizer_can_be_the_runs_own_engine(scripted):
    backend = _backend(methods=["textual_gradient"], optimizer={"engine": True})
    backend.setup(_ScriptedEngine(scripted.url), _context(initial_resources=("r0", {"system_prompt": "Answer."})))
    assert backend.optimizer.model == "scripted-optimizer"  # the first model the engine lists
    critique = backend.optimizer.critique("Answer.", [Failure("q", "a", 0.0)], limit=100, seed=0)
    assert critique == CRITIQUE and scripted.requests[-1]["model"] == "scripted-optimizer"
    assert backend.resources() == ("r0", {"system_prompt": "Answer."})


def test_a_failing_or_rambling_optimizer_is_counted_not_raised(scripted):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens there once closed
    gone = OptimizerModel(OptimizerSettings(base_url=dead, model="m", timeout_s=2), dead, "m")
    assert gone.critique("Answer.", [Failure("q", "a", 0.0)], limit=100, seed=0) == ""
    assert gone.rewrite("Answer.", "critique", 2, seed=0) == []
    assert gone.counts == {"calls": 2, "errors": 2, "unfenced": 1, "discarded": 2}
    rambling = OptimizerModel(OptimizerSettings(base_url=scripted.url, model=OPTIMIZER), scripted.url, OPTIMIZER)
    assert rambling.rewrite("Be brief.", "critique", 2, seed=0) == ["I cannot rewrite this."]  # the weak answer
    assert rambling.counts == {"calls": 1, "unfenced": 1, "discarded": 1}


def test_a_tool_call_answer_is_critiqued_as_no_text_and_never_a_demonstration():
    """Transitions keep a response's text, not its tool calls: such a rollout is shown to the critique as
    having no text answer, and is no demonstration even when it succeeded."""
    from agl.schema import Transition
    from agl_apo.candidates import exchanges
    from agl_apo.optimizer import NO_TEXT

    def call(rollout_id, step, user, text, reward):
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": user}]
        return Transition(
            rollout_id=rollout_id,
            task_id=rollout_id,
            step=step,
            prompt_ids=[],
            response_ids=[],
            reward=reward,
            token_source="text",
            prompt_messages=messages,
            response_text=text,
        )

    found = exchanges(
        [
            call("tool", 0, "What is 2+3?", None, 1.0),  # a tool call, and the rollout succeeded
            call("text", 1, "later turn", "ANSWER: 7", 1.0),
            call("text", 0, "What is 3+4?", "thinking", 0.5),  # its first call has the question
            call("none", 0, "", "x", 0.0),  # no user text: left out
        ]
    )
    assert [(x.rollout_id, x.question, x.answer, x.reward) for x in found] == [
        ("tool", "What is 2+3?", "", 1.0),
        ("text", "What is 3+4?", "ANSWER: 7", 1.0),
    ]
    assert f"Answer: {NO_TEXT}\nReward: 1" in Failure("What is 2+3?", "", 1.0).render(100)
    backend = _backend(max_demos=2)
    backend.setup(None, _context(initial_resources=("r0", {"few_shot": []})))
    demos = backend._demo_sets(backend.beam[0], found, step=1)
    assert backend.pool == ["Question: What is 3+4?\nAnswer: ANSWER: 7"]
    assert [c.resources["few_shot"] for c in demos] == [backend.pool, backend.pool]
