"""The generated references (docs/_hooks/agl_docs) are made from the code: each real command,
flag, config field, hook and environment variable is on its page, and something added in a
fixture (a flag, a field, a hook, a variable) appears without anything else changing."""

from __future__ import annotations

import argparse
import inspect
import re
import types
import typing

import pluggy
import pytest
from agl_docs import cli_ref, config_ref, env_ref, hooks_ref, markdown
from pydantic import BaseModel, Field

import agl.env
import agl.hookspecs
import agl_trainer.cli
from agl_trainer.config import TrainerConfig


def all_commands(parser: argparse.ArgumentParser):
    """(full command, its parser) for every command, walked independently of cli_ref."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from all_commands(sub)


def command_section(page: str, command: str) -> str:
    """The part of the CLI page under the heading of ``command``, up to the next heading."""
    found = re.search(rf"^#+ `{re.escape(command)}`\n(.*?)(?=^#|\Z)", page, re.M | re.S)
    assert found, f"no section for {command!r}"
    return found.group(1)


def test_every_command_and_flag_is_on_the_cli_page():
    page = cli_ref.agl_page()
    parser = agl_trainer.cli.build_parser()
    seen = 0
    for full, sub in all_commands(parser):
        listed = {
            word for row in re.findall(r"^\| `([^`]*)` \|", command_section(page, full), re.M) for word in row.split()
        }
        listed = {word.strip("[],.") for word in listed}
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            for flag in action.option_strings or [action.metavar or action.dest]:
                if action.help == argparse.SUPPRESS:  # a retired flag, refused with a message naming its successor
                    assert flag not in listed, f"{full}: {flag} is hidden from --help"
                    continue
                assert flag in listed, f"{full}: {flag}"
                seen += 1
    assert seen > 50  # the real command has many flags; a page that lost them would fail above


def test_a_flag_added_in_a_fixture_is_on_the_cli_page(monkeypatch):
    real = agl_trainer.cli.build_parser

    def with_probe() -> argparse.ArgumentParser:
        parser = real()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices["train"].add_argument("--docs-probe", metavar="N", default=3, help="a flag the test added")
        probe = commands.add_parser("docs-probe", help="a command the test added")
        probe.add_argument("--depth", required=True, help="how deep")
        return parser

    monkeypatch.setattr(agl_trainer.cli, "build_parser", with_probe)
    page = cli_ref.agl_page()
    assert "| `--docs-probe N` | `3` | a flag the test added |" in command_section(page, "agl train")
    assert "### `agl docs-probe`\n\na command the test added" in page
    assert "| `--depth DEPTH` | required | how deep |" in page


def dotted_keys(model: type[BaseModel], prefix: str = ""):
    """Every dotted config key under ``model``, walked independently of config_ref."""
    for name, field in model.model_fields.items():
        yield prefix + name
        args = [field.annotation, *typing.get_args(field.annotation)]
        args += [a for arg in args for a in typing.get_args(arg)]
        for arg in args:
            if inspect.isclass(arg) and issubclass(arg, BaseModel):
                is_list = "list[" in str(field.annotation)
                yield from dotted_keys(arg, f"{prefix}{name}{'[]' if is_list else ''}.")
                break


def test_every_config_field_is_on_the_config_page_with_its_default_and_description():
    page = config_ref.trainer_page()
    keys = list(dotted_keys(TrainerConfig))
    assert "rollout.concurrency" in keys and "policies[].name" in keys
    for key in keys:
        assert f"| `{key}` |" in page, key
    row = next(line for line in page.splitlines() if line.startswith("| `rollout.concurrency` |"))
    default = TrainerConfig.model_fields["rollout"].default_factory().concurrency
    description = TrainerConfig.model_fields["rollout"].annotation.model_fields["concurrency"].description
    assert row == f"| `rollout.concurrency` | `int` | `{default}` | {description} |"


def test_a_field_added_in_a_fixture_is_on_the_config_page():
    class Probe(BaseModel):
        """A section the test added."""

        depth: int | None = Field(default=None, description="how deep")

    class ProbedConfig(TrainerConfig):
        probe_level: typing.Literal["low", "high"] = Field(default="low", description="a field the test added")
        probes: list[Probe] = Field(default_factory=list)

    page = config_ref.page(ProbedConfig)
    assert "| `probe_level` | `'low' | 'high'` | `'low'` | a field the test added |" in page
    assert "| `probes` | `list[Probe]` | `[]` | A section the test added. |" in page
    assert "## `probes[]`: Probe" in page
    assert "| `probes[].depth` | `int | None` | `None` | how deep |" in page


def test_every_hook_is_on_the_hooks_page_with_its_signature_and_docstring():
    page = hooks_ref.agl_page()
    specs = [f for f in vars(agl.hookspecs).values() if inspect.isfunction(f) and hasattr(f, "agl_spec")]
    assert len(specs) >= 10
    for fn in specs:
        written = str(inspect.signature(fn)).replace("'", "")  # annotations are source text: unquoted
        assert f"## `{fn.__name__}`\n\n```python\ndef {fn.__name__}{written}\n```" in page
        first_line = markdown.inline(inspect.getdoc(fn).splitlines()[0])
        assert first_line in page, fn.__name__


def test_a_hook_added_in_a_fixture_is_on_the_hooks_page():
    module = types.ModuleType("probe_hookspecs", "Hooks of a test.")
    spec = pluggy.HookspecMarker("agl")

    def agl_docs_probe(depth: int, name: str = "x") -> float | None:
        """A hook the test added.

        Example::

            @agl.hookimpl
            def agl_docs_probe(depth):
                return depth
        """

    module.agl_docs_probe = spec(agl_docs_probe)
    page = hooks_ref.page(module)
    assert "## `agl_docs_probe`\n\n```python\ndef agl_docs_probe(depth: int, name: str = 'x') -> float | None\n```" in (
        page
    )
    assert "Example:\n\n```python\n@agl.hookimpl\ndef agl_docs_probe(depth):\n    return depth\n```" in page


def test_every_variable_is_on_the_environment_page():
    page = env_ref.agl_page()
    assert len(agl.env.VARIABLES) >= 15
    for variable in agl.env.VARIABLES:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{variable}` |"))
        assert variable.what.split(",")[0].replace("|", "\\|") in row
    for old in [*agl.env.RETIRED, *agl.env.RENAMED]:
        assert f"| `{old}` |" in page


@pytest.fixture
def probe_env_module():
    module = types.SimpleNamespace(__name__="probe_env", RETIRED={}, RENAMED={})
    probe = agl.env.Variable("AGL_DOCS_PROBE", what="a variable the test added", read_by="nobody", default="off")
    module.VARIABLES = (*agl.env.VARIABLES, probe)
    return module


def test_a_variable_added_in_a_fixture_is_on_the_environment_page(probe_env_module):
    page = env_ref.page(probe_env_module)
    assert "| `AGL_DOCS_PROBE` | a variable the test added | off | nobody |" in page
    assert "Retired variables" not in page
