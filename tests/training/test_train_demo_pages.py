"""``pages_of`` reads the pager's log while the pager appends to it (the train demo and the training stack test
poll it): a notification still being written is not there yet, never an error."""

from __future__ import annotations

import json
from pathlib import Path

from loadlens.train_demo import pages_of


def test_a_notification_being_written_is_skipped(tmp_path: Path) -> None:
    note = {"receiver": "pager", "alerts": [{"labels": {"alertname": "A"}, "status": "firing"}]}
    other = {"receiver": "pager", "alerts": [{"labels": {"alertname": "B"}, "status": "firing"}]}
    line = json.dumps(note)
    # A line that crosses a page boundary of the file is visible in two parts for a moment: the first part here.
    (tmp_path / "pages.jsonl").write_text(json.dumps(other) + "\n" + line + "\n" + line[: len(line) // 2])
    assert pages_of(tmp_path, "A") == [note]
    assert pages_of(tmp_path, "B") == [other]
    assert pages_of(tmp_path / "none", "A") == []
