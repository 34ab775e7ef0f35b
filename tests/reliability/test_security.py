"""Drills: the security defects of the second hardening round (issue 32), each pinned against
the real servers: malformed keys, reward sources, id ownership, out-of-range numbers."""

from __future__ import annotations

import base64
import logging

import pytest

from tests.reliability.targets import gateway_target, store_target


def _errors(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records if r.levelno >= logging.ERROR]


def _malformed_keys() -> list[bytes]:
    """Rollout keys no server may choke on (latin-1 header bytes, as they arrive)."""
    rid = base64.urlsafe_b64encode(b"ro-run").rstrip(b"=")
    mac = b"A" * 43
    return [
        b"agl-rk.\xb2." + rid + b"." + mac,  # a superscript two: str.isdigit() says yes, int() says no
        b"agl-rk." + b"9" * 4300 + b"." + rid + b"." + mac,  # past int()'s 4,300-digit limit
        b"agl-rk." + b"9" * 40 + b"." + rid + b"." + mac,  # an attempt past 2**63
        b"agl-rk.1." + rid + b"." + b"\xe9" * 43,  # a non-ASCII MAC: compare_digest raises on it
        b"agl-rk.1.\xe9\xe9." + mac,  # a non-ASCII rollout id
        b"agl-rk.1.A." + mac,  # base64 of a length no bytes have
        b"agl-rk.1." + rid,  # too few parts
        b"agl-rk.",
    ]


@pytest.mark.parametrize("server", ["store", "gateway"])
def test_every_malformed_rollout_key_is_a_401_without_a_traceback(tmp_path, caplog, server):
    target_of, path = (store_target, "/v1/spans") if server == "store" else (gateway_target, "/v1/models")
    with target_of(tmp_path) as (target, _):
        for key in _malformed_keys():
            answer = target.client.request(
                "POST" if server == "store" else "GET",
                path,
                headers={"Authorization": b"Bearer " + key},
                **({"json": {"spans": []}} if server == "store" else {}),
            )
            assert answer.status_code == 401, (key[:40], answer.status_code, answer.text[:200])
    assert not _errors(caplog)
