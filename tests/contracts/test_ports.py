"""One table of ports: docs/architecture.md shows exactly loadlens/contracts/ports.py's PORTS."""

from __future__ import annotations

from pathlib import Path

from loadlens.contracts.ports import PORTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_architecture_doc_lists_every_port_as_in_the_code() -> None:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), cells[2].strip("`"))
    assert rows == {p.name: (p.port, p.job or "–") for p in PORTS}


def test_ports_are_unique() -> None:
    assert len({p.port for p in PORTS}) == len(PORTS)


def test_readme_ports_table_shows_every_port_as_in_the_code() -> None:
    readme = DOC.parents[1] / "README.md"
    rows = {}
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1].isdigit():
            rows[cells[0]] = int(cells[1])
    assert rows == {p.name: p.port for p in PORTS}
