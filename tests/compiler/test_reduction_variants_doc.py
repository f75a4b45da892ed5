"""The reduction kind's docstring is the one prose list of its variants: it names each."""

from __future__ import annotations

import re

from compiler.codegen.kinds import reduction


def test_the_reduction_docstring_lists_exactly_the_variants() -> None:
    listed = re.findall(r"^- `(\w+)`:", reduction.__doc__ or "", flags=re.MULTILINE)
    assert listed == list(reduction.VARIANTS)
