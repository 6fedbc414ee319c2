"""The runbooks (``docs/runbooks.md``) as one HTML page, served by the pager at ``/runbooks``.

Every alert's ``runbook_url`` annotation is ``<alerting.runbook_base_url>#<alertname lower-cased>``; by default
that base is the pager's own ``/runbooks`` (the local stack rewrites it to the pager's real port), so a link in
Alertmanager, Grafana or a page opens in a browser. The page has one ``id`` per ``##`` section, the alert
name lower-cased, which is exactly the fragment.

The markdown is rendered by a small renderer for the subset the runbooks use (``#``/``##`` headings,
paragraphs, ``-`` lists, ``**bold**``, `` `code` ``, ``[text](url)``); everything is HTML-escaped first.

Where the text comes from: the wheel carries ``docs/runbooks.md`` as ``loadlens/pager/runbooks.md``
(``pyproject.toml``, hatch ``force-include``); a source tree reads ``docs/runbooks.md`` itself.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

_HERE = Path(__file__).resolve().parent
CANDIDATES = (_HERE / "runbooks.md", _HERE.parents[1] / "docs" / "runbooks.md")

_INLINE = (
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), r'<a href="\2">\1</a>'),
)


def runbooks_markdown() -> str | None:
    for path in CANDIDATES:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def _inline(text: str) -> str:
    out = html.escape(text, quote=True)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def render_html(markdown: str) -> str:
    """One self-contained HTML page; ``##`` headings get ``id`` = their text lower-cased."""
    body: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if paragraph:
            body.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for raw in markdown.splitlines():
        line = raw.rstrip()
        if not line.strip():
            flush()
        elif line.startswith("## "):
            flush()
            title = line[3:].strip()
            anchor = re.sub(r"[^a-z0-9-]", "", title.lower())
            body.append(f'<h2 id="{anchor}"><a href="#{anchor}">{_inline(title)}</a></h2>')
        elif line.startswith("# "):
            flush()
            body.append(f"<h1>{_inline(line[2:].strip())}</h1>")
        elif line.lstrip().startswith("- "):
            if paragraph:
                flush()
            items.append(line.lstrip()[2:])
        elif items and raw.startswith("  "):
            items[-1] += " " + line.strip()  # a list item's continuation line
        else:
            paragraph.append(line.strip())
    flush()
    style = (
        "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.45}"
        "code{background:#f3f3f3;padding:0 .2em}h2{border-top:1px solid #ddd;padding-top:.6em}"
        "h2 a{color:inherit;text-decoration:none}:target{background:#fff6d5}"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>loadlens runbooks</title>'
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )
