"""compiler.random_inputs: seeded, layout-honouring, index inputs inside their valid range."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import decompositions, from_wire, random_inputs, to_wire
from compiler.inputs import index_ranges, positive_inputs
from compiler.tracing import trace_training
from tests.corpus import case, corpus


def _graph(name: str):
    c = case(name)
    return from_wire(to_wire(c.gm, c.example_inputs))


def test_same_seed_same_values_other_seed_other_values() -> None:
    graph = _graph("gpt_block.train_bwd")
    a, b, other = random_inputs(graph, seed=5), random_inputs(graph, seed=5), random_inputs(graph, seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, other, strict=True))


def test_inputs_match_the_graph_metadata() -> None:
    graph = _graph("convnet.train_bwd")
    for meta, tensor in zip(graph.inputs, random_inputs(graph, seed=0), strict=True):
        assert (tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset()) == (
            meta.dtype, meta.shape, meta.stride, meta.storage_offset)


def test_embedding_and_cross_entropy_indices_stay_in_range() -> None:
    for name in ("embedding_ce.fwd", "embedding_ce.train_fwd"):
        graph = _graph(name)
        tokens, targets = len(graph.inputs) - 2, len(graph.inputs) - 1
        assert index_ranges(graph) == {f"n{tokens}": 50, f"n{targets}": 50}
        for seed in range(20):
            inputs = random_inputs(graph, seed=seed)
            assert 0 <= inputs[tokens].min() and inputs[tokens].max() < 50
            graph.to_fx()(*inputs)  # embedding and gather accept every draw


def test_index_tensor_and_gather_ranges_follow_views() -> None:
    def fn(table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = table[rows.view(-1)]  # aten.index.Tensor through a view
        gathered = torch.gather(table, 1, cols.unsqueeze(0).expand(7, -1))
        return picked, gathered

    table, rows, cols = torch.randn(7, 300), torch.tensor([[1, 2], [3, 4]]), torch.tensor([5, 6, 7])
    gm = make_fx(fn, decomposition_table=decompositions())(table, rows, cols)
    graph = from_wire(to_wire(gm, [table, rows, cols]))
    assert index_ranges(graph) == {"n1": 7, "n2": 300}
    for seed in range(10):
        _, rows_in, cols_in = random_inputs(graph, seed=seed)
        assert rows_in.max() < 7 and cols_in.max() < 300
    assert random_inputs(graph, seed=0)[2].max() >= 16  # drawn over the whole range, not [0, 16)


def test_device_argument_places_the_tensors() -> None:
    graph = _graph("mlp.fwd")
    assert all(t.device.type == "meta" for t in random_inputs(graph, device="meta"))


def test_max_pool_indices_point_inside_their_window() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, kernel_size=3, stride=2, padding=1)

    x = torch.randn(2, 3, 9, 7, requires_grad=True)
    _, bwd_gm, _, bwd_inputs = trace_training(fn, [x])
    graph = from_wire(to_wire(bwd_gm, bwd_inputs))
    (indices,) = [t for t in random_inputs(graph, seed=2) if t.dtype == torch.int64]
    out_h, out_w = indices.shape[-2:]
    rows, cols = indices // 7, indices % 7
    oh = torch.arange(out_h).view(out_h, 1)
    ow = torch.arange(out_w).view(1, out_w)
    assert ((rows >= oh * 2 - 1) & (rows <= oh * 2 + 1) & (rows >= 0) & (rows < 9)).all()
    assert ((cols >= ow * 2 - 1) & (cols <= ow * 2 + 1) & (cols >= 0) & (cols < 7)).all()
    assert len(set(indices.flatten().tolist())) > out_h * out_w  # not one fixed tap


def test_every_corpus_graph_gives_finite_outputs_on_random_inputs() -> None:
    for c in corpus():
        graph = from_wire(to_wire(c.gm, c.example_inputs))
        outputs = graph.to_fx()(*random_inputs(graph, seed=4))
        for out in outputs:
            assert out is None or not out.is_floating_point() or torch.isfinite(out).all(), c.name
    # BatchNorm's running variance (eval) reaches sqrt through add(var, eps): drawn positive.
    bn = _graph("convnet.fwd")
    assert len(positive_inputs(bn)) == 2
