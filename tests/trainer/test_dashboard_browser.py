"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by playwright.

``scripts/ensure-chromium.sh`` (run by ``make test``) installs both. The test logs in through
the form, reads the numbers the reward chart and a rollout's span tree show, attaches a
reward with the form, watches the runs page pick up a new step by itself, checks that a
span holding ``<script>`` shows as text, and saves a screenshot of each page under its
``tmp_path``.
"""

from __future__ import annotations

import shutil

import pytest

from agl.store.sqlite import SqliteStore
from agl_trainer.store_server import ServerThread
from tests.trainer.test_dashboard import EVIL, TOKEN, fill

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def browser_page():
    if not shutil.which("chromium"):
        pytest.fail("no chromium: run scripts/ensure-chromium.sh (make test does) to install it and playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(10_000)
            yield page
        finally:
            browser.close()


def test_the_dashboard_in_chromium(tmp_path, browser_page):
    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    store = SqliteStore(tmp_path / "agl.db")
    fill(store)
    store.add_step_record("run-older", {"kind": "train", "step": 1, "reward_mean": 0.9})
    for step, (mean, std) in enumerate([(0.2, 0.1), (0.45, 0.15)], start=1):
        store.add_step_record("run-b", {"kind": "train", "step": step, "reward_mean": mean, "reward_std": std})
    store.add_step_record("run-b", {"kind": "val", "step": 0, "val_reward_mean": 0.1, "val_reward_std": 0.05})
    try:
        server = ServerThread(store, token=TOKEN)
        with server:
            page.goto(f"{server.url}/ui/runs")
            assert "/ui/login" in page.url  # the pages need the token
            page.fill("input[name=token]", TOKEN)
            page.click('button:has-text("Log in")')
            page.wait_for_url("**/ui/runs")
            chart = page.locator("#chart-reward")
            train = chart.locator('circle[data-series="train"]')
            assert train.count() == 2
            assert [float(v) for v in train.evaluate_all("els => els.map(e => e.dataset.value)")] == [0.2, 0.45]
            assert chart.locator('circle[data-series="validation"]').get_attribute("data-value") == "0.1"
            assert chart.locator("polygon").count() == 2  # the ±std bands
            assert "train: 0.45" in chart.inner_text()
            page.screenshot(path=tmp_path / "runs.png", full_page=True)

            # Live: a new step shows without reloading the page.
            store.add_step_record("run-b", {"kind": "train", "step": 3, "reward_mean": 0.7, "reward_std": 0.1})
            page.wait_for_selector('#chart-reward circle[data-series="train"][data-step="3"]', timeout=15_000)
            assert "train: 0.7" in page.locator("#chart-reward").inner_text()

            page.select_option("#run-picker", "run-older")  # another run: its own charts
            page.wait_for_url("**run=run-older")
            assert page.locator('#chart-reward circle[data-series="train"]').get_attribute("data-value") == "0.9"

            page.click("header >> text=Rollouts")
            page.wait_for_url("**/ui/rollouts")
            assert "60 rollouts" in page.inner_text(".pager")
            page.click('th a[data-sort="reward"]')  # descending first
            page.wait_for_url("**sort=reward**")
            first = page.locator("tr.rollout-row").first
            assert first.get_attribute("data-rollout-id") == "ro-059"
            assert first.locator("td.reward").inner_text() == "5.9"
            page.click('th a[data-sort="reward"]')
            page.wait_for_url("**dir=asc**")
            assert page.locator("tr.rollout-row").first.get_attribute("data-rollout-id") == "ro-000"
            page.screenshot(path=tmp_path / "rollouts.png", full_page=True)

            page.click("text=ro-000")
            page.wait_for_url("**/ui/rollouts/ro-000")
            spans = page.locator(".tree .span")
            assert spans.count() == 2
            assert spans.nth(0).locator(".span-name").inner_text() == f"agent {EVIL}"  # the markup as text
            assert spans.nth(1).get_attribute("data-kind") == "llm"
            bars = page.locator(".tree .bar").evaluate_all("els => els.map(e => e.style.left + ' ' + e.style.width)")
            assert bars == ["0% 100%", "20% 50%"]  # agent 0..1 s, its LLM call 0.2..0.7 s
            assert page.locator(".final-reward").inner_text() == "0"
            assert page.locator(".llm-call .credit").inner_text() == "0"
            tokens = page.locator(".llm-call .tok[data-logprob]")
            assert tokens.evaluate_all("els => els.map(e => e.dataset.logprob)") == ["-0.0500", "-2.5000"]
            assert f"ok {EVIL}" in page.locator(".llm-call pre.response").inner_text()
            page.screenshot(path=tmp_path / "rollout.png", full_page=True)

            page.fill(".reward-form input[name=value]", "0.42")
            page.click('button:has-text("Attach reward")')
            page.wait_for_selector("td.reward-value >> text=0.42")
            assert [r.value for r in store.query_rewards(rollout_id="ro-000")] == [0.0, 0.42]

            page.click("header >> text=Traces")
            page.wait_for_url("**/ui/traces")
            page.screenshot(path=tmp_path / "traces.png", full_page=True)

            assert dialogs == []  # no <script> from the data ran
            assert page.evaluate("() => document.querySelectorAll('main script').length") == 0
    finally:
        store.close()
    for name in ("runs", "rollouts", "rollout", "traces"):
        assert (tmp_path / f"{name}.png").stat().st_size > 5000
