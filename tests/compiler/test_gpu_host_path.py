"""On a CUDA device: the host path of issue 13. Kernels launched through their compiled
kernels' launchers match the JIT path; training through the kiln backend with CUDA graphs
(outputs left in the graphs' memory, saved activations read in place) gives eager's losses
and gradients, also when a caller keeps every loss and gradient of every step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import compiler
from tests.compiler.oputil import assert_matches, trace

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = F.gelu(x @ w1)
    return torch.softmax(h @ w2, -1), h.sum(0)


def test_direct_launches_match_and_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CUDA_GRAPHS", "0")
    torch.manual_seed(0)
    xs = [torch.randn(96, 64, device="cuda"), torch.randn(64, 128, device="cuda"),
          torch.randn(128, 32, device="cuda")]
    built = compiler.build(trace(_mlp, *xs), None, xs)
    want = _mlp(*xs)
    device = xs[0].device
    assert_matches(built(*xs), want, (1e-3, 1e-3))  # recorded through the JIT
    assert built._launcher.modes[device] == "direct"
    for _ in range(3):
        assert_matches(built(*xs), want, (1e-3, 1e-3))
    assert built._launcher._fns[device].__name__ == "run"  # past the trial call
    odd = torch.empty(96 * 64 + 1, device="cuda")[1:].view(96, 64).copy_(xs[0])
    assert_matches(built(odd, xs[1], xs[2]), want, (1e-3, 1e-3))  # misaligned: the JIT


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def _train(model: nn.Module, steps: int, keep: bool, set_to_none: bool) -> tuple[list, list]:
    torch.manual_seed(1)
    xs = [torch.randn(8, 64, 128, device="cuda") for _ in range(steps)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], []
    for x in xs:
        opt.zero_grad(set_to_none=set_to_none)
        out = model(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        if keep:  # a caller that keeps every output and every gradient tensor
            losses.append(loss)
            grads.append([p.grad for p in model.parameters()])
        else:
            losses.append(loss.detach().clone())
            grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return losses, grads


@pytest.mark.parametrize(("keep", "set_to_none"), [(False, True), (True, True), (True, False)])
def test_training_with_cuda_graphs_matches_eager(keep: bool, set_to_none: bool,
                                                 tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kiln
    from kiln import session

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "schedules"))
    kiln.configure(url=None)
    torch._dynamo.reset()
    session.shutdown()
    try:
        torch.manual_seed(0)
        eager = Block(128).cuda()
        compiled = Block(128).cuda()
        compiled.load_state_dict(eager.state_dict())
        want_losses, want_grads = _train(eager, 8, keep, set_to_none)
        got_losses, got_grads = _train(torch.compile(compiled, backend=kiln.remote_compile), 8, keep,
                                       set_to_none)
        for got, want in zip(got_losses, want_losses, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for got_step, want_step in zip(got_grads, want_grads, strict=True):
            for got, want in zip(got_step, want_step, strict=True):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
        graphs = {g.kind: g for g in session.compiled_graphs()}
        assert set(graphs) == {"forward", "backward"}
        for g in graphs.values():
            assert g.level == "heuristic", g
            runner = g.built._graphs
            assert runner is not None and not runner.failed and runner.replays > 0, vars(runner)
    finally:
        session.shutdown()
        kiln.configure(reset=True)
        torch._dynamo.reset()


def _weighted(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    total = sum(x * (i + 1) for i, x in enumerate(xs))
    return torch.relu(total), total.sum(-1)


def test_precompiled_kernels_launch_through_the_static_launcher(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Where Triton builds a C launcher per kernel signature (3.6), precompiled kernels
    launch through torch's static launcher instead: none is built, and a kernel with many
    arguments (14 inputs, ragged sizes) gives eager's results through the JIT's first call,
    the direct launches after it and a CUDA graph."""
    from compiler.runtime import static_launch

    if not static_launch.available():
        pytest.skip("this Triton launches every kernel with one launcher")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    xs = [torch.randn(333, 77, device="cuda") for _ in range(14)]
    built = compiler.build(trace(_weighted, *xs), None, xs)
    assert built.precompile("cuda") == len(built.launches()) > 0
    device = torch.cuda.current_device()
    loaded = [k for info in built.launches() for k in info.fn.device_caches[device][0].values()]
    assert loaded and all(isinstance(k._run, static_launch.StaticLauncher) for k in loaded)
    want = _weighted(*xs)
    for _ in range(4):  # JIT (record), direct, CUDA graph capture, replay
        assert_matches(built(*xs), want, (1e-4, 1e-4))
    assert not [p.name for p in tmp_path.rglob("*") if "launcher" in p.name]


def test_a_fresh_process_loads_and_launches_kernels_without_the_c_compiler(tmp_path) -> None:
    """On an empty Triton cache, a fresh process whose kernels come compiled (here by the
    compile workers; on a service hit, from the service) builds no shared library at all
    where kernels launch through torch's static launcher: neither a launcher per signature
    nor Triton's driver utility module (`static_launch.lazy_driver`)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "KILN_KERNEL_DIR": str(tmp_path / "kernels"), "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-m", "tests.compiler.fresh_load_gpu"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"]
    if not result["static"]:
        pytest.skip("this Triton launches every kernel with one launcher")
    assert result["launchers"] == ["StaticLauncher"]
    assert result["libraries"] == []
