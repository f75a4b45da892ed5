"""Plans (kiln.plans): a dynamo graph that AOTAutograd split once runs, in the next process,
without AOTAutograd, and exactly as it did through it: outputs, gradients, mutated buffers."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from torch import nn

import compiler
import kiln
from kiln import backend, plans, session
from kiln.cache import PlanCache
from tests.kiln.helpers import ConvBN, assert_same_step, causes, fresh_process, step_outputs

pytestmark = pytest.mark.usefixtures("kiln_state")


class ReturnsAView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc(x), x.view(-1)  # an output aliasing an input: AOTAutograd's runtime


class ReturnsAComputedView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x).relu()
        return y.flatten(1), y.sum()  # a view of a value the graph computed, and a new value


class Attention(nn.Module):
    """One causal self-attention head over a (batch, sequence, 8) input."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.sum(-1), out.mean()


def _plan_files(kiln_state: dict) -> list:
    return list(PlanCache(kiln_state["cache_dir"] / "plans").scan())


def test_a_planned_training_step_skips_aotautograd_and_matches_eager(kiln_state):
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ConvBN(), torch.randn(2, 3, 10, 10)
    want = step_outputs(copy.deepcopy(model), x, compiled=False)

    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    assert kiln.stats()["seconds:aot"] > 0 and len(_plan_files(kiln_state)) == 1

    fresh_process()
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    stats = kiln.stats()
    assert stats["plans_used"] == 1 and "seconds:aot" not in stats  # AOTAutograd never ran
    kinds = sorted(g.kind for g in session.compiled_graphs())
    assert kinds == ["backward", "forward"]
    assert all(g.level == "heuristic" for g in session.compiled_graphs())
    assert stats["schedules_cached"] == 2  # the planned graphs are the same graphs


def test_a_planned_inference_graph_matches_eager():
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ConvBN().eval(), torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        want = model(x)
        for _ in range(2):
            fresh_process()
            got = torch.compile(model, backend="kiln")(x)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert kiln.stats()["plans_used"] == 1


def test_a_graph_whose_output_aliases_an_input_gets_no_plan(kiln_state):
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ReturnsAView(), torch.randn(2, 4)
    want = model(x)
    for _ in range(2):
        fresh_process()
        got = torch.compile(model, backend="kiln")(x)
        assert got[1]._base is x  # still the view AOTAutograd's runtime makes
        torch.testing.assert_close(got[0], want[0])
    assert not _plan_files(kiln_state) and "plans_used" not in kiln.stats()


def _recorded(kiln_state: dict) -> tuple[nn.Module, torch.Tensor, dict, Any]:
    """ConvBN, its input, eager's step, and the plan file one compiled step recorded."""
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ConvBN(), torch.randn(2, 3, 10, 10)
    want = step_outputs(copy.deepcopy(model), x, compiled=False)
    step_outputs(copy.deepcopy(model), x, compiled=True)
    (entry,) = _plan_files(kiln_state)
    return model, x, want, entry


def test_an_output_viewing_a_computed_value_is_planned_and_handed_out_on_its_own(kiln_state):
    """AOTAutograd hands such an output out through `aten._unsafe_view` (a tensor of its
    own, so that changing it in place later is no view's business); a plan does the same."""
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = ReturnsAComputedView(), torch.randn(2, 3, 4)
    want = step_outputs(copy.deepcopy(model), x, compiled=False)
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    (entry,) = _plan_files(kiln_state)
    doc = json.loads(entry.path.read_text())
    assert doc["outputs"] == [{"requires_grad": True, "unsafe_view": True}, {"requires_grad": True}]

    fresh_process()
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    assert kiln.stats()["plans_used"] == 1
    out, _ = torch.compile(copy.deepcopy(model), backend=backend.remote_compile)(x)
    assert out._base is None
    out.mul_(2).sum().backward()  # in place on the output, then through the plan's backward

    fresh_process()  # an inference plan: no autograd.Function stands between
    with torch.no_grad():
        compiled = torch.compile(copy.deepcopy(model), backend=backend.remote_compile)
        assert compiled(x)[0]._base is None  # recorded
        fresh_process()
        compiled = torch.compile(copy.deepcopy(model), backend=backend.remote_compile)
        assert compiled(x)[0]._base is None and kiln.stats()["plans_used"] == 1  # planned


