"""Packaging: a distribution name of our own, one torch pin everywhere, a GPU image that can
build Triton's launcher, and the names users rely on (the `kiln` command, the backend)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import distribution
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_distribution_name_is_not_the_taken_kiln_and_keeps_the_public_names() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "kiln-compile"  # "kiln" on the package index is someone else's
    assert project["scripts"] == {"kiln": "kiln.cli:main"}
    assert project["entry-points"]["torch_dynamo_backends"] == {"kiln": "kiln.backend:remote_compile"}
    installed = distribution("kiln-compile")  # what `make install` put in the venv
    assert any(e.name == "kiln" and e.group == "torch_dynamo_backends" for e in installed.entry_points)
    for doc in ("README.md", "docs/client.md"):
        text = (REPO / doc).read_text()
        assert "pip install kiln-compile" in text and not re.search(r"pip install kiln\b(?!-)", text)


def test_docker_image_and_make_install_pin_the_same_torch() -> None:
    make_pin = re.search(r"^TORCH_PIN \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    dockerfile = (REPO / "Dockerfile").read_text()
    docker_pin = re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M)
    assert make_pin and docker_pin and make_pin.group(1) == docker_pin.group(1)


def test_image_has_a_c_compiler_for_tritons_launcher() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    install = re.search(r"apt-get install[^\n]*", dockerfile)
    assert install and "gcc" in install.group(0) and "libc6-dev" in install.group(0)
    assert dockerfile.index("apt-get install") < dockerfile.index("USER kiln")


def test_only_the_product_packages_ship() -> None:
    """bench/ (benchmarks, coverage, GPU checks), tests/ and examples/ stay out of the wheel."""
    from setuptools import find_packages

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {name.split(".")[0] for name in find_packages(str(REPO), include=include)}
    assert shipped == {"compiler", "tuner", "service", "kiln", "migrations"}
