"""`PhaseClock`: laps add up to the clock's wall time; a step's own breakdown moves seconds
out of the phase it ran in without changing the total; `top_phases` names the largest."""

from __future__ import annotations

import time

import pytest

from collage_farm.core.phases import PhaseClock, top_phases


def test_laps_add_up_to_the_wall_time() -> None:
    c = PhaseClock()
    time.sleep(0.02)
    c.lap("a")
    time.sleep(0.01)
    c.lap("b")
    time.sleep(0.01)
    c.lap("a")  # a second lap of one phase adds to it
    assert set(c.phases) == {"a", "b"}
    assert c.phases["a"] >= 0.03 and c.phases["b"] >= 0.01
    assert sum(c.phases.values()) == pytest.approx(c.wall_s, abs=0.005)


def test_a_breakdown_moves_seconds_out_of_its_phase() -> None:
    c = PhaseClock()
    c.phases.update({"load": 1.0, "post": 10.0})
    c.add({"refine": 6.0, "verify": 3.0}, into="post")
    assert c.phases == pytest.approx({"load": 1.0, "post": 1.0, "refine": 6.0, "verify": 3.0})
    c.add({"more": 5.0}, into="post")  # never more than the phase had
    assert c.phases["post"] == 0.0 and c.phases["more"] == pytest.approx(1.0)
    assert sum(c.phases.values()) == pytest.approx(11.0)


def test_top_phases_largest_first() -> None:
    line = top_phases({"load": 0.3, "search": 12.25, "verify": 4.5, "tiny": 0.001}, n=2)
    assert line == "search 12.2 s, verify 4.5 s"
    assert top_phases({}) == ""


def test_a_campaign_summary_has_its_phases(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A (mock) campaign's ``phases_s`` name its phases and add up to its wall time; the
    printed summary says the largest in one line."""
    import json

    from collage_farm.cli import main

    assert main(["tune", "zoo:mnist", "--mock", "--out", str(tmp_path / "o"), "--no-report",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    ph = s["phases_s"]
    assert {"load", "candidates", "search", "plan"} <= set(ph)
    assert all(v >= 0 for v in ph.values())
    assert sum(ph.values()) == pytest.approx(s["wall_s"], rel=0.05, abs=0.01)
    assert main(["tune", "zoo:mnist", "--mock", "--out", str(tmp_path / "o2"),
                 "--no-report"]) == 0
    assert "wall by phase (largest): " in capsys.readouterr().out
