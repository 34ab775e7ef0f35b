"""Credential flags: one name per credential in every command, each with a ``-file`` form and its
own variable; the old names are refused with the new one named; no credential is read from
another's flag or variable."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from agl import env
from agl.errors import ConfigError
from agl_trainer.cli import build_parser, dashboard, gateway, main, run, store
from agl_trainer.cli._common import STORE_CLIENT, store_options

UPSTREAM = ["--upstream", "http://127.0.0.1:1/v1"]


@pytest.fixture(autouse=True)
def no_agl_variables(monkeypatch):
    for variable in (*env.VARIABLES, *env.RETIRED):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize(
    "argv, instead",
    [
        (["store", "serve", "--token", "t"], "use --admin-token (the admin's bearer token"),
        (["store", "serve", "--token-file", "f"], "use --admin-token-file"),
        (["store", "stats", "--token", "t"], "use --store-token (bearer token for an http:// store)"),
        (["rollouts", "list", "--token-file", "f"], "use --store-token-file"),
        (["rollouts", "reward", "ro-1", "1", "--token", "t"], "use --store-token"),
        (["spans", "list", "--rollout", "r", "--token", "t"], "use --store-token"),
        (["dashboard", "--token", "t"], "use --admin-token (the token the pages ask for"),
        (["gateway", "serve", *UPSTREAM, "--token", "t"], "use --gateway-token (the gateway's bearer token"),
        (["gateway", "serve", *UPSTREAM, "--token-file", "f"], "use --gateway-token-file"),
        (["gateway", "serve", *UPSTREAM, "--upstream-api-key", "k"], "use --engine-token"),
        (["run", "--gateway-token", "t", "--", "true"], "leave it out: agl run needs no gateway token"),
    ],
)
def test_an_old_flag_is_refused_naming_the_one_to_use(argv, instead, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    old = next(arg for arg in argv if arg.startswith(("--token", "--upstream-api-key", "--gateway-token")))
    assert f"argument {old}: no longer taken: {instead}" in capsys.readouterr().err


def test_old_flags_are_not_offered_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["gateway", "serve", "--help"])
    text = capsys.readouterr().out
    assert "--gateway-token-file" in text and "--engine-token-file" in text and "--admin-token-file" in text
    assert "--token " not in text and "--upstream-api-key" not in text


CREDENTIALS = [
    (["store", "serve"], store.ADMIN_TOKEN, env.STORE_TOKEN),
    (["store", "serve"], store.RUNNER_TOKEN, env.STORE_RUNNER_TOKEN),
    (["dashboard"], dashboard.ADMIN_TOKEN, env.STORE_TOKEN),
    (["gateway", "serve", *UPSTREAM], gateway.ADMIN_TOKEN, env.GATEWAY_ADMIN_TOKEN),
    (["gateway", "serve", *UPSTREAM], run.GATEWAY_TOKEN, env.GATEWAY_TOKEN),
    (["gateway", "serve", *UPSTREAM], gateway.ENGINE_TOKEN, env.ENGINE_API_KEY),
    (["gateway", "serve", *UPSTREAM], STORE_CLIENT, env.STORE_TOKEN),
    (["runner", "a:b"], run.GATEWAY_TOKEN, env.GATEWAY_TOKEN),
    (["runner", "a:b"], STORE_CLIENT, env.STORE_TOKEN),
    (["run", "--", "true"], STORE_CLIENT, env.STORE_TOKEN),
    (["store", "stats"], STORE_CLIENT, env.STORE_TOKEN),
    (["export", "transitions", "-o", "x.jsonl"], STORE_CLIENT, env.STORE_TOKEN),
]


@pytest.mark.parametrize("command, credential, variable", CREDENTIALS, ids=lambda x: getattr(x, "flag", None))
def test_each_credential_comes_from_its_flag_its_file_or_its_variable(
    command, credential, variable, tmp_path, monkeypatch
):
    parser = build_parser()
    (tmp_path / "token").write_text("from-the-file\nignored second line\n")
    prefix, rest = (command[:-2], command[-2:]) if "--" in command else (command, [])

    def parse(*flags: str):
        return parser.parse_args([*prefix, *flags, *rest])

    assert credential.variable == variable
    assert credential.read(parse()) is None and credential.source(parse()) is None
    args = parse(credential.flag, "from-the-flag")
    assert (credential.read(args), credential.source(args)) == ("from-the-flag", credential.flag)
    args = parse(f"{credential.flag}-file", str(tmp_path / "token"))
    assert (credential.read(args), credential.source(args)) == ("from-the-file", f"{credential.flag}-file")
    monkeypatch.setenv(variable, "from-the-variable")
    assert (credential.read(parse()), credential.source(parse())) == ("from-the-variable", f"${variable}")
    assert credential.read(parse(credential.flag, "flag-wins")) == "flag-wins"
    with pytest.raises(ConfigError, match=f"{credential.flag}: give the token or a file holding it, not both"):
        credential.read(parse(credential.flag, "a", f"{credential.flag}-file", str(tmp_path / "token")))


def test_the_gateway_token_never_reaches_the_store_client(tmp_path, monkeypatch):
    """issue 32: ``agl gateway serve --token X`` (or ``$AGL_GATEWAY_TOKEN``) was sent to an http:// store."""
    url = "http://127.0.0.1:4317"
    parser = build_parser()
    monkeypatch.setenv(env.GATEWAY_TOKEN, "gateway-token-from-env")
    monkeypatch.setenv(env.GATEWAY_ADMIN_TOKEN, "gateway-admin-from-env")
    args = parser.parse_args(
        ["gateway", "serve", *UPSTREAM, "--store", url, "--gateway-token", "gw", "--admin-token", "ad"]
    )
    assert store_options(args, url) == {}  # the HTTP client then reads $AGL_STORE_TOKEN, nothing else
    (tmp_path / "store-token").write_text("store-admin\n")
    args = parser.parse_args(
        [
            "gateway",
            "serve",
            *UPSTREAM,
            "--store",
            url,
            "--gateway-token",
            "gw",
            "--store-token-file",
            str(tmp_path / "store-token"),
        ]
    )
    assert store_options(args, url) == {"token": "store-admin"}
    assert store_options(args, "sqlite:///x.db") == {}


