"""bench/gil_samples.py: py-spy's raw samples summarised per thread."""

from __future__ import annotations

from bench.gil_samples import sampled, summary

RAW = [
    "thread (1): MainThread;main (/x/site-packages/pkg/a.py:3);work (/x/site-packages/pkg/a.py:9) 30",
    "thread (1): MainThread;main (/x/site-packages/pkg/a.py:3);work (/x/site-packages/pkg/a.py:12) 10",
    "thread (1): MainThread;main (/x/site-packages/pkg/a.py:3) 5",
    "thread (2): other;run (/x/site-packages/pkg/b.py:1) 20",
    "not a sample line",
]


def test_samples_add_up_per_thread_and_lines_of_one_function_merge() -> None:
    text = summary(RAW, rate=100)
    main, other = text.split("== ")[1:]
    assert main.startswith("thread (1): MainThread: 45 samples, 0.450 s")
    assert "    40   0.400s  work (pkg/a.py)" in main  # two lines of `work`, one entry
    assert "    45   0.450s  main (pkg/a.py)" in main  # inclusive of what it called
    own = main.split("-- own")[1]
    assert "    40   0.400s  work (pkg/a.py)" in own and "     5   0.050s  main (pkg/a.py)" in own
    assert other.startswith("thread (2): other: 20 samples, 0.200 s")


def test_without_py_spy_nothing_is_sampled() -> None:
    with sampled(None) as found:
        pass
    assert found == {}
