"""`kiln serve --gpus all|none|0,1`: which GPUs the embedded serve tunes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.cli import main
from service.gpus import GpuChoiceError, choose_gpus


def test_all_none_and_indices() -> None:
    assert choose_gpus("all", 2) == ["cuda:0", "cuda:1"]
    assert choose_gpus("all", 0) == []  # a CPU machine: nothing to tune on, not an error
    assert choose_gpus("none", 4) == []
    assert choose_gpus("1, 0,1", 2) == ["cuda:1", "cuda:0"]


@pytest.mark.parametrize(("spec", "message"), [
    ("2", "GPU 2 is not visible \\(this machine has GPUs 0-1\\)"),
    ("cuda:0", "takes all, none or GPU indices"),
    ("0,-1", "takes all, none or GPU indices"),
])
def test_bad_choices_are_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(GpuChoiceError, match=message):
        choose_gpus(spec, 2)


def test_serve_refuses_a_gpu_it_cannot_see(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KILN_DATABASE_URL", f"sqlite:///{tmp_path / 'k.db'}")
    monkeypatch.setenv("KILN_ADMIN_TOKEN", "x" * 40)
    monkeypatch.setattr("service.gpus.visible_gpus", lambda: 1)
    with pytest.raises(SystemExit, match="kiln serve: --gpus 0,3: GPU 3 is not visible"):
        main(["serve", "--port", "0", "--gpus", "0,3"])
