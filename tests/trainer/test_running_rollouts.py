"""The one cache of running rollouts and the one key-expiry rule, shared by the store server
(``store_server.auth``) and the gateway (``gateway.rollouts``)."""

from __future__ import annotations

import time

import pytest

from agl.schema import RolloutStatus
from agl_trainer.gateway.rollouts import RolloutRegistry
from agl_trainer.http.running import RunningRollouts, expired_reason
from agl_trainer.store_server.auth import StoreAuth


def test_a_running_answer_is_trusted_for_its_ttl_then_asked_again():
    cache = RunningRollouts(ttl_s=0.05)
    assert cache.attempt("ro") is None
    cache.remember("ro", RolloutStatus.RUNNING, 2)
    assert cache.attempt("ro") == 2
    time.sleep(0.08)
    assert cache.attempt("ro") is None


def test_an_answer_other_than_running_is_not_kept_and_drops_a_running_one():
    cache = RunningRollouts(ttl_s=60)
    cache.remember("queued", RolloutStatus.QUEUED, 1)
    assert cache.attempt("queued") is None and len(cache) == 0
    cache.remember("ro", RolloutStatus.RUNNING, 1)
    cache.remember("ro", RolloutStatus.SUCCEEDED, 1)
    assert cache.attempt("ro") is None and len(cache) == 0


def test_the_least_recently_confirmed_rollout_goes_first_past_max_cached():
    cache = RunningRollouts(ttl_s=60, max_cached=2)
    for rid in ("a", "b"):
        cache.remember(rid, RolloutStatus.RUNNING, 1)
    cache.remember("a", RolloutStatus.RUNNING, 1)  # confirmed again: now the newest
    cache.remember("c", RolloutStatus.RUNNING, 1)
    assert [cache.attempt(r) for r in ("a", "b", "c")] == [1, None, 1]
    assert len(cache) == 2


@pytest.mark.parametrize(("ttl_s", "max_cached"), [(-1, 10), (1, 0)])
def test_bad_settings_are_refused_naming_the_field(ttl_s, max_cached):
    with pytest.raises(ValueError, match="ttl_s" if ttl_s < 0 else "max_cached"):
        RunningRollouts(ttl_s=ttl_s, max_cached=max_cached)


def test_a_key_works_only_while_its_own_attempt_runs():
    assert expired_reason("ro", 1, RolloutStatus.RUNNING, 1) is None
    assert expired_reason("ro", 1, RolloutStatus.RUNNING, 2) == (
        "this rollout key has expired: rollout 'ro' attempt 1 is no longer running (the rollout is on attempt 2)"
    )
    assert expired_reason("ro", 1, RolloutStatus.FAILED, 1).endswith("(the rollout is failed)")
    assert expired_reason("ro", 1, None, None) == "this rollout key has expired: the store knows no rollout 'ro'"


def test_both_servers_keep_their_running_rollouts_in_this_cache(sqlite_store):
    auth = StoreAuth(sqlite_store, token="t", status_ttl_s=3.0, max_cached=7)
    registry = RolloutRegistry(sqlite_store, status_ttl_s=3.0, max_cached=7)
    for cache in (auth.running, registry.running):
        assert isinstance(cache, RunningRollouts) and (cache.ttl_s, cache.max_cached) == (3.0, 7)
    registry.status_ttl_s = 0.5
    assert registry.running.ttl_s == 0.5
