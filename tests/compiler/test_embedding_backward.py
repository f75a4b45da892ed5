"""An embedding's backward as kiln's library call (`compiler/runtime/library_calls.py`):
the compact algorithm against ATen's at a vocabulary's size, when it applies, and a built
graph's ATen call running it."""

from __future__ import annotations

import pytest
import torch

import compiler
from compiler.runtime.execution import Call
from compiler.runtime.library_calls import compact_applies, compact_embedding_backward
from tests.compiler.oputil import rand

aten = torch.ops.aten
CUDA = torch.device("cuda")


def _tokens(shape: tuple[int, ...], vocab: int, seed: int = 0) -> torch.Tensor:
    """Token ids as text has them: a few very frequent (hundreds of repeats), most rare."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.rand(shape, generator=g).pow(4) * vocab
    return ranks.long().clamp(max=vocab - 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_gpt2_vocabulary_gradient_matches_atens(dtype: torch.dtype) -> None:
    vocab, width = 50257, 768
    ids = _tokens((8, 512), vocab)
    assert torch.bincount(ids.flatten()).max() > 100, "repeats are what the sums are about"
    grad = rand((8, 512, width), dtype, seed=1)
    exact = aten.embedding_dense_backward(grad.double(), ids, vocab, -1, False)
    got = compact_embedding_backward(grad, ids, vocab, -1)
    assert got.dtype == dtype and got.shape == (vocab, width) and got.is_contiguous()
    untouched = torch.ones(vocab, dtype=torch.bool)
    untouched[ids.flatten()] = False
    assert not got[untouched].any()
    # summed in float32 and rounded once to the table's dtype: within that rounding of the
    # exact sums (ATen's CPU kernel sums bf16 in bf16, 3.0 off on the most frequent row)
    tol = (1e-3, 2 ** -8) if dtype == torch.bfloat16 else (1e-4, 1e-6)
    torch.testing.assert_close(got.double(), exact, atol=tol[0], rtol=tol[1])


def test_padding_rows_stay_zero_and_int32_ids_work() -> None:
    ids = torch.tensor([[3, 0, 3, 7], [0, 0, 5, 3]], dtype=torch.int32)
    grad = rand((2, 4, 16), seed=2)
    want = aten.embedding_dense_backward(grad, ids, 10, 0, False)
    got = compact_embedding_backward(grad, ids, 10, 0)
    assert not got[0].any()
    torch.testing.assert_close(got, want)


def test_no_indices_give_a_zero_table() -> None:
    grad = torch.empty((0, 8))
    got = compact_embedding_backward(grad, torch.empty((0,), dtype=torch.long), 5, -1)
    assert got.shape == (5, 8) and not got.any()


def test_the_compact_algorithm_applies_to_a_vocabulary_of_few_tokens_on_cuda_only() -> None:
    assert compact_applies(CUDA, 4096, 50257, 768, False), "GPT-2 at 8 x 512 tokens"
    assert not compact_applies(torch.device("cpu"), 4096, 50257, 768, False)
    assert not compact_applies(CUDA, 4096, 1024, 768, False), "positions: ATen's sort is cheap"
    assert not compact_applies(CUDA, 8192, 128256, 4096, False), "Llama-sized: too many passes"
    assert not compact_applies(CUDA, 4096, 50257, 768, True), "scale_grad_by_freq"
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not compact_applies(CUDA, 4096, 50257, 768, False), "atomic sums vary run to run"
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_built_graphs_embedding_backward_runs_the_library_call() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def backward(grad: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return aten.embedding_dense_backward(grad, ids, 100, -1, False)

    grad, ids = rand((4, 8, 32), seed=3), _tokens((4, 8), 100, seed=4)
    built = compiler.build(make_fx(backward)(grad, ids), None, [grad, ids])
    calls = [s for s in built._execs if isinstance(s, Call)]
    assert [repr(c.target) for c in calls] == ["kiln.embedding_dense_backward"]
    assert "kiln.embedding_dense_backward" in built.launcher_source()
    torch.testing.assert_close(built(grad, ids), backward(grad, ids))
