"""Compiler tests write generated kernels to a private directory per test session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    if "KILN_KERNEL_DIR" not in os.environ:
        os.environ["KILN_KERNEL_DIR"] = str(tmp_path_factory.mktemp("kiln_kernels"))
