"""Plots and page data built from admin-query dicts: deterministic, labelled, escaped."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from service.dashboard import plots, views

MEASURED = [
    {"kernel": "k0", "variant": "pointwise", "config": {"XBLOCK": 64, "num_warps": 4}, "ms": 0.30,
     "error": None, "verified": True},
    {"kernel": "k0", "variant": "pointwise", "config": {"XBLOCK": 128, "num_warps": 4},
     "ms": 0.20, "error": None, "verified": True},
    {"kernel": "k0", "variant": "pointwise", "config": {"XBLOCK": 256, "num_warps": 8},
     "ms": 0.25, "error": None, "verified": False},
    {"kernel": "k0", "variant": "pointwise", "config": {"XBLOCK": 8192, "num_warps": 8},
     "ms": None, "error": "OutOfResources: $x$ <script>alert(1)</script>", "verified": False},
]


def _texts(svg: str) -> str:
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    return " ".join("".join(node.itertext()) for node in root.iter() if node.tag.endswith("text"))


def test_candidate_plot_marks_failures_with_reason_and_the_chosen_config() -> None:
    svg = str(plots.candidate_plot("k0", MEASURED, {"XBLOCK": 128, "num_warps": 4}, "c0"))
    text = _texts(svg)
    assert "chosen" in text and "failed" in text and "wrong result" in text and "verified" in text
    assert "OutOfResources: $x$" in text  # literal dollars, no mathtext
    assert "<script>" not in svg and "&lt;script" in svg  # data is escaped inside the SVG
    assert 'role="img"' in svg and 'aria-label="Candidates measured for k0"' in svg


def test_plots_are_deterministic_and_ids_unique_per_plot() -> None:
    a = str(plots.candidate_plot("k0", MEASURED, None, "c0"))
    b = str(plots.candidate_plot("k0", MEASURED, None, "c0"))
    c = str(plots.candidate_plot("k0", MEASURED, None, "c1"))
    assert a == b
    ids_a = set(re.findall(r'id="([^"]+)"', a))
    ids_c = set(re.findall(r'id="([^"]+)"', c))
    assert ids_a and not ids_a & ids_c
    for ref in re.findall(r"url\(#([^)]+)\)", a):
        assert ref in ids_a


def test_empty_data_gives_a_labelled_placeholder() -> None:
    assert "no lookups yet" in _texts(str(plots.hit_rate_plot([])))
    assert "no candidates measured" in _texts(str(plots.candidate_plot("k", [], None, "e")))
    assert "not measured yet" in _texts(str(plots.timings_plot(None, None, None)))


def test_overview_context_reads_the_stats_contract() -> None:
    stats = {"entries_by_status": {"heuristic": 2, "tuned": 3, "failed": 1}, "hits": 9,
             "misses": 3, "misses_by_reason": {"unknown_graph": 2, "other_gpu": 1,
                                               "other_versions": 0, "other_compiler": 0},
             "hit_rate_series": [{"t": "2026-11-30T12:00:00+00:00", "hits": 4, "misses": 1},
                                 {"t": "2026-11-30T12:01:00+00:00", "hits": 5, "misses": 2}],
             "speedups": [1.2, 0.9], "queue_depth": {"build": 2}, "workers": []}
    ctx = views.overview_context(stats)
    assert ctx["total_entries"] == 6 and ctx["hit_rate"] == 75.0
    assert "other GPU" in _texts(str(ctx["misses_plot"]))
    assert "lookups (right axis)" in _texts(str(ctx["hit_rate_plot"]))


def test_entry_context_highlights_source_and_groups_measurements_by_kernel() -> None:
    entry = {"key": "a" * 64, "graph_hash": "b" * 64, "status": "tuned", "target": {},
             "op_summary": {"aten.add.Tensor": 2, "aten.relu.default": 1},
             "kernels": [{"name": "k0", "kind": "pointwise", "variant": "pointwise",
                          "config": {"XBLOCK": 128, "num_warps": 4}, "nodes": ["n0"],
                          "ops": ["aten.add.Tensor"], "source": "@triton.jit\ndef k0(x):\n    pass\n"}],
             "measurements": [*MEASURED, {"kernel": "gone", "config": {}, "ms": 1.0,
                                          "error": None, "verified": True}],
             "eager_ms": 0.5, "heuristic_ms": 0.3, "tuned_ms": 0.2, "jobs": None}
    ctx = views.entry_context(entry)
    (kernel,) = ctx["kernels"]
    assert 'class="source"' in kernel["source_html"] and "triton" in kernel["source_html"]
    assert [m["config_text"] for m in kernel["measurements"]] == [
        "pointwise X64 w4", "pointwise X128 w4", "pointwise X256 w8", "pointwise X8192 w8"]
    assert len(ctx["orphan_measurements"]) == 1
    assert ctx["op_summary"][0] == ("aten.add.Tensor", 2)
    assert "chosen" in _texts(str(kernel["plot"]))


def test_only_the_chosen_variant_is_starred() -> None:
    rows = [{"kernel": "k", "variant": v, "config": {"XBLOCK": 8}, "ms": ms, "error": None,
             "verified": True} for v, ms in (("looped", 2.0), ("persistent", 1.0))]
    svg = str(plots.candidate_plot("k", rows, {"XBLOCK": 8}, "v", chosen_variant="persistent"))
    assert _texts(svg).count("chosen") == 2  # the legend entry and one label, not two labels


def test_many_candidates_name_each_failure_reason_once() -> None:
    rows = [{"kernel": "k", "variant": "pointwise", "config": {"XBLOCK": 2 ** i}, "ms": None,
             "error": "CompileTimeout" if i % 2 else "OutOfResources", "verified": False}
            for i in range(60)]
    text = _texts(str(plots.candidate_plot("k", rows, None, "many")))
    assert text.count("CompileTimeout") == 1 and text.count("OutOfResources") == 1
