"""The calculator's report on runs with a validation curve: their table and their PNG (hand-made results files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.reporting import END, START


def figures(success: float, by_operations: tuple[float, float, float]) -> dict:
    two, three, four = by_operations
    return {
        "n": 60,
        "success": success,
        "success_by_operations": {"2": two, "3": three, "4": four},
        "tool_call_validity": 1.0,
        "tool_calls_per_episode": 1.0,
    }


def record(name: str, seed: int, after: float, curve: list[float] | None, *, steps: int = 60, **extra) -> dict:
    run = {
        "name": name,
        "seed": seed,
        "lr": 3e-4,
        "steps_without_signal": "step",
        "steps": steps,
        "batch_size": 3,
        "n_rollouts": 8,
        "eval_problems": 60,
        "wall_s": 3600.0 + 600 * seed,
        "step_s_mean": 60.0,
        "before": figures(0.0, (0.0, 0.0, 0.0)),
        "after": figures(after, (2 * after, after, after / 2)),
        "train_success_by_step": [0.1] * steps,
        "train_tool_calls": {"tool_call_validity": 0.9},
        **extra,
    }
    if curve is not None:
        run |= {
            "val_every": 10,
            "val_problems": 30,
            "val_curve": [{"step": 10 * i, "success_rate": v} for i, v in enumerate(curve)],
        }
    return run


def rows(block: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("| ")]


@pytest.fixture
def results(tmp_path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    runs = [
        record("calc_agent-steps60", 0, 0.3, [0.0, 0.1, 0.2, 0.3]),
        record("calc_agent-steps60", 1, 0.4, [0.0, 0.2, 0.3, 0.4]),
        record("calc_agent-steps60", 2, 0.5, [0.1, 0.2, 0.4, 0.5]),
        record("calc_agent-async1-steps60", 0, 0.2, [0.0, 0.1, 0.1, 0.2], max_staleness=1),
        record("calc_agent", 0, 0.1, None, steps=10),  # a 10-step run without a curve: the first table
    ]
    for run in runs:
        (folder / f"{run['name']}-seed{run['seed']}.json").write_text(json.dumps(run))
    return folder


def test_runs_with_curves_get_their_table_and_a_png_per_arm(results, tmp_path):
    from examples.calc_agent import report

    page = tmp_path / "results-page.md"
    page.write_text(f"intro\n{START}\nold\n{END}\n<!-- lr-choice:start -->\n<!-- lr-choice:end -->\n")

    assert report.main(["--results", str(results), "--page", str(page)]) == 0

    block = page.read_text().split(START)[1].split(END)[0]
    plain, curves = block.split("Runs with a validation curve")
    assert [r[:4] for r in rows(plain)[1:]] == [["0.0003", "0", "0.0", "10.0"]]  # only the run without a curve
    head, *body = rows(curves)
    arm_column = "arm (lr; async: rollouts up to k steps ahead)"
    assert head[:5] == [arm_column, "seed", "steps", "test success before (%)", "after (%)"]
    long = "calc_agent-steps60 (0.0003, 60 steps)"
    asynchronous = "calc_agent-async1-steps60 (0.0003, async k=1, 60 steps)"
    assert [r[:2] for r in body] == [
        [long, "0"],
        [long, "1"],
        [long, "2"],
        [long, "**mean ± std**"],
        [asynchronous, "0"],
    ]
    seed0, _, _, mean, async0 = body
    # steps, before, after, then 2, 3 and 4 operations before and after, val at the first and last evaluation
    assert seed0[2:13] == ["60", "0.0", "30.0", "0.0", "60.0", "0.0", "30.0", "0.0", "15.0", "0.0", "30.0"]
    assert mean[2:13] == [
        "60",
        "0.0 ± 0.0",
        "40.0 ± 10.0",
        "0.0 ± 0.0",
        "80.0 ± 20.0",
        "0.0 ± 0.0",
        "40.0 ± 10.0",
        "0.0 ± 0.0",
        "20.0 ± 5.0",
        "3.3 ± 5.8",
        "40.0 ± 10.0",
    ]
    assert async0[4] == "20.0" and async0[6] == "40.0"  # after; after on 2 operations
    for arm in ("calc_agent-steps60", "calc_agent-async1-steps60"):
        assert f"(img/{arm}.png)" in curves  # the copy beside the page: the site serves only docs/
        png = results / "curves" / f"{arm}.png"
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
        assert (tmp_path / "img" / f"{arm}.png").read_bytes() == data
    assert not (results / "curves" / "calc_agent.png").exists()  # no curve, no figure

    from PIL import Image

    with Image.open(results / "curves" / "calc_agent-steps60.png") as image:
        assert image.size == (640, 400)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is not None and len(colours) > 20  # lines drawn, not a blank canvas

    # the same records draw the same bytes: a committed figure does not churn when the report runs again
    before = (results / "curves" / "calc_agent-steps60.png").read_bytes()
    assert report.main(["--results", str(results), "--page", str(page)]) == 0
    assert (results / "curves" / "calc_agent-steps60.png").read_bytes() == before


def test_check_draws_nothing(results, tmp_path):
    from examples.calc_agent import report

    assert report.main(["--results", str(results), "--check"]) == 0
    assert not (results / "curves").exists() and not (tmp_path / "img").exists()


def test_a_record_without_a_curve_is_refused_by_name(tmp_path):
    from examples.reporting import draw_curves

    with pytest.raises(ValueError, match=r"calc_agent-steps60: no val_curve .*\[1\]"):
        draw_curves(
            "calc_agent-steps60",
            [record("calc_agent-steps60", 0, 0.3, [0.0, 0.3]), record("calc_agent-steps60", 1, 0.3, None)],
            tmp_path / "x.png",
        )
    assert not (tmp_path / "x.png").exists()


def test_sql_runs_with_curves_get_their_table_by_tier_and_a_png(tmp_path):
    from examples.sql_agent import report

    results = tmp_path / "results"
    results.mkdir()
    for seed, after in ((0, 0.2), (1, 0.3), (2, 0.4)):
        run = {
            "arm": "per-role-steps30",
            "seed": seed,
            "steps": 30,
            "wall_s": 1800.0,
            "before": {"success": 0.05, "success_by_tier": {"easy": 0.1, "medium": 0.05, "hard": 0.0}},
            "after": {"success": after, "success_by_tier": {"easy": 2 * after, "medium": after, "hard": 0.0}},
            "val_every": 10,
            "val_problems": 30,
            "val_curve": [{"step": 0, "success_rate": 0.05}, {"step": 30, "success_rate": after}],
        }
        (results / f"per-role-steps30-seed{seed}.json").write_text(json.dumps(run))
    page = tmp_path / "results-page.md"
    page.write_text(f"{START}\n{END}\n")

    assert report.main(["--results", str(results), "--page", str(page)]) == 0

    text = page.read_text()
    assert "No results yet" in text  # no run without a curve
    seed0, _, _, mean = rows(text.split("Runs with a validation curve")[1])[1:]
    # steps, before, after, then easy, medium and hard before and after, val at the first and last evaluation
    assert seed0[:13] == ["per-role-steps30", "0", "30", "5.0", "20.0", "10.0", "40.0", "5.0", "20.0", "0.0", "0.0"] + [
        "5.0",
        "20.0",
    ]
    assert mean[1:5] == ["**mean ± std**", "30", "5.0 ± 0.0", "30.0 ± 10.0"]
    assert "(img/per-role-steps30.png)" in text
    assert (results / "curves" / "per-role-steps30.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "img" / "per-role-steps30.png").read_bytes() == (
        results / "curves" / "per-role-steps30.png"
    ).read_bytes()


def test_the_results_pages_show_the_curves_the_reports_drew():
    """Every image a results page shows is in docs/results/img/, a copy of the report's PNG beside its results."""
    import re

    from examples.reporting import DOCS_RESULTS, IMAGES

    root = DOCS_RESULTS.parents[1]
    drawn = {png.name: png for png in root.glob("examples/*/results/curves/*.png")}
    shown = [
        name for page in DOCS_RESULTS.glob("*.md") for name in re.findall(r"\]\(img/([^)]+\.png)\)", page.read_text())
    ]
    assert shown, "the calculator's 60-step curve is shown"
    for name in shown:
        copy = DOCS_RESULTS / IMAGES / name
        assert name in drawn and copy.read_bytes() == drawn[name].read_bytes(), name
