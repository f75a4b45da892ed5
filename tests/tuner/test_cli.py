"""`kiln tune` (tuner.cli.main): model file / module forms, progress bar, per-kernel table."""

from __future__ import annotations

import pytest

from tuner import cli

pytestmark = pytest.mark.xdist_group("tuner_runner")

MODEL_PY = """
import torch

def model():
    return lambda x: torch.softmax(x * 0.5, -1)

def example_inputs():
    return (torch.randn(4, 16),)

def factory():
    return model(), example_inputs()
"""


def test_tune_a_model_file_prints_a_table_per_kernel(tmp_path, capsys) -> None:
    path = tmp_path / "tiny_model.py"
    path.write_text(MODEL_PY)
    out_json = tmp_path / "result.json"
    assert cli.main([str(path), "--device", "cpu", "--trials", "2", "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    assert "heuristic ms" in captured.out and "speedup" in captured.out and "config" in captured.out
    assert "forward" in captured.out
    assert "[" in captured.err and "graph 1/1" in captured.err  # the progress bar
    assert out_json.read_text().startswith("[")


def test_model_spec_forms_and_clear_errors(tmp_path) -> None:
    path = tmp_path / "tiny_model2.py"
    path.write_text(MODEL_PY)
    model, inputs = cli.load_model(f"{path}:factory")
    assert callable(model) and len(inputs) == 1
    model, inputs = cli.load_model(str(path))
    assert len(inputs) == 1
    empty = tmp_path / "empty_model.py"
    empty.write_text("x = 1\n")
    with pytest.raises(SystemExit, match="model\\(\\) and example_inputs\\(\\)"):
        cli.load_model(str(empty))
    with pytest.raises(SystemExit, match="no such file"):
        cli.load_model(str(tmp_path / "missing.py"))
    with pytest.raises(SystemExit, match="cannot import"):
        cli.load_model("no_such_pkg_kiln.model")
    with pytest.raises(SystemExit, match="no callable"):
        cli.load_model(f"{path}:nothing")