def test_a_retired_variable_stops_the_gateway_naming_its_successor(monkeypatch, capsys):
    monkeypatch.setenv("AGL_UPSTREAM_API_KEY", "engine-key")
    assert main(["gateway", "serve", *UPSTREAM, "--store", "sqlite:///unused.db"]) == 2
    assert "$AGL_UPSTREAM_API_KEY is no longer read: set $AGL_ENGINE_API_KEY instead" in capsys.readouterr().err


def test_agl_run_hands_its_child_none_of_the_credential_variables(monkeypatch):
    for *_, variable in CREDENTIALS:
        monkeypatch.setenv(variable, "secret")
    monkeypatch.setenv("AGL_UPSTREAM_API_KEY", "secret")
    monkeypatch.setenv(env.ROLLOUT_KEY_SECRET, "secret")
    child = run.full_child_env({env.ROLLOUT_KEY: "its-own-key"})
    assert "secret" not in child.values() and child[env.ROLLOUT_KEY] == "its-own-key"


def _credential_table_rows() -> list[tuple[str, list[str], str]]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "security.md").read_text()
    start = text.index("| flag (and `-file` form) | the credential | commands | variable |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        flag, _, commands, variable = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((flag.strip("`"), re.findall(r"`(agl [a-z ]+)`", commands), variable.strip("`")))
    return rows


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands (argparse has no public way to list them)."""
    actions = parser._subparsers._group_actions if parser._subparsers else []
    return {name: sub for action in actions for name, sub in action.choices.items()}


def _leaf_helps(command: str) -> list[str]:
    """The ``--help`` of ``command`` (``agl gateway serve``), or of each command under a group (``agl rollouts``)."""
    parser = build_parser()
    for word in command.split()[1:]:
        parser = _subcommands(parser)[word]
    pending, helps = [parser], []
    while pending:
        parser = pending.pop()
        subs = _subcommands(parser)
        pending += subs.values()
        if not subs:
            helps.append(" ".join(parser.format_help().split()))
    return helps


def test_the_security_page_credential_table_matches_the_commands():
    rows = _credential_table_rows()
    assert {flag for flag, _, _ in rows} == {
        "--admin-token",
        "--runner-token",
        "--gateway-token",
        "--store-token",
        "--engine-token",
        "--rollout-key-secret-file",
    }
    for flag, commands, variable in rows:
        assert variable in env.VARIABLES, variable
        for command in commands:
            for text in _leaf_helps(command):
                assert f"{flag} " in text and f"${variable}" in text, (command, flag, variable)
                if not flag.endswith("-file"):
                    assert f"{flag}-file " in text, (command, flag)
