"""bench.kernel_breakdown's bookkeeping on kernel names and timings seen on an H200 (the
profiling itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from bench import kernel_breakdown as kb
from bench.kernel_breakdown import HostOp, Kernel


@pytest.mark.parametrize(("name", "kind"), [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_NNT", "library matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "library matmul"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "convolution"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized>", "convolution"),
    ("void precomputed_convolve_sgemm<__nv_bfloat16, 128, 6, 7, 3, 3, 5, 1, false>", "convolution"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>", "attention"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>", "layout conversion"),
    ("fused_convolution_cat_add_var_mean_071a9947", "triton"),
    ("triton_poi_fused_clone_permute_stack_12", "triton"),
    ("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda>", "copy"),
    ("Memcpy DtoD (Device -> Device)", "memcpy"),
    ("Memset (Device)", "memset"),
    ("void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel", "aten other"),
])
def test_each_kernel_has_its_kind(name: str, kind: str) -> None:
    assert kb.category(name) == kind


def test_a_breakdown_is_per_step_by_name_and_by_kind() -> None:
    kernels = [Kernel("nvjet_a", 0, 30), Kernel("fused_ln_1", 31, 10), Kernel("nvjet_b", 45, 20),
               Kernel("nvjet_a", 100, 32), Kernel("fused_ln_1", 133, 12), Kernel("nvjet_b", 150, 18)]
    got = kb.breakdown(kernels, steps=2)
    assert got["gpu_us"] == 61.0
    assert got["kernels"]["nvjet_a"] == {"launches": 1.0, "us": 31.0}
    assert got["by_kind"] == {"library matmul": {"launches": 2.0, "us": 50.0},
                              "triton": {"launches": 1.0, "us": 11.0}}
    assert list(got["by_kind"]) == ["library matmul", "triton"]  # most time first


def test_idle_gaps_name_the_host_ops_the_gpu_waited_for() -> None:
    kernels = [Kernel("fused_mm_1", 0, 10), Kernel("copy_a", 12, 3),   # 2 us: not a gap
               Kernel("copy_b", 80, 3), Kernel("fused_sum_2", 84, 5)]
    host = [HostOp("autograd::engine::evaluate_function: AccumulateGrad", 60, 90),
            HostOp("aten::copy_", 70, 85), HostOp("aten::sin", 0, 5)]
    gaps = kb.idle_gaps(kernels, host, min_us=20)
    assert gaps == [{"us": 65.0, "after": "copy_a", "before": "copy_b",
                     "host": ["autograd::engine::evaluate_function: AccumulateGrad",
                              "aten::copy_"]}]


def test_the_side_by_side_table_shows_a_kind_one_path_lacks() -> None:
    results = {"m.train/a": kb.breakdown([Kernel("nvjet_x", 0, 10), Kernel("Memset (Device)", 11, 1)], 1),
               "m.train/b": kb.breakdown([Kernel("nvjet_x", 0, 12)], 1)}
    table = kb.side_by_side(results, "m.train", ["a", "b"])
    assert "m.train: a 11.0 us  b 12.0 us" in table
    memset = next(line for line in table.splitlines() if "memset" in line)
    assert "1.0 (1)" in memset and memset.rstrip().endswith("-")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        kb.main(["--cases", "gpt2.train", "--out", str(tmp_path / "b.json")])
    assert "a CUDA device is needed" in capsys.readouterr().err
