"""Client graphs against the code kiln generates: fx source (`Graph.to_fx`), Triton source
(`compiler.build`), and the kernel files written under KILN_KERNEL_DIR.

Every hostile value is either refused by `from_wire` with a WireError, or provably inert:
it appears in generated Python only as a string literal, never in Triton source, never in a
file name.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import compiler
from compiler import WireError
from tests.security.conftest import MARKER, PAYLOAD, graph, inp, node, relu_graph, tensor

HOSTILE_NAMES = [PAYLOAD, "a\nb", "a'b", 'a"b', "../../etc/passwd", "a b", "a.b", "a-b",
                 "a;b", "1a", "", "é", "a" * 129, "x\x00"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("where", ["input", "node", "constant"])
def test_hostile_names_are_refused(name: str, where: str) -> None:
    doc = relu_graph()
    if where == "input":
        doc["inputs"][0]["name"] = name
        doc["nodes"][0]["args"] = [{"ref": name}]
    elif where == "node":
        doc["nodes"][0]["name"] = name
        doc["outputs"] = [{"ref": name}]
    else:
        doc["constants"] = [{"name": name, "dtype": "float32", "shape": [1], "data": [1.0]}]
    with pytest.raises(WireError, match="name"):
        compiler.from_wire(doc)


@pytest.mark.parametrize("key", [PAYLOAD, "a\nb", "alpha=1)#", "from", "self)#", "**x"])
def test_hostile_kwarg_names_are_refused(key: str) -> None:
    doc = graph([node("y", "aten.add.Tensor", [{"ref": "x"}, {"ref": "x"}], {key: 1})])
    with pytest.raises(WireError, match="node 'y'"):
        compiler.from_wire(doc)


def test_python_keyword_kwarg_is_refused_before_fx_writes_it() -> None:
    # `from` is a real argument name (aten.uniform); fx would write `from = 0.0` into the
    # forward's source, a SyntaxError in every worker that rebuilds the graph.
    doc = graph([node("u", "aten.uniform.default", [{"ref": "x"}], {"from": 0.0, "to": 1.0})])
    with pytest.raises(WireError, match="Python keyword"):
        compiler.from_wire(doc)
    # Positionally the same call travels and rebuilds.
    doc = graph([node("u", "aten.uniform.default", [{"ref": "x"}, 0.0, 1.0])])
    assert "uniform" in compiler.from_wire(doc).to_fx().code


@pytest.mark.parametrize("value", [
    {"dtype": "float32; import os"}, {"dtype": "torch.float32"}, {"device": "cuda:0"},
    {"device": f"cpu{PAYLOAD}"}, {"layout": PAYLOAD}, {"memory_format": "__class__"},
    {"float": "1e5"}, {"float": PAYLOAD}, {"__class__": "x"}, {"ref": PAYLOAD},
    {"dtype": "float32", "ref": "x"}, {"ref": "x", "extra": 1},
])
def test_hostile_tagged_values_are_refused(value: Any) -> None:
    doc = graph([node("y", "aten.add.Tensor", [{"ref": "x"}, value])])
    with pytest.raises(WireError, match="node 'y'"):
        compiler.from_wire(doc)


def test_hostile_op_names_are_refused() -> None:
    for op in [PAYLOAD, "aten.add.Tensor\n", "builtins.eval.default", "os.system.default",
               "aten.__class__.default", "aten.add.__init__", "aten._print.default",
               "aten.save.default", "aten.from_file.default", "operator.getitem ", "torch.ops.aten.add"]:
        doc = graph([node("y", op, [{"ref": "x"}, {"ref": "x"}])])
        with pytest.raises(WireError, match="node 'y'"):
            compiler.from_wire(doc)


def test_string_argument_outside_the_ops_choices_is_refused() -> None:
    doc = graph([node("y", "aten.div.Tensor_mode", [{"ref": "x"}, {"ref": "x"}],
                      {"rounding_mode": PAYLOAD})])
    with pytest.raises(WireError, match="rounding_mode"):
        compiler.from_wire(doc)


@pytest.mark.parametrize("text", ["ok\n2026-01-01 00:00:00 CRITICAL forged record", "a\rb",
                                  "\x1b[2Jclear", "nul\x00", "line\u2028sep", "bidi\u202egnp.exe"])
def test_string_arguments_with_control_characters_are_refused(text: str) -> None:
    # aten._assert_async.msg echoes its message in the RuntimeError a failing graph raises,
    # which workers log and store: no string may carry a line break or a terminal escape.
    doc = _assert_graph(text)
    with pytest.raises(WireError, match="non-printable"):
        compiler.from_wire(doc)
    # The reason quotes the character; the error message itself stays one printable line.
    try:
        compiler.from_wire(doc)
    except WireError as exc:
        assert str(exc).isprintable()


def _assert_graph(message: str) -> dict[str, Any]:
    """relu(x), guarded by an assertion that holds (no element equals 12345) with `message`."""
    return graph([
        node("e", "aten.eq.Scalar", [{"ref": "x"}, 12345.0], meta=tensor("bool")),
        node("a", "aten.any.default", [{"ref": "e"}], meta=tensor("bool", ())),
        node("n", "aten.logical_not.default", [{"ref": "a"}], meta=tensor("bool", ())),
        node("s", "aten._assert_async.msg", [{"ref": "n"}, message], meta=None),
        node("y", "aten.relu.default", [{"ref": "x"}]),
    ])


def _names_called(code: str) -> set[str]:
    tree = ast.parse(code)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_printable_string_payload_is_inert_in_fx_triton_and_kernel_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_KERNEL_DIR", str(tmp_path / "kernels"))
    graph_ = compiler.from_wire(_assert_graph(PAYLOAD))
    gm = graph_.to_fx()
    # fx source: the payload is one string constant; no name it mentions is ever referenced.
    constants = [n.value for n in ast.walk(ast.parse(gm.code)) if isinstance(n, ast.Constant)]
    assert PAYLOAD in constants
    assert not {"__import__", "system", "os"} & _names_called(gm.code)
    x = torch.randn(4)
    torch.testing.assert_close(gm(x)[0], torch.relu(x))
    # Triton: kiln generated and ran its own code; the payload is nowhere in it.
    built = compiler.build(graph_)
    torch.testing.assert_close(built(x)[0], torch.relu(x))
    assert built.kernels
    # Python's bytecode cache of an imported kernel (unless PYTHONDONTWRITEBYTECODE is set)
    # is made from the kernel file itself; the rest are kiln's own files.
    files = sorted(f for f in (tmp_path / "kernels").rglob("*") if "__pycache__" not in f.parts)
    sources = [k.source for k in built.kernels] + [f.read_text() for f in files if f.is_file()]
    for text in sources:
        assert "__import__" not in text and str(MARKER) not in text and "system" not in text
    # Kernel files are content-addressed: <2 hex>/kiln_<sha256 of the source>.py, nothing else.
    for f in files:
        if f.is_dir():
            assert re.fullmatch(r"[0-9a-f]{2}", f.name)
            continue
        digest = hashlib.sha256(f.read_text().encode()).hexdigest()
        assert f.name == f"kiln_{digest}.py" and f.parent.name == digest[:2]
        assert f.resolve().is_relative_to((tmp_path / "kernels").resolve())
    for cached in (tmp_path / "kernels").rglob("__pycache__/*"):
        assert (cached.parent.parent / f"{cached.name.split('.')[0]}.py") in files


@pytest.mark.parametrize("value", [
    -0.0, 5e-324, 1e-45, 1.7976931348623157e308, 2.5e-308, 0.1,
    {"float": "nan"}, {"float": "-inf"}, {"float": "inf"},
])
def test_unusual_float_scalars_become_exact_triton_literals(
        value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_KERNEL_DIR", str(tmp_path))
    g = compiler.from_wire(graph([node("y", "aten.mul.Tensor", [{"ref": "x"}, value])]))
    built = compiler.build(g)
    (kernel,) = built.kernels
    # Only kiln's own vocabulary: no dict repr, no tag text, no bare nan/inf names.
    assert "{" not in kernel.source and "'float'" not in kernel.source
    assert not re.search(r"(?<![\"\w])(nan|inf)(?![\"\w])", kernel.source)
    x = torch.tensor([1.5, -2.0, 0.0, 3e38])
    want, got = g.to_fx()(x)[0], built(x)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got), torch.signbit(want)) or math.isnan(float(want[0]))


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 1234567890123456789012345678901234567890])
def test_integers_beyond_int64_are_refused_with_a_short_message(value: int) -> None:
    doc = graph([node("y", "aten.add.Tensor", [{"ref": "x"}, value])])
    with pytest.raises(WireError, match="does not fit in int64") as info:
        compiler.from_wire(doc)
    assert len(str(info.value)) < 120
    if value.bit_length() > 64:
        assert str(value) not in str(info.value)  # a 40-digit literal is not echoed back


def test_bare_nan_and_repeated_keys_in_graph_text_are_refused() -> None:
    text = '{"format": "kiln.graph/1", "inputs": [], "nodes": [], "outputs": [NaN]}'
    with pytest.raises(WireError, match="bare NaN"):
        compiler.from_wire(text)
    text = '{"format": "kiln.graph/1", "format": "kiln.graph/1", "inputs": [], "nodes": [], "outputs": []}'
    with pytest.raises(WireError, match="repeats a key"):
        compiler.from_wire(text)


@pytest.mark.parametrize("value", [2**40, 1e300])
def test_out_of_range_fill_value_never_reaches_triton_source(
        value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_KERNEL_DIR", str(tmp_path))
    doc = graph([node("y", "aten.full.default", [[4], value],
                      {"dtype": {"dtype": "int32"}, "device": {"device": "cpu"}},
                      meta=tensor("int32"))], inputs=[])
    try:
        built = compiler.build(compiler.from_wire(doc))
    except ValueError:
        return  # refused with a clear error: fine
    for kernel in built.kernels:
        assert not re.search(r"\d{11,}", kernel.source), kernel.source


def test_input_metadata_never_reaches_code_as_text() -> None:
    # dtype strings are looked up in a fixed table; anything else is refused
    for dtype in ["float32)", "torch.float32", "float", PAYLOAD, "qint8"]:
        doc = relu_graph()
        doc["inputs"] = [inp(dtype="float32")]
        doc["inputs"][0]["dtype"] = dtype
        with pytest.raises(WireError):
            compiler.from_wire(doc)



def _scaled_graph(factor: float) -> dict[str, Any]:
    return graph([node("y", "aten.mul.Tensor", [{"ref": "x"}, factor])])


def _plant(tmp_path: Path, built: Any, flag: Path) -> Path:
    """Append a payload to the kernel file `build` wrote, keeping its content-addressed name."""
    kernel = built.kernels[0]
    path = tmp_path / "k" / kernel.source_hash[:2] / f"kiln_{kernel.source_hash}.py"
    assert path.read_text() == kernel.source
    path.write_text(kernel.source + f"\nopen({str(flag)!r}, 'w').close()\n")
    return path


def test_build_rewrites_a_tampered_kernel_file_before_importing_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from compiler.runtime import built as runtime

    monkeypatch.setenv("KILN_KERNEL_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(runtime, "_MODULES", {})  # force a fresh import from disk
    g = compiler.from_wire(_scaled_graph(3.25))
    flag = tmp_path / "tampered-file-ran"
    path = _plant(tmp_path, compiler.build(g), flag)
    monkeypatch.setattr(runtime, "_MODULES", {})
    built = compiler.build(g)
    assert not flag.exists()
    assert path.read_text() == built.kernels[0].source


def test_aot_does_not_import_a_tampered_kernel_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from compiler.aot import target as aot_target
    from compiler.runtime import built as runtime

    monkeypatch.setenv("KILN_KERNEL_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(runtime, "_MODULES", {})
    built = compiler.build(compiler.from_wire(_scaled_graph(4.75)))
    flag = tmp_path / "tampered-file-ran"
    _plant(tmp_path, built, flag)
    kernel = built.kernels[0].name
    try:
        aot_target._compilable(built, kernel, kernel)
    except Exception:  # noqa: BLE001 - refusing the file is the fix
        pass
    assert not flag.exists(), "aot imported a kernel file whose content is not its hash"
