"""compiler.random_inputs: seeded, layout-honouring, index inputs inside their valid range."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import decompositions, from_wire, random_inputs, to_wire
from compiler.lowering.tracing import trace_training
from compiler.wire.inputs import index_ranges, positive_inputs
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


def test_layer_norm_rstd_is_drawn_positive_and_attention_stats_match_q_k_v() -> None:
    graph = _graph("gpt_block.train_bwd")
    by_name = {i.name: i for i in graph.inputs}
    users = {n.op for n in graph.nodes if any(getattr(a, "name", None) == "n3" for a in n.args)}
    assert users == {"aten.mul.Tensor"} and by_name["n3"].shape == (2, 8, 1)  # the saved rstd
    (sdpa,) = [n for n in graph.nodes if "attention" in n.op and n.op.endswith("backward.default")]
    index = {i.name: k for k, i in enumerate(graph.inputs)}
    q, k, v, out_at, lse_at = (index[a.name] for a in sdpa.args[1:6])  # grad, q, k, v, out, lse
    for seed in range(3):
        x = random_inputs(graph, seed=seed)
        assert 0.5 <= float(x[3].min()) and float(x[3].max()) <= 2.0
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            x[q], x[k], x[v], 0.0, True)[:2]
        assert torch.allclose(x[lse_at], lse, atol=1e-5) and torch.allclose(x[out_at], out, atol=1e-5)
    assert not torch.equal(random_inputs(graph, seed=0)[lse_at], random_inputs(graph, seed=1)[lse_at])


def test_saved_log_probabilities_are_a_log_softmax() -> None:
    """A backward that reads saved log-probabilities only through exp (a cross entropy's,
    as AOTAutograd's default partition saves it; the min-cut one, kiln's, recomputes it
    from the logits), as graphs from any client may."""
    def backward(log_probs: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_probs) * grad

    ins = [torch.randn(16, 50), torch.randn(16, 50)]
    graph = from_wire(to_wire(make_fx(backward, decomposition_table=decompositions())(*ins), ins))
    log_probs = random_inputs(graph, seed=3)[0]
    assert float(log_probs.max()) <= 0.0
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(16), atol=1e-5)


def test_an_exp_subtrahend_is_the_logsumexp_of_its_minuend() -> None:
    def fn(scores: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return torch.exp(scores - lse) * grad

    ins = [torch.randn(4, 6), torch.randn(4, 1), torch.randn(4, 6)]
    gm = make_fx(fn, decomposition_table=decompositions())(*ins)
    graph = from_wire(to_wire(gm, ins))
    scores, lse, grad = random_inputs(graph, seed=1)
    assert torch.allclose(lse, torch.logsumexp(scores, -1, keepdim=True), atol=1e-6)
    assert torch.allclose(graph.to_fx()(scores, lse, grad)[0] / grad,
                          torch.softmax(scores, -1), atol=1e-5)
    assert float(grad.min()) < 0  # a full-size operand of a mul is not a statistic


def test_attention_stats_honour_an_additive_mask_that_is_an_input() -> None:
    # cuDNN and efficient attention take the forward's mask as an additive bias: a
    # logsumexp computed without it is inconsistent with q, k (cuDNN's backward of GPT-2
    # then returned NaN), so the mask enters the computed statistics.
    def backward(grad, q, k, v, out, lse, mask):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
            grad, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=0.25)

    q, k, v, grad = (torch.randn(1, 2, 6, 4) for _ in range(4))
    mask = torch.zeros(1, 1, 6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -1e4)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=mask, scale=0.25)[:2]
    ins = [grad, q, k, v, out, lse, mask]
    graph = from_wire(to_wire(make_fx(backward)(*ins), ins))
    x = random_inputs(graph, seed=2)
    scores = x[1].double() @ x[2].double().transpose(-2, -1) * 0.25 + x[6].double()
    assert torch.allclose(x[5].double(), torch.logsumexp(scores, -1), atol=1e-5)
    assert torch.allclose(x[4].double(), torch.softmax(scores, -1) @ x[3].double(), atol=1e-5)


def test_a_logsumexp_with_cudnn_trailing_unit_dim_is_filled() -> None:
    from compiler.wire.input_stats import _copy_leading

    dest = torch.zeros(2, 3, 5, 1)
    values = torch.randn(2, 3, 5)
    _copy_leading(dest, values)
    assert torch.equal(dest[..., 0], values)


def test_weights_are_drawn_at_init_scale_so_deep_graphs_stay_finite() -> None:
    from compiler.lowering.tracing import trace_training
    from compiler.wire.inputs import weight_scales

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(24)]).to(torch.bfloat16)
    fwd, bwd, fwd_in, bwd_in = trace_training(model, [torch.randn(32, 256, dtype=torch.bfloat16)])
    for gm, ins in ((fwd, fwd_in), (bwd, bwd_in)):
        graph = from_wire(to_wire(gm, ins))
        scales = weight_scales(graph)  # 1/sqrt(256) for the weights (backward: also dY, 1/sqrt(32))
        assert sum(abs(s - 1 / 16) < 1e-9 for s in scales.values()) >= 23
        outputs = [o for o in graph.to_fx()(*random_inputs(graph, seed=1))
                   if isinstance(o, torch.Tensor) and o.is_floating_point()]
        # Standard normal weights would grow each layer by 16x: 16**24 overflows bf16.
        assert all(torch.isfinite(o).all() and float(o.float().abs().max()) < 1e4 for o in outputs)
