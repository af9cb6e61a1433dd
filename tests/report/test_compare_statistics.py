"""`haico compare`'s paired statistics and interval gate on hand-written campaigns: 200
items, B worse by a known number of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from tests.results.ledgers import record, write_ledger

ITEMS = 200


def campaign(root: Path, name: str, failing: set[int], **fields: object) -> Path:
    """Arm demo with `ITEMS` scripts, those in `failing` ending blank_turn."""
    lines: list[dict[str, object] | str] = []
    for i in range(ITEMS):
        verdict = "blank_turn" if i in failing else "completed"
        lines.append(record(f"{name}{i}", script=f"s{i:03}", verdict=verdict, **fields))  # type: ignore[arg-type]
    write_ledger(root / name / "demo", "local-1.1", lines)
    return root / name


def test_a_five_point_drop_in_200_items_is_shown_and_fails_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = campaign(tmp_path, "a", set())
    b = campaign(tmp_path, "b", set(range(0, ITEMS, 20)))  # 10 of 200
    assert main(["compare", str(a), str(b), "--max-drop", "0.02"]) == 1
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(
        "paired statistics (B − A, 95% intervals, paired by script × repeat; Wilson intervals "
        "on the rates, Newcombe's on the paired difference):"
    )
    assert lines[start + 1 :] == [
        "  overall: 200 pair(s)",
        "    pass rate: A 100.0% [98.1, 100.0] (200/200), B 95.0% [91.0, 97.3] (190/200)",
        "    difference B − A: −5.0 points [−9.0, −2.1]",
        "    McNemar exact p = 0.00195 (discordant: 10 pass → fail, 0 fail → pass)",
        "    median B − A: latency 0 s [0, 0], tokens 0 [0, 0], turns 0 [0, 0] (bootstrap, "
        "2000 resamples, seed 20260407)",
        "    left out (infrastructure or substituted in either run): 0; unpaired: 0 only in A, "
        "0 only in B",
        "gate (--max-drop 0.02 --confidence 0.95): FAIL: pass rate dropped by more than 2 "
        "point(s) at 95%: the upper bound of B − A, −2.1 points, is below −2",
    ]


def test_a_one_point_drop_is_not_shown_and_says_how_many_items_would_show_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = campaign(tmp_path, "a", set())
    b = campaign(tmp_path, "b", {3, 150})
    assert main(["compare", str(a), str(b), "--max-drop", "0"]) == 0
    out = capsys.readouterr().out
    assert "    McNemar exact p = 0.5 (discordant: 2 pass → fail, 0 fail → pass)" in out
    assert out.endswith(
        "gate (--max-drop 0 --confidence 0.95): pass: a drop of more than 0 point(s) in the "
        "pass rate is not shown at 95%: the upper bound of B − A, +1.0 points, is not below 0\n"
        "  to show a drop at 95% with 80% power, if the drop is 1.0 points and 1.0% of pairs "
        "differ: 783 pairs (now 200, 4 repeat(s) of each of the 200 scripts)\n"
    )
    assert main(["compare", str(a), str(b), "--max-drop", "0.02"]) == 0
    out = capsys.readouterr().out
    assert "  a 1.0-point drop cannot show more than 2 point(s) with any number of items" in out


def test_one_flaky_item_in_200_passes_the_gate_but_not_the_strict_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = campaign(tmp_path, "a", set())
    b = campaign(tmp_path, "b", {77})
    assert main(["compare", str(a), str(b), "--max-drop", "0.02"]) == 0
    assert main(["compare", str(a), str(b), "--exit-on-regression"]) == 1
    assert main(["compare", str(a), str(b), "--max-drop", "0.02", "--exit-on-regression"]) == 1
    capsys.readouterr()


def test_strata_infra_failures_and_unpaired_items_are_reported_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines_a: list[dict[str, object] | str] = [
        record("a1", script="x", stratum="short"),
        record("a2", script="y", stratum="long", verdict="infra_error"),
        record("a3", script="z", stratum="long"),
        record("a4", script="only-a", stratum="long"),
    ]
    lines_b: list[dict[str, object] | str] = [
        record("b1", script="x", stratum="short", duration_s=3.0),
        record("b2", script="y", stratum="long"),
        record("b3", script="z", stratum="long", verdict="gave_up"),
    ]
    write_ledger(tmp_path / "a" / "demo", "local-1.1", lines_a)
    write_ledger(tmp_path / "b" / "demo", "local-1.1", lines_b)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    pytest.LineMatcher(out.splitlines()).fnmatch_lines(
        [
            "  stratum long: 0 pair(s)",
            "*left out (infrastructure or substituted in either run): 2 (1 A infra_error, "
            "1 B gave_up); unpaired: 1 only in A, 0 only in B (no record on the other side)",
            "  stratum short: 1 pair(s)",
            "    median B − A: latency +1 s [[]+1, +1], *",
            "  overall: 1 pair(s)",
        ]
    )


def test_a_pass_rule_recorded_by_the_runs_pairs_scripts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for side, verdicts in (
        ("a", ["completed"] * 3),
        ("b", ["completed", "blank_turn", "completed"]),
    ):
        lines: list[dict[str, object] | str] = [
            record(f"{side}{r}", script="s", repeat=r, verdict=v) for r, v in enumerate(verdicts)
        ]
        arm_dir = tmp_path / side / "demo"
        write_ledger(arm_dir, "local-1.1", lines)
        run_dir = arm_dir / "runs" / "local-1.1"
        run_dir.mkdir(parents=True)
        (run_dir / "run-config.json").write_text(json.dumps({"ARM_RUN_PASS_RULE": "majority"}))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "paired by script (pass_rule majority)" in out
    assert "    pass rate: A 100.0% [20.7, 100.0] (1/1), B 100.0% [20.7, 100.0] (1/1)" in out
    assert (
        "repeats (B) arm demo stratum default: pass@3 100.0%, pass^3 0.0% over 1 script(s); "
        "consistent (every repeat the same verdict): 0/1"
    ) in out
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--pass-rule", "all"]) == 0
    assert "B 0.0% [0.0, 79.3] (0/1)" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--pass-rule", "most"]) == 2
    assert capsys.readouterr().err == (
        "haico: --pass-rule: 'most' is not a pass rule: give one of all, any, majority, "
        "k_of_n:K/N, with 1 ≤ K ≤ N (e.g. k_of_n:3/5: at least 3 of the script's 5 repeats "
        "pass)\n"
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-drop", "2", "'2' is not a number from 0 to 1 (a share: 0.02 is 2 points)"),
        ("--confidence", "1", "'1' is not a number from 0.5 up to, not including, 1"),
    ],
)
def test_bad_gate_values_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path), str(tmp_path), flag, value])
    assert message in capsys.readouterr().err


def test_without_scipy_compare_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = campaign(tmp_path, "a", set())
    monkeypatch.setitem(__import__("sys").modules, "scipy", None)
    assert main(["compare", str(a), str(a)]) == 0
    assert (
        "paired statistics: not computed: computing the paired statistics (haico compare, "
        "validate, report) needs scipy, which is not installed: pip install "
        "'pytest-haico[analysis]'"
    ) in capsys.readouterr().out
    assert main(["compare", str(a), str(a), "--max-drop", "0.02"]) == 2
    assert "pip install 'pytest-haico[analysis]'" in capsys.readouterr().err


def test_results_compare_is_the_same_figures_as_a_frame(tmp_path: Path) -> None:
    from pytest_haico.results import load_results

    a = load_results(campaign(tmp_path, "a", set()))
    b = load_results(campaign(tmp_path, "b", set(range(0, ITEMS, 20))))
    frame = a.compare(b)
    assert list(frame["stratum"]) == ["default", "overall"]
    overall = frame.iloc[-1]
    assert (overall["pairs"], overall["pass_to_fail"], overall["fail_to_pass"]) == (200, 10, 0)
    assert round(overall["difference"], 3) == -0.05
    assert round(overall["difference_high"], 4) == -0.0206
    assert round(overall["mcnemar_p"], 5) == 0.00195
    assert overall["unit"] == "script × repeat"
    assert overall["resamples"] == 2000
    with pytest.raises(ValueError, match="'most' is not a pass rule"):
        a.compare(b, pass_rule="most")


def test_report_with_a_baseline_adds_the_paired_section_and_its_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = campaign(tmp_path, "a", set())
    b = campaign(tmp_path, "b", set(range(0, ITEMS, 20)))
    page = tmp_path / "b.html"
    assert main(["report", str(b), "--baseline", str(a), "--html", str(page)]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index(f"paired comparison: A = {a} (--baseline), B = {b} (this report)")
    assert out[start + 3 : start + 5] == [
        "    pass rate: A 100.0% [98.1, 100.0] (200/200), B 95.0% [91.0, 97.3] (190/200)",
        "    difference B − A: −5.0 points [−9.0, −2.1]",
    ]
    text = page.read_text()
    section = text[text.index('<section id="paired">') :]
    section = section[: section.index("</section>")]
    assert "<td>−5.0 points [−9.0, −2.1]</td>" in section
    assert "<td>10 pass → fail, 0 fail → pass</td>" in section
    assert 'data-series="paired difference"' in section
    assert "data:image/png;base64," in section
    assert main(["report", str(b), "--html", str(page)]) == 0
    assert '<section id="paired">' not in page.read_text()


def test_plan_sizes_for_a_given_drop_and_power(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = campaign(tmp_path, "a", set())
    b = campaign(tmp_path, "b", {3, 150})
    assert main(["compare", str(a), str(b), "--plan", "--drop", "0.05", "--power", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "plan (--plan, power 90%): the pairs needed, from the measured discordance" in out
    # Connor, with no fewer discordant pairs than the drop: (1.96·√.05 + 1.28·√.0475)² / .05²
    assert (
        "  to show a drop at 95% with 90% power, if the drop is 5.0 points and 5.0% of pairs "
        "differ (measured 1.0%, raised to the drop): 206 pairs (now 200, 2 repeat(s) of each "
        "of the 200 scripts)"
    ) in out
    assert "  cost: B's runs left no timeline, so no allocation per item is known" in out


def test_plan_costs_the_items_to_add_in_gpu_hours_from_bs_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = campaign(tmp_path, "a", set())
    b = campaign(tmp_path, "b", set(range(0, ITEMS, 20)))
    run_dir = b / "demo" / "runs" / "local-1.1"
    run_dir.mkdir(parents=True)
    # One hour of a 2-GPU job for B's 200 items: 0.01 GPU-h per item.
    timeline = {"session": "n:1", "job": {"started_at": 1e9, "gpus": 2}, "exit": {"at": 1e9 + 3600}}
    (run_dir / "timeline.json").write_text(json.dumps(timeline))
    assert main(["compare", str(a), str(b), "--plan", "--drop", "0.03"]) == 0
    out = capsys.readouterr().out
    assert (
        "  cost: 434 pairs are 868 items, 468 more than the 400 now; at B's measured 0.0100 "
        "GPU-h per item (2.00 GPU-h for 200): 4.68 GPU-h more"
    ) in out
