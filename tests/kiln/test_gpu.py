"""GPU twins of the local backend tests: training through kiln on CUDA matches eager.
Skipped without CUDA; the CPU twins (Triton interpreter) are in test_backend_local.py."""

from __future__ import annotations

import copy

import pytest
import torch

import kiln
from examples.models import GPT, GPTConfig, gpt_batches, train
from kiln import session
from tests.kiln.helpers import (
    ConvBN,
    assert_close_losses,
    assert_same_step,
    fresh_process,
    step_outputs,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kiln_state"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt_trains_on_cuda_through_kiln_like_eager(dtype):
    kiln.configure(url=None)
    cfg = GPTConfig(vocab=256, seq=64, d=128, heads=4, layers=2)
    batches = gpt_batches(cfg, batch=4, steps=5, device="cuda")
    losses = {}
    for name in ("eager", "kiln"):
        torch.manual_seed(0)
        model = GPT(cfg).to("cuda", dtype)
        fn = torch.compile(model, backend=kiln.remote_compile) if name == "kiln" else model
        losses[name] = train(fn, batches)  # the compiled module shares model's parameters
    assert_close_losses(losses["kiln"], losses["eager"],
                        rtol=1e-3 if dtype == torch.float32 else 3e-2)
    graphs = session.compiled_graphs()
    assert {g.kind for g in graphs} == {"forward", "backward"}
    assert all(g.level == "heuristic" and g.target.device_type == "cuda" for g in graphs)


def test_background_compile_on_cuda_trains_like_eager():
    """KILN_BACKGROUND=1: eager steps, then kiln's kernels, all matching eager."""
    kiln.configure(url=None, background=True)
    cfg = GPTConfig(vocab=256, seq=64, d=128, heads=4, layers=1)
    batches = gpt_batches(cfg, batch=4, steps=6, device="cuda")
    losses = {}
    for name in ("eager", "kiln"):
        torch.manual_seed(0)
        model = GPT(cfg).to("cuda")
        fn = torch.compile(model, backend=kiln.remote_compile) if name == "kiln" else model
        losses[name] = train(fn, batches[:3])
        if name == "kiln":
            assert kiln.wait_compiled(300)
            assert {g.level for g in session.compiled_graphs()} == {"heuristic"}
        losses[name] += train(fn, batches[3:])  # on kiln's kernels for the kiln model
    assert_close_losses(losses["kiln"], losses["eager"], rtol=1e-3)



def test_a_planned_training_step_on_cuda_matches_eager():
    """A second compile (fresh dynamo) runs from the plan the first stored: no AOTAutograd,
    the backward built on its own thread, the same outputs, gradients and statistics."""
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ConvBN().cuda(), torch.randn(4, 3, 16, 16, device="cuda")
    want = step_outputs(copy.deepcopy(model), x, compiled=False)
    for planned in (False, True):
        fresh_process()
        assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want, tol=1e-4)
        assert kiln.stats().get("plans_used", 0) == int(planned)
    assert "seconds:aot" not in kiln.stats()
