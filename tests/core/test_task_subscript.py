"""``rollout.task["answer"]``, a natural first guess in a reward, says what to write instead."""

from __future__ import annotations

import pytest

from agl.schema import Rollout, Task


def test_subscripting_a_task_names_task_input():
    rollout = Rollout(task_id="t", task=Task(task_id="t", input={"answer": "4"}))
    with pytest.raises(TypeError, match=r"^'Task' object is not subscriptable; .* rollout\.task\.input\['answer'\]$"):
        rollout.task["answer"]
    assert rollout.task.input["answer"] == "4"


def test_subscripting_a_task_with_a_field_name_names_the_attribute():
    with pytest.raises(TypeError, match=r"write task\.task_id$"):
        Task(task_id="t", input={})["task_id"]
