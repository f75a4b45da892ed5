"""`python -m bench.flow` end to end on the CPU: the embedded serve builds every graph of a
training step, fresh wait-mode clients fetch the schedules, and the JSON record says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_flow_serves_every_graph_of_a_training_step(tmp_path: Path) -> None:
    out = tmp_path / "flow.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.flow", "--device", "cpu", "--small", "--redis", "off",
         "--models", "gpt_block_train", "--iters", "1", "--timeout", "300", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["service_mode"] == "embedded"
    assert [g["status"] for g in record["graphs"]] == ["heuristic", "heuristic"]  # fwd, bwd
    (case,) = record["cases"]
    stats = case["measure"]["stats"]
    assert stats["schedules_fetched"] == stats["graphs"] == 2 and stats["eager"] == 0
    assert case["measure"]["error_vs_eager"] < 0.02
    assert "per graph (the service's record)" in done.stdout


# ---- several GPUs: the per-graph record and the run's checks (no service needed) ----------
DEVICES = {"cpu-w": "cpu", "gpu0-w": "cuda:0", "gpu1-w": "cuda:1"}


def _job(finisher: str, tuned_device: str | None, runs: list[str]) -> dict:
    """A job as `GET /v1/jobs/{id}` shows it: built on the CPU, then tuned by `runs` (the
    last of which finished it)."""
    history = [{"status": "queued", "worker": None, "message": "submitted"},
               {"status": "running", "worker": "cpu-w", "message": "attempt 1"},
               {"status": "queued", "worker": "cpu-w", "message": "waiting for tuning"}]
    for w in runs:
        history += [{"status": "running", "worker": w, "message": "attempt"}]
    history += [{"status": "done", "worker": finisher, "message": "tuned"}]
    return {"worker": finisher, "tuned_device": tuned_device, "history": history}


def _graph(job: dict, submitted: str, finished: str, status: str = "tuned") -> dict:
    from bench.flow import tuned_by

    return {"status": status, "submitted_at": submitted, "finished_at": finished,
            **tuned_by(job, DEVICES)}


def test_tuned_by_names_the_gpu_and_counts_the_tunings() -> None:
    from bench.flow import tuned_by

    taken_over = tuned_by(_job("gpu1-w", "cuda:1", ["gpu0-w", "gpu1-w"]), DEVICES)
    assert taken_over == {"worker": "gpu1-w", "worker_device": "cuda:1", "tuned_device": "cuda:1",
                          "tune_workers": ["gpu0-w", "gpu1-w"], "tunes_done": 1}
    built_only = {"worker": "cpu-w", "tuned_device": None, "history": [
        {"status": "running", "worker": "cpu-w"}, {"status": "done", "worker": "cpu-w"}]}
    assert tuned_by(built_only, DEVICES)["tunes_done"] == 0


def test_gpu_checks_and_wall_time_of_a_run() -> None:
    from bench.flow import gpu_checks, wall_seconds

    t0, t1, t2 = "2026-12-08T10:00:00+00:00", "2026-12-08T10:00:30+00:00", "2026-12-08T10:01:05.5+00:00"
    good = [_graph(_job("gpu0-w", "cuda:0", ["gpu0-w"]), t0, t1),
            _graph(_job("gpu1-w", "cuda:1", ["gpu1-w"]), t1, t2)]
    assert wall_seconds(good) == 65.5
    assert gpu_checks(good, 2) == {"all_tuned": True, "each_key_tuned_once": True,
                                   "each_child_on_its_gpu": True,
                                   "gpus_used": ["cuda:0", "cuda:1"], "every_gpu_used": True}
    assert not gpu_checks(good[:1], 2)["every_gpu_used"]
    # a child on the other worker's GPU, a key tuned twice, a graph left heuristic
    wrong_gpu = [_graph(_job("gpu0-w", "cuda:1", ["gpu0-w"]), t0, t1)]
    assert not gpu_checks(wrong_gpu, 1)["each_child_on_its_gpu"]
    twice = _job("gpu1-w", "cuda:1", ["gpu1-w"])
    twice["history"].append({"status": "done", "worker": "gpu0-w", "message": "tuned"})
    assert not gpu_checks([_graph(twice, t0, t1)], 2)["each_key_tuned_once"]
    assert not gpu_checks([_graph(_job("gpu0-w", "cuda:0", ["gpu0-w"]), t0, t1, "heuristic")],
                          1)["all_tuned"]
    assert wall_seconds([{"submitted_at": t0, "finished_at": None}]) is None


def test_gpu_counts_parses_a_count_or_a_list() -> None:
    import pytest

    from bench.flow import gpu_counts

    assert gpu_counts(None, 2) is None
    assert gpu_counts("2", 2) == [2] and gpu_counts("1,2", 2) == [1, 2]
    for bad in ("3", "0", "one", "1,,2"):
        with pytest.raises(SystemExit):
            gpu_counts(bad, 2)
