"""Which aten ops kiln lowers to Triton, by kind: read from the op registry
(`compiler/codegen/rules.py`), where each op is added. Everything else is an ATen call."""

from __future__ import annotations

from compiler.codegen.rules import ops_of

POINTWISE = ops_of("pointwise")  # one output element from the same element of each input
VIEWS = ops_of("view")  # index arithmetic over their input, no copy
INDEXING = ops_of("index")  # loads at computed positions (gather, padding, concatenation)
REDUCTIONS = ops_of("reduction")  # reductions over a set of dims
MATMULS = ops_of("matmul")
NEVER_LOWER = ops_of("aten")  # random or data-dependent in shape: always ATen calls
