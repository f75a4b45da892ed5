"""`python -m bench.model_suite` on the CPU: every path in a cold process, one record per case
with the fields the training-speed and compile-time issues read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_model_suite_measures_eager_and_kiln(tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.model_suite", "--device", "cpu", "--small",
         "--models", "gpt_block_train", "--paths", "eager,kiln_heuristic", "--iters", "1",
         "--timeout", "300", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (case,) = json.loads(out.read_text())["cases"]
    assert (case["model"], case["step"]) == ("gpt_block_train", "train")
    assert case["eager_wall_ms"] > 0 and case["kiln_heuristic_wall_ms"] > 0
    assert case["kiln_first_s"] > 0 and case["eager_first_s"] >= 0
    kiln = case["paths"]["kiln_heuristic"]
    assert kiln["stats"]["builds"] == 2 and kiln["stats"]["eager"] == 0  # forward and backward
    assert kiln["error_vs_eager"] < 0.02 and kiln["max_grad_error_vs_eager"] < 0.05
    assert kiln["host_ms"] > 0 and kiln["gpu_ms"] is None  # no GPU here
    # each graph's CUDA graph runner (none on the CPU)
    assert sorted((g["kind"], g["cuda_graph"]) for g in kiln["cuda_graphs"]) == [
        ("backward", None), ("forward", None)]
    # where the first step went: dynamo's phases, kiln's steps per thread on kiln's clock
    assert "create_aot_dispatcher_function" in kiln["dynamo_compile_times"]
    assert all(isinstance(name, str) for name in kiln["first_step_imports"])
    timeline = kiln["kiln_timeline"]
    assert [s["step"] for s in timeline["steps"]].count("build") == 2
    assert all(s["start"] >= timeline["first_step_start"] for s in timeline["steps"])


def test_a_merge_keeps_paths_measured_in_an_earlier_call_and_remakes_the_ratios() -> None:
    from bench.model_suite import _case_record, _geomeans, _merged

    first = [_case_record("gpt2", "train", {"eager": {"wall_ms": 2.0},
                                           "inductor": {"wall_ms": 1.0, "first_s": 9.0}})]
    second = [_case_record("gpt2", "train", {"kiln_heuristic": {"wall_ms": 0.5}}),
              _case_record("resnet18", "infer", {"inductor": {"wall_ms": 1.0},
                                                 "kiln_heuristic": {"wall_ms": 2.0}})]
    gpt2, resnet = _merged(first, second)
    assert gpt2["inductor_first_s"] == 9.0 and set(gpt2["paths"]) == {
        "eager", "inductor", "kiln_heuristic"}
    assert gpt2["kiln_heuristic_vs_eager"] == 4.0 and gpt2["kiln_heuristic_vs_inductor"] == 2.0
    assert resnet["kiln_heuristic_vs_inductor"] == 0.5 and "kiln_heuristic_vs_eager" not in resnet
    assert _geomeans([gpt2, resnet]) == {"kiln_heuristic_vs_eager": 4.0,
                                         "kiln_heuristic_vs_inductor": 1.0}
    # A case's hit pairs stay through a merge that did not measure them again, and a new
    # measurement's replace them.
    first[0]["hit_pairs"] = {"median_difference_s": -0.5}
    (kept,) = _merged(first, [_case_record("gpt2", "train", {"eager": {"wall_ms": 3.0}})])
    assert kept["hit_pairs"] == {"median_difference_s": -0.5}
    again = {**_case_record("gpt2", "train", {}), "hit_pairs": {"median_difference_s": 0.1}}
    (replaced,) = _merged(first, [again])
    assert replaced["hit_pairs"] == {"median_difference_s": 0.1}


def test_hit_variants_parse_into_named_environments() -> None:
    import argparse

    import pytest

    from bench.model_suite import _variants

    assert _variants("noworkers:KILN_COMPILE_WORKERS=0; both:A=1,B=x=y") == {
        "noworkers": {"KILN_COMPILE_WORKERS": "0"}, "both": {"A": "1", "B": "x=y"}}
    assert _variants("") == {}
    for bad in ("noname", "x:", "x:A", "bad name:A=1", "x:=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _variants(bad)


def test_an_untuned_service_has_no_gpu_worker(monkeypatch, tmp_path: Path) -> None:
    import argparse

    import torch

    from bench import flow, model_suite

    started = []

    class Service:
        def __init__(self, workdir, gpus, redis, tune_seconds, tune_trials) -> None:
            started.append(gpus)

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(flow, "Service", Service)
    monkeypatch.setattr(flow, "_client", lambda *a, **k: None)
    monkeypatch.setattr(flow, "_settle", lambda service, timeout: [])
    monkeypatch.setattr(flow, "_graphs", lambda service, entries: [])
    for untuned in (False, True):
        args = argparse.Namespace(device="cuda", tune_seconds=1.0, tune_trials=1, timeout=1.0,
                                  small=True, untuned_service=untuned)
        model_suite._tuned_service(args, tmp_path, [("gpt_block_train", "train")])
    assert started == [[0, 1], []]


def test_reduce_overhead_inductor_is_a_path_kiln_is_compared_with() -> None:
    from bench.model_suite import _case_record

    record = _case_record("resnet18", "infer", {"inductor_ro": {"wall_ms": 1.0, "first_s": 20.0},
                                                "kiln_heuristic": {"wall_ms": 0.8}})
    assert record["inductor_ro_first_s"] == 20.0
    assert record["kiln_heuristic_vs_inductor_ro"] == 1.25


def test_cases_name_exact_model_and_step_pairs() -> None:
    import argparse

    import pytest

    from bench.model_suite import _cases

    assert _cases("gpt2.infer, resnet18.train") == [("gpt2", "infer"), ("resnet18", "train")]
    for bad in ("gpt2.inferx", "resnet.train", "gpt_block_train.infer", "gpt2"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a case"):
            _cases(bad)


def test_kiln_warm_runs_on_the_caches_the_service_hit_filled(monkeypatch, tmp_path: Path) -> None:
    import argparse

    from bench import model_suite

    refused = subprocess.run([sys.executable, "-m", "bench.model_suite", "--paths", "kiln_warm"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "add kiln_tuned" in refused.stderr
    envs = {}

    def run(cmd, env, **kwargs):
        path = cmd[cmd.index("--path") + 1]
        envs[path] = env
        return subprocess.CompletedProcess(cmd, 0, stdout=model_suite.RESULT_MARK + "{}")

    monkeypatch.setattr(model_suite.subprocess, "run", run)
    args = argparse.Namespace(device="cpu", iters=1, small=True, timeout=1.0)
    for path in ("kiln_tuned", "kiln_warm", "inductor_warm"):
        model_suite._measure(args, tmp_path, "gpt2", "train", path, {})
    for var in ("KILN_CACHE_DIR", "TRITON_CACHE_DIR", "KILN_KERNEL_DIR"):
        assert envs["kiln_warm"][var] == envs["kiln_tuned"][var]
        assert Path(envs["inductor_warm"][var]).name.startswith("gpt2-train-inductor-")


def test_first_repeats_take_the_median_of_fresh_hits_and_warm_runs(monkeypatch,
                                                                   tmp_path: Path) -> None:
    import argparse

    from bench import model_suite

    calls: list[tuple[str, str]] = []
    firsts = iter([3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 9.0])

    def run(cmd, env, **kwargs):
        path = cmd[cmd.index("--path") + 1]
        calls.append((path, env["KILN_CACHE_DIR"]))
        record = {"path": path, "first_s": next(firsts)}
        return subprocess.CompletedProcess(cmd, 0, stdout=model_suite.RESULT_MARK + json.dumps(record))

    monkeypatch.setattr(model_suite.subprocess, "run", run)
    args = argparse.Namespace(device="cpu", iters=1, small=True, timeout=1.0, first_repeats=3)
    hit = model_suite._measure_first(args, tmp_path, "gpt2", "train", "kiln_tuned", {})
    assert hit["first_samples"] == [3.0, 1.0, 2.0] and hit["first_s"] == 2.0
    hit_caches = [cache for _, cache in calls]
    assert len(set(hit_caches)) == 3  # each repeat a fresh client: a hit, not a warm restart
    warm = model_suite._measure_first(args, tmp_path, "gpt2", "train", "inductor_warm", {})
    assert warm["first_samples"] == [5.0, 4.0, 6.0] and warm["first_s"] == 5.0
    assert len({cache for _, cache in calls[3:]}) == 1  # on the caches `inductor` filled
    cold = model_suite._measure_first(args, tmp_path, "gpt2", "train", "inductor", {})
    assert cold["first_s"] == 9.0 and "first_samples" not in cold  # a cold path runs once


def test_paired_first_steps_alternate_inductor_warm_and_the_hit(monkeypatch, tmp_path: Path) -> None:
    import argparse

    from bench import model_suite

    calls: list[str] = []
    firsts = iter([2.0, 2.5, 1.0, None, 3.0, 2.0])  # None: that process fails

    def run(cmd, env, **kwargs):
        path = cmd[cmd.index("--path") + 1]
        calls.append(path)
        first = next(firsts)
        if first is None:
            return subprocess.CompletedProcess(cmd, 1, stdout="")
        record = {"path": path, "first_s": first}
        return subprocess.CompletedProcess(cmd, 0, stdout=model_suite.RESULT_MARK + json.dumps(record))

    monkeypatch.setattr(model_suite.subprocess, "run", run)
    args = argparse.Namespace(device="cpu", iters=1, small=True, timeout=1.0, first_repeats=3)
    warm, hit, pairs = model_suite._measure_paired(args, tmp_path, "gpt2", "train", {})
    assert calls == ["inductor_warm", "kiln_tuned"] * 3
    assert warm["first_samples"] == [2.0, 1.0, 3.0] and warm["first_s"] == 2.0
    assert hit["first_samples"] == [2.5, 2.0] and hit["first_s"] == 2.25
    assert len(hit["repeat_errors"]) == 1
    # The failed hit's pair is left out; the others: kiln minus Inductor, and their median.
    assert pairs == {"inductor_warm_s": [2.0, 3.0], "kiln_hit_s": [2.5, 2.0],
                     "kiln_minus_inductor_warm_s": [0.5, -1.0], "median_difference_s": -0.25}


def test_the_service_hit_is_measured_again_without_plans(monkeypatch, tmp_path: Path) -> None:
    """kiln_tuned_noplan: the hit's environment with KILN_PLANS=0, in a fresh process on
    empty caches of its own; the case names its step time beside the planned hit's."""
    import argparse

    from bench import model_suite

    envs = {}

    def run(cmd, env, **kwargs):
        path = cmd[cmd.index("--path") + 1]
        envs[path] = env
        record = {"path": path, "wall_ms": 2.0 if path == model_suite.NOPLAN else 2.5}
        return subprocess.CompletedProcess(cmd, 0, stdout=model_suite.RESULT_MARK + json.dumps(record))

    monkeypatch.setattr(model_suite.subprocess, "run", run)
    args = argparse.Namespace(device="cpu", iters=1, small=True, timeout=1.0)
    hit_env = {"KILN_URL": "http://127.0.0.1:1", "KILN_MODE": "wait"}
    tuned = model_suite._measure(args, tmp_path, "gpt2", "train", "kiln_tuned", hit_env)
    noplan = model_suite._measure_noplan(args, tmp_path, "gpt2", "train", hit_env)
    assert envs["kiln_tuned_noplan"]["KILN_PLANS"] == "0"
    assert "KILN_PLANS" not in envs["kiln_tuned"]
    assert envs["kiln_tuned_noplan"]["KILN_URL"] == hit_env["KILN_URL"]
    for var in ("KILN_CACHE_DIR", "TRITON_CACHE_DIR", "KILN_KERNEL_DIR"):
        assert envs["kiln_tuned_noplan"][var] != envs["kiln_tuned"][var]
    record = model_suite._case_record("gpt2", "train", {"kiln_tuned": tuned,
                                                        "kiln_tuned_noplan": noplan})
    assert record["kiln_tuned_noplan_wall_ms"] == 2.0 and record["kiln_tuned_wall_ms"] == 2.5
    assert record["kiln_tuned_vs_noplan"] == 0.8  # the planned step is the slower here
    assert "kiln_hit_noplan_first_s" in record

