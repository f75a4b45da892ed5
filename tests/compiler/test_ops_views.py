"""Op matrix: views, index arithmetic and index ops, fused without copies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.compiler.oputil import check, rand, strided

VIEW_CASES = {
    "permute": lambda x: x.permute(2, 0, 1) * 2,
    "transpose_reshape": lambda x: x.transpose(0, 2).reshape(7, -1) + 1,
    "expand": lambda x: x[:, :1].expand(3, 5, 7) - x,
    "slice_step": lambda x: x[:, 1::2, 2:6:3] * 3,
    "negative_slice": lambda x: x[..., -3:] + x[..., :3],
    "select": lambda x: x.select(1, 2) + x[:, -1, :],
    "unsqueeze_squeeze": lambda x: x.unsqueeze(1).squeeze(1) * x[:1].squeeze(0),
    "flatten_view": lambda x: x.reshape(15, 7).t() + 0.5,
    "unflatten": lambda x: x.reshape(3, 35).reshape(3, 5, 7, 1).squeeze(-1) * 2,
    "cat": lambda x: torch.cat([x, x * 2, x[:, :2]], dim=1),
    "cat_last": lambda x: torch.cat([x[..., :2], torch.sin(x)], dim=-1),
    "pad": lambda x: F.pad(x, (1, 2, 0, 3), value=-1.5),
    "pad_crop": lambda x: F.pad(x, (-1, 2)),
    "flip": lambda x: x.flip(0, 2) + x,
    "split": lambda x: [t * i for i, t in enumerate(x.split([2, 3], dim=1))],
    "unbind": lambda x: sum(t for t in x.unbind(0)),
    "chunk": lambda x: x.chunk(3, dim=-1)[1] + 1,
}


@pytest.mark.parametrize("name", sorted(VIEW_CASES))
def test_views(name: str) -> None:
    check(VIEW_CASES[name], rand((3, 5, 7), seed=1))


@pytest.mark.parametrize("name", ["permute", "transpose_reshape", "slice_step", "cat", "pad"])
def test_views_of_strided_inputs(name: str) -> None:
    check(VIEW_CASES[name], strided((3, 5, 7), seed=2))


def test_gather_index_select_embedding_index() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.gather(x, 1, j), torch.index_select(x, 0, i), F.embedding(i, x),
                x[i], x[i, i % 4] + 1)

    x = rand((6, 4), seed=3)
    i = torch.tensor([5, 0, 2, 2, 1])
    j = torch.tensor([[3, 0], [1, 1], [0, 2], [3, 3], [2, 1], [0, 0]])
    check(fn, x, i, j)


def test_negative_index() -> None:
    check(lambda x, i: x[i] * 2, rand((6, 4), seed=4), torch.tensor([-1, 0, -6]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_views_other_dtypes(dtype: torch.dtype) -> None:
    x = rand((4, 6), dtype, seed=5)
    check(lambda x: torch.cat([x.t(), x.t()[:, 1:]], dim=1).flip(0), x)


def test_scatter_style_backward_ops() -> None:
    def fn(base: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.slice_scatter(base, src, 1, 1, 7, 2), torch.select_scatter(base, src[:, 0], 1, 3))

    check(fn, rand((4, 8), seed=6), rand((4, 3), seed=7))


def test_heads_read_through_a_permuted_view_load_contiguous_rows() -> None:
    """Attention's backward: q, k and v gradients in [B, S, H, D] memory, viewed as
    [B, H, S, D], concatenated into [B * S, 3 * H * D]. In memory H and D are adjacent, so
    each load's offset is row * H * D + column, with no `// D` and `% D` left in it (which
    hid the contiguity from Triton)."""
    b, s, h, d = 2, 8, 3, 4

    def qkv_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([t.permute(0, 2, 1, 3).reshape(b * s, h * d) for t in (q, k, v)], 1)

    grads = [rand((b, s, h, d), seed=i).permute(0, 2, 1, 3) for i in range(3)]
    built = check(qkv_grad, *grads)
    loads = [line for line in built.kernels[0].source.splitlines() if "tl.load(" in line]
    assert len(loads) == 3
    assert not any("//" in line or "%" in line for line in loads), loads