def test_a_plan_that_does_not_fit_the_graph_is_refused_and_aotautograd_runs(kiln_state):
    model, x, want, entry = _recorded(kiln_state)
    doc = json.loads(entry.path.read_text())
    outputs = doc["forward"]["outputs"]  # the buffers' 3 new values, then the 2 outputs
    outputs[3], outputs[4] = outputs[4], outputs[3]  # still a plan, not this graph's
    entry.path.write_text(json.dumps(doc))

    fresh_process()
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    stats = kiln.stats()
    assert stats["plans_refused"] == 1 and stats["seconds:aot"] > 0


def test_a_corrupt_plan_file_is_ignored_and_replaced(kiln_state):
    model, x, want, entry = _recorded(kiln_state)
    entry.path.write_text(entry.path.read_text()[:500])

    fresh_process()
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    assert "plans_used" not in kiln.stats()
    fresh_process()
    step_outputs(copy.deepcopy(model), x, compiled=True)
    assert kiln.stats()["plans_used"] == 1  # the second compile stored a good one


def test_plans_off_records_and_uses_none(kiln_state):
    kiln.configure(url=None, plans=False)
    torch.manual_seed(0)
    model, x = ConvBN(), torch.randn(2, 3, 10, 10)
    for _ in range(2):
        fresh_process()
        step_outputs(copy.deepcopy(model), x, compiled=True)
    assert not _plan_files(kiln_state) and "plans_used" not in kiln.stats()


def test_a_stored_plan_runs_eagerly_on_the_cpu_without_the_interpreter(
        kiln_state, monkeypatch, kiln_warnings):
    """A plan recorded by an interpreter run must not make a later run without
    TRITON_INTERPRET=1 build CPU kernels that Triton cannot run there: the planned path
    takes the same device check as AOTAutograd's (`kiln [cpu_eager]`, eager, same step)."""
    model, x, want, _ = _recorded(kiln_state)
    fresh_process()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not compiler.runs_on_cpu()
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    stats = kiln.stats()
    assert causes(kiln_warnings) == {"cpu_eager": 1}
    assert "plans_used" not in stats and stats.get("builds", 0) == 0


def _dynamo_graph(model: nn.Module, *inputs: torch.Tensor) -> tuple[torch.fx.GraphModule, list]:
    captured = []

    def keep(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=keep)(*inputs)
    return captured[0]


def test_the_plan_key_follows_the_graph_its_inputs_and_grad_mode():
    torch.manual_seed(0)
    model = ConvBN()
    key = plans.plan_key(*_dynamo_graph(model, torch.randn(2, 3, 10, 10)))
    assert key == plans.plan_key(*_dynamo_graph(copy.deepcopy(model), torch.randn(2, 3, 10, 10)))
    assert key != plans.plan_key(*_dynamo_graph(model, torch.randn(4, 3, 10, 10)))
    gm, inputs = _dynamo_graph(model, torch.randn(2, 3, 10, 10))
    with torch.no_grad():
        assert plans.plan_key(gm, inputs) != key
    frozen = copy.deepcopy(model).requires_grad_(False)
    assert plans.plan_key(*_dynamo_graph(frozen, torch.randn(2, 3, 10, 10))) != key


