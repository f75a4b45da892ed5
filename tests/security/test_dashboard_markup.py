"""The two places the dashboard marks HTML as safe without Jinja's escaping: Pygments output
for kernel sources and matplotlib SVG for plots. Both must escape whatever text they carry
(measurement errors and job errors can quote client strings)."""

from __future__ import annotations

from html.parser import HTMLParser

from service.dashboard import plots
from service.dashboard.highlight import highlight_python

HOSTILE = "</pre></td><script>alert(1)</script><img src=x onerror=alert(2)>&amp;"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.handlers += [name for name, _ in attrs if name.startswith("on")]


def _no_active_markup(html: str) -> None:
    """Parsed as a browser would: no script, img, iframe element, no on* attribute."""
    parser = _Tags()
    parser.feed(html)
    assert not parser.tags & {"script", "img", "iframe", "object", "embed"}, parser.tags
    assert not parser.handlers, parser.handlers


def test_highlighted_source_escapes_every_token() -> None:
    source = f'# {HOSTILE}\nx = "{HOSTILE}"\n{HOSTILE}\n'
    html = str(highlight_python(source))
    _no_active_markup(html)
    assert "&lt;script&gt;" in html


def test_plots_escape_kernel_names_and_failure_reasons() -> None:
    rows = [{"ms": 0.5, "error": None, "verified": True, "variant": "pointwise",
             "config": {"XBLOCK": 64}},
            {"ms": None, "error": HOSTILE, "verified": False, "variant": "pointwise",
             "config": {"XBLOCK": "<b>x</b>"}}]
    svg = str(plots.candidate_plot(HOSTILE, rows, rows[0]["config"], "sec0",
                                   chosen_variant="pointwise"))
    _no_active_markup(svg)
    svg = str(plots.counts_plot({HOSTILE: 3, "ok": 1}, HOSTILE, "sec1"))
    _no_active_markup(svg)
    assert "&lt;script&gt;" in svg  # the title stays readable text
