"""kiln.dynamo_prime: dynamo's first-trace costs paid when the backend is looked up."""

from __future__ import annotations

import sys

from kiln import dynamo_prime


def test_priming_fills_dynamos_file_filter_and_imports_what_its_first_trace_would() -> None:
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    uninteresting_files.cache_clear()
    dynamo_prime.prime()
    assert uninteresting_files.cache_info().currsize == 1
    assert all(name in sys.modules for name in dynamo_prime.FIRST_TRACE_IMPORTS)


def test_a_module_another_torch_lacks_is_skipped(monkeypatch) -> None:
    monkeypatch.setattr(dynamo_prime, "FIRST_TRACE_IMPORTS", ("torch._no_such_module_here",))
    dynamo_prime.prime()  # no exception
    assert "torch._no_such_module_here" not in sys.modules