def test_a_plan_follows_the_attention_kernels_torch_may_use(kiln_state):
    """AOTAutograd's graph holds the attention kernel torch picked (flash here) or the math
    decomposition: a plan recorded with flash attention must not run where it is disabled."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 6, 8)
    want = step_outputs(copy.deepcopy(model), x, compiled=False)
    assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
    assert len(_plan_files(kiln_state)) == 1

    fresh_process()
    with sdpa_kernel([SDPBackend.MATH]):
        want = step_outputs(copy.deepcopy(model), x, compiled=False)
        assert_same_step(step_outputs(copy.deepcopy(model), x, compiled=True), want)
        ops = {str(n.target) for g in session.compiled_graphs() for n in g.gm.graph.nodes}
    stats = kiln.stats()
    assert "plans_used" not in stats and stats["seconds:aot"] > 0  # traced again, for math
    assert not any("flash" in op for op in ops)
    assert len(_plan_files(kiln_state)) == 2


def test_a_graph_calling_an_unnamed_function_has_no_key():
    gm, inputs = _dynamo_graph(nn.Linear(3, 3), torch.randn(2, 3))
    output = gm.graph.output_node()
    with gm.graph.inserting_before(output):
        extra = gm.graph.call_function(lambda t: t, (output.args[0][0],))
    output.args = ((extra,),)
    with pytest.raises(plans.NotPlannable, match="no stable name"):
        plans.plan_key(gm, inputs)


def test_parse_plan_refuses_what_does_not_fit_its_graphs(kiln_state):
    from compiler.wire.plan import PlanError, parse_plan

    *_, entry = _recorded(kiln_state)
    good = json.loads(entry.path.read_text())
    assert parse_plan(good).mutated_inputs  # batch norm's running statistics

    def broken(change) -> str:
        doc = copy.deepcopy(good)
        change(doc)
        with pytest.raises(PlanError) as err:
            parse_plan(doc)
        return str(err.value)

    def swap_buffer_values(doc):  # num_batches_tracked gets the running mean's value
        doc["forward"]["outputs"][:2] = doc["forward"]["outputs"][1::-1]

    assert "new value of input" in broken(swap_buffer_values)
    assert "returns" in broken(lambda d: d["backward"]["outputs"].pop())
    assert "needs its backward" in broken(lambda d: d.update(backward=None))
    assert "unknown fields" in broken(lambda d: d.update(extra=1))
    assert "inputs" in broken(lambda d: d.update(inputs=d["inputs"] + 1))
    assert "mutated_inputs" in broken(lambda d: d.update(mutated_inputs=[2, 1]))
    assert "outputs" in broken(lambda d: d["outputs"][0].update(unsafe_view=False))
    assert "outputs" in broken(lambda d: d["outputs"][0].update(view=True))


def test_inputs_sharing_storage_are_planned_unless_one_is_mutated(kiln_state):
    kiln.configure(url=None)

    def scale(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b.sum()

    def bump(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.add_(1)  # AOTAutograd replays this on the shared base: no plan
        return b * 2

    for fn, planned in ((scale, True), (bump, False)):
        kiln.degrade.reset()
        for _ in range(2):
            torch._dynamo.reset()
            base, want_base = torch.arange(8.0), torch.arange(8.0)
            got = torch.compile(fn, backend="kiln")(base[:4], base[4:])
            want = fn(want_base[:4], want_base[4:])
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(base, want_base)
        assert kiln.stats().get("plans_used", 0) == int(planned), fn.__name__


class FrozenWithABreak(nn.Module):
    """A frozen layer (its backward returns None for its parameters), then a graph break:
    two dynamo graphs, two plans."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.frozen(x))
        torch._dynamo.graph_break()
        return self.head(y) * x[:, :4]


def test_frozen_parameters_input_gradients_and_graph_breaks_run_from_plans():
    kiln.configure(url=None)
    torch.manual_seed(0)
    model, x0 = FrozenWithABreak(), torch.randn(4, 8)

    def step(compiled: bool) -> list[torch.Tensor]:
        m, x = copy.deepcopy(model), x0.clone().requires_grad_()
        fn = torch.compile(m, backend="kiln") if compiled else m
        out = fn(x)
        out.square().sum().backward()
        assert m.frozen.weight.grad is None
        return [out.detach(), x.grad, m.head.weight.grad, m.head.bias.grad]

    want = step(compiled=False)
    for planned in (0, 2):
        fresh_process()
        for a, b in zip(step(compiled=True), want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert kiln.stats().get("plans_used", 0) == planned
