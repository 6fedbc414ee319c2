"""benchmarks/published_vllm.py: the packaged profiles' figures beside a published table, each error
(sim - published) / published of figures computed from the sim's own replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import published_vllm as pub


def test_each_figure_is_the_sims_own_beside_the_published_one() -> None:
    source = pub.PUBLISHED[0]
    result = pub.compare(source, seconds=20.0)
    replays = result["replays"]
    assert isinstance(replays, dict) and sorted(replays) == ["1", "8"]
    one, eight = replays["1"], replays["8"]
    rows = result["figures"]
    assert isinstance(rows, list)
    assert [r["figure"] for r in rows] == [f.name for f in source.figures]
    decode, ratio = rows
    assert decode["published"] == 75.0 and ratio["published"] == 6.6
    assert decode["sim"] == 1000.0 / one["median_itl_ms"]
    assert ratio["sim"] == eight["output_throughput"] / one["output_throughput"]
    for row in rows:
        assert row["error"] == (row["sim"] - row["published"]) / row["published"]
    # the replays ran the source's load: one request at a time at C=1; at C=8 at most 8 running (the rest of the
    # eight queue while a 1,024-token prompt is prefilled). Little's law over a window whose edges cut requests.
    assert round(one["mean_running"]) == 1 and 1 < eight["mean_running"] <= 8


def test_main_writes_json_and_refuses_a_zero_duration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "published.json"
    assert pub.main(["--seconds", "10", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [r["source"] for r in written] == [p.source for p in pub.PUBLISHED]
    assert "decode tokens/s of one request at C=1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        pub.main(["--seconds", "0"])
    assert exc.value.code == 2
