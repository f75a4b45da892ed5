"""The corpus, the decomposition table and the tracing helpers that produce it."""

from __future__ import annotations

import torch

from compiler import decompositions
from compiler.lowering.tracing import trace_inference, trace_training
from tests.corpus import KINDS, case, case_names, corpus

aten = torch.ops.aten


def _ops(name: str) -> set[str]:
    return {str(n.target) for n in case(name).gm.graph.nodes if n.op == "call_function"}


def test_corpus_has_every_model_in_every_kind() -> None:
    cases = corpus()
    assert [c.name for c in cases] == case_names()
    assert {c.kind for c in cases} == set(KINDS)
    assert len(cases) == 15


def test_table_breaks_up_norms_softmax_gelu_and_losses() -> None:
    table = decompositions()
    for op in (aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
               aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
               aten._log_softmax_backward_data.default, aten.gelu.default, aten.gelu_backward.default,
               aten.native_batch_norm.default, aten._native_batch_norm_legit_functional.default,
               aten._native_batch_norm_legit_no_training.default, aten.native_batch_norm_backward.default,
               aten.nll_loss_forward.default, aten.nll_loss_backward.default):
        assert op in table, op
    for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
               aten.convolution_backward.default, aten.scaled_dot_product_attention.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default,
               aten.embedding_dense_backward.default):
        assert op not in table, op
    table.clear()  # callers get their own copy
    assert decompositions()


def test_traced_graphs_hold_fusable_ops_and_keep_library_calls_whole() -> None:
    broken_up = {"aten.native_layer_norm.default", "aten._softmax.default", "aten.gelu.default",
                 "aten.native_batch_norm.default", "aten._native_batch_norm_legit_functional.default",
                 "aten._native_batch_norm_legit_no_training.default", "aten.nll_loss_forward.default",
                 "aten._log_softmax.default", "aten.native_layer_norm_backward.default",
                 "aten.gelu_backward.default", "aten.native_batch_norm_backward.default"}
    for c in corpus():
        assert not broken_up & _ops(c.name), c.name
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in _ops("gpt_block.fwd")
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in _ops("gpt_block.train_bwd")
    assert "aten.convolution_backward.default" in _ops("convnet.train_bwd")
    assert "aten.embedding_dense_backward.default" in _ops("embedding_ce.train_bwd")
    assert "aten.var_mean.correction" in _ops("gpt_block.fwd")  # layer norm, decomposed


def test_training_forward_carries_random_ops_and_inference_does_not() -> None:
    assert "aten.native_dropout.default" in _ops("gpt_block.train_fwd")
    assert "aten.native_dropout.default" not in _ops("gpt_block.fwd")


def test_captured_inputs_match_placeholders_and_run() -> None:
    for c in corpus():
        placeholders = [n for n in c.gm.graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == len(c.example_inputs), c.name
        assert all(isinstance(t, torch.Tensor) for t in c.example_inputs), c.name
        c.gm(*c.example_inputs)


def test_backward_graph_computes_parameter_gradients() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    x = torch.randn(2, 4)
    _, bwd_gm, _, bwd_inputs = trace_training(model, [x])
    grads = [g for g in bwd_gm(*bwd_inputs) if g is not None]
    model(x).backward(torch.ones(2, 3))
    expected = [model[0].weight.grad, model[0].bias.grad]
    assert len(grads) == 2
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_trace_inference_takes_plain_functions() -> None:
    gm, inputs = trace_inference(lambda a, b: torch.softmax(a @ b, dim=-1), [torch.randn(2, 3), torch.randn(3, 4)])
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in ops and "aten.amax.default" in ops and "aten._softmax.default" not in ops
    assert len(inputs) == 2
