"""The model set's packages (`bench.models.missing_package`): every benchmark names a missing
one before it starts a measuring process."""

from __future__ import annotations

import subprocess


def test_a_model_whose_package_is_missing_is_named_before_any_process_starts(
        monkeypatch, capsys) -> None:
    import pytest

    from bench import hit_cpu, model_suite, models, trace_probe

    monkeypatch.setitem(models.NEEDS, "gpt2", "kiln_no_such_package")
    assert models.missing_package("gpt2") == "kiln_no_such_package"
    assert models.missing_package("gpt_block_train") is None  # this project's own model
    started = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: started.append(a))
    for main, args in ((trace_probe.main, ["--model", "gpt2"]),
                       (hit_cpu.main, ["--model", "gpt2"]),
                       (model_suite.main, ["--cases", "gpt2.train,gpt_block_train.train"])):
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert stop.value.code == 2
        assert "kiln_no_such_package" in capsys.readouterr().err
    assert not started


def test_a_steps_gpu_time_leaves_out_the_profilers_own_rows() -> None:
    """CUPTI's buffer requests are device rows of the profiler's: 2.4 ms in one kiln run."""
    from bench.measure import gpu_ms_per_step

    rows = [("fused_add_0", 300.0), ("Activity Buffer Request", 2400.0), ("Memset (Device)", 20.0)]
    assert gpu_ms_per_step(rows, 2) == 0.16


def test_device_counts_sort_a_steps_activities() -> None:
    """What the model suite counts per step from the profiler's device activities."""
    from bench.measure import device_counts

    names = ["Memcpy DtoD (Device -> Device)", "Memset (Device)", "fused_add_0",
             "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>(...)",
             "void at::native::unrolled_elementwise_kernel<copy_kernel>", "Memcpy HtoD",
             "Activity Buffer Request"] * 2
    assert device_counts(names, 2) == {"kernels_per_step": 3.0, "memcpy_dtod_per_step": 1.0,
                                       "copy_kernels_per_step": 1.0,
                                       "layout_conversions_per_step": 1.0}
