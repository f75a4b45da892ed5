"""Server-side syntax highlighting of generated Triton source (Pygments, Python lexer)."""

from __future__ import annotations

from functools import lru_cache

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

_FORMATTER = HtmlFormatter(cssclass="source", linenos="table", wrapcode=True)


def highlight_python(source: str) -> Markup:
    """HTML for `source` with line numbers; Pygments escapes every token it emits."""
    return Markup(_highlight_cached(source))  # noqa: S704 - Pygments output is escaped HTML


@lru_cache(maxsize=256)
def _highlight_cached(source: str) -> str:
    return highlight(source, PythonLexer(), _FORMATTER)


def stylesheet() -> str:
    """CSS for the highlighted blocks (the `friendly` style, scoped to `.source`)."""
    return HtmlFormatter(style="friendly", cssclass="source").get_style_defs(".source")
