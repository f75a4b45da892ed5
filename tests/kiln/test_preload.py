"""kiln.preload: dynamo's first-trace costs and the first compile's imports, paid when the
backend is looked up."""

from __future__ import annotations

import gc
import sys
import weakref

from kiln import preload


def test_priming_fills_dynamos_file_filter_and_imports_what_its_first_trace_would() -> None:
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    uninteresting_files.cache_clear()
    preload.prime_dynamo()
    assert uninteresting_files.cache_info().currsize == 1
    assert all(name in sys.modules for name in preload.FIRST_TRACE_IMPORTS)


def test_priming_loads_dynamos_backend_registry() -> None:
    from torch._dynamo.backends import registry

    registry._lazy_import.cache_clear()
    preload.prime_dynamo()
    assert registry._lazy_import.cache_info().currsize == 1  # the end of a first compile asks


def test_the_first_compiles_modules_are_imported() -> None:
    preload.import_compiler()
    assert all(name in sys.modules for name in preload.COMPILER_IMPORTS)


def test_a_module_another_version_lacks_is_skipped(monkeypatch) -> None:
    monkeypatch.setattr(preload, "FIRST_TRACE_IMPORTS", ("torch._no_such_module_here",))
    monkeypatch.setattr(preload, "COMPILER_IMPORTS", ("compiler._no_such_module_here",))
    preload.prime_dynamo()  # no exception
    preload.import_compiler()
    assert "torch._no_such_module_here" not in sys.modules
    assert "compiler._no_such_module_here" not in sys.modules


def test_freezing_collects_first_and_leaves_later_objects_to_the_collector() -> None:
    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage
    gone = weakref.ref(garbage)
    del garbage
    try:
        preload.freeze_heap()
        assert gc.get_freeze_count() > 0
        assert gone() is None  # collected, not frozen
        later = [object()]
        assert gc.is_tracked(later) and any(o is later for o in gc.get_objects())
    finally:
        gc.unfreeze()
