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
    assert "heuristic interp. ms" in captured.out and "config" in captured.out
    assert "forward" in captured.out
    # Interpreter times are no speed: no speedup column, no eager time beside them.
    tables, note = captured.out.split("(cpu:")
    assert "speedup" not in tables and "eager ms" not in tables and "no speedups" in note
    # stderr is not a terminal here: one plain line per step, no carriage returns
    progress = captured.err.splitlines()
    assert "\r" not in captured.err and progress
    assert all(line.startswith("kiln tune: graph 1/1 ") for line in progress), progress
    kernels = sum(1 for line in progress if " time heuristic kernel " in line)
    assert kernels >= 1 and sum(" search kernel " in line for line in progress) == kernels
    assert f"search kernel {kernels}/{kernels} " in progress[-2]
    assert progress[-1].startswith("kiln tune: graph 1/1 done") and "~0s left" in progress[-1]
    assert out_json.read_text().startswith("[")


def test_progress_on_a_terminal_redraws_in_place_with_time_left() -> None:
    import io

    stream = io.StringIO()
    bar = cli.ProgressBar(2, stream=stream, interactive=True)
    bar.graph = 1
    for done in range(7):  # 3 kernels: 3 heuristic timings, 3 searches, then done
        bar(done, 6, f"k{done % 3}")
    bar.close()
    frames = stream.getvalue().split("\r")[1:]
    assert len(frames) == 7 and stream.getvalue().endswith("\n")
    assert "graph 2/2 time heuristic kernel 1/3" in frames[0]
    assert "graph 2/2 search kernel 3/3" in frames[-2] and "left" in frames[-2]
    assert "graph 2/2 done" in frames[-1]
    assert "kernel 4/" not in stream.getvalue() and "kernel 6/" not in stream.getvalue()


def test_device_strategy_and_model_errors_are_one_line(tmp_path, capsys) -> None:
    import torch

    path = tmp_path / "tiny_model3.py"
    path.write_text(MODEL_PY)
    for bad in (["--device", "tpu"], ["--strategy", "fast"]):
        with pytest.raises(SystemExit) as usage:
            cli.main([str(path), *bad])
        assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "'tpu' is not cpu, cuda or cuda:N" in err
    assert "invalid choice: 'fast'" in err and "halving" in err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: no CUDA device here .* use --device cpu"):
            cli.main([str(path), "--device", "cuda"])
    wrong = tmp_path / "wrong_inputs.py"
    wrong.write_text(MODEL_PY.replace("torch.randn(4, 16)", "torch.randn(4, 16), torch.randn(3)"))
    with pytest.raises(SystemExit) as failed:
        cli.main([str(wrong), "--device", "cpu", "--trials", "1"])
    message = str(failed.value.code)
    assert message.startswith("kiln tune: tracing") and "TypeError" in message
    assert "\n" not in message


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


def test_an_output_that_cannot_be_written_is_refused_before_tuning(tmp_path, capsys) -> None:
    """The results of a whole tune were lost to a FileNotFoundError at the end: the --json
    path is checked first, in one line, and nothing is tuned."""
    path = tmp_path / "tiny_model4.py"
    path.write_text(MODEL_PY)
    for out in (tmp_path / "no" / "dir" / "out.json", tmp_path):
        with pytest.raises(SystemExit) as refused:
            cli.main([str(path), "--device", "cpu", "--trials", "1", "--json", str(out)])
        message = str(refused.value.code)
        assert message.startswith(f"kiln tune: --json {out}: ") and "\n" not in message
        assert "kiln tune: graph" not in capsys.readouterr().err  # no tuning started


def test_a_trial_budget_below_one_and_a_negative_time_budget_are_refused(tmp_path,
                                                                         capsys) -> None:
    path = tmp_path / "tiny_model5.py"
    path.write_text(MODEL_PY)
    for bad in (["--trials", "-3"], ["--trials", "0"], ["--seconds", "-1"]):
        with pytest.raises(SystemExit) as usage:
            cli.main([str(path), "--device", "cpu", *bad])
        assert usage.value.code == 2
        assert f"{bad[0]}: " in capsys.readouterr().err


def test_a_syntax_error_in_the_model_file_is_named_without_the_inputs_hint(tmp_path) -> None:
    broken = tmp_path / "broken_model.py"
    broken.write_text(MODEL_PY + "\ndef oops(:\n")
    with pytest.raises(SystemExit) as failed:
        cli.main([str(broken), "--device", "cpu", "--trials", "1"])
    message = str(failed.value.code)
    assert message.startswith("kiln tune: loading") and "SyntaxError" in message
    assert "broken_model.py, line " in message and "\n" not in message
    assert "example_inputs" not in message
