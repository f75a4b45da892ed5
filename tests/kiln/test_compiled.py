"""The swappable graph callable: only moves up the ladder, swaps land between calls, and a
per-shape graph compiles each concrete signature once."""

from __future__ import annotations

import threading

import torch

from kiln import degrade
from kiln.compiled import CompiledGraph, PerShapeGraph, has_symbolic_sizes, shape_key


def _gm() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(lambda x: (x + 1,))


def test_install_only_moves_up_and_counts_swaps():
    degrade.reset()
    g = CompiledGraph(_gm())
    x = torch.zeros(2)
    assert g([x])[0].tolist() == [1.0, 1.0]  # eager: the graph itself
    assert g.install(lambda x: (x + 2,), "heuristic", "local")
    assert g([x])[0].tolist() == [2.0, 2.0]
    assert not g.install(lambda x: (x + 9,), "heuristic", "service")  # not an upgrade
    assert g.install(lambda x: (x + 3,), "tuned", "service")
    assert not g.install(lambda x: (x + 9,), "heuristic", "local")
    assert (g.level, g.origin) == ("tuned", "service")
    assert g([x])[0].tolist() == [3.0, 3.0]
    assert degrade.stats()["swaps"] == 1  # heuristic -> tuned; eager -> heuristic is no swap


def test_boxed_call_clears_the_argument_list():
    g = CompiledGraph(_gm())
    args = [torch.ones(1)]
    g(args)
    assert args == []
    assert g._boxed_call is True


def test_a_call_in_flight_finishes_on_the_implementation_it_started_with():
    g = CompiledGraph(_gm())
    entered, release = threading.Event(), threading.Event()

    def slow_heuristic(x):
        entered.set()
        release.wait(5)
        return ("heuristic",)

    g.install(slow_heuristic, "heuristic", "local")
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", g([torch.ones(1)])))
    t.start()
    entered.wait(5)
    g.install(lambda x: ("tuned",), "tuned", "service")  # lands while the call runs
    release.set()
    t.join(5)
    assert result["r"] == ("heuristic",)
    assert g([torch.ones(1)]) == ("tuned",)


def test_per_shape_graph_compiles_each_signature_once():
    seen = []

    def specialise(gm, args):
        seen.append(tuple(a.shape for a in args))
        return lambda *a: ("compiled", a[0].shape[0])

    g = PerShapeGraph(_gm(), specialise)
    for n in (2, 3, 2, 3, 2):
        assert g([torch.zeros(n)]) == ("compiled", n)
    assert seen == [(torch.Size([2]),), (torch.Size([3]),)]
    assert len(g.shapes) == 2


def test_per_shape_graph_stops_compiling_past_its_limit():
    g = PerShapeGraph(_gm(), lambda gm, args: (lambda *a: ("compiled",)), max_shapes=1)
    assert g([torch.zeros(1)]) == ("compiled",)
    assert g([torch.zeros(2)])[0].tolist() == [1.0, 1.0]  # eager beyond the limit


def test_shape_key_and_symbolic_detection():
    a, b = torch.zeros(2, 3), torch.zeros(3, 2).t()
    assert shape_key((a,)) != shape_key((b,))  # same shape, other strides
    assert shape_key((a, 4)) != shape_key((a, 5))
    assert not has_symbolic_sizes(_gm(), [a])
