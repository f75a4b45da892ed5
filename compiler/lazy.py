"""Lazy public names for a package: `import compiler` (or `tuner`) stays cheap, and a name
loads its module on first use (a service process that only parses graphs never imports
Triton)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(namespace: dict[str, Any], public: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for a package whose `public` maps each name to its module;
    a loaded name is cached in the package's `namespace` (its `globals()`)."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__
