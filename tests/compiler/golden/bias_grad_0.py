# golden: bias_grad, kernel 0 (reduction, persistent)
import triton
import triton.language as tl


@triton.jit
def fused_sum_baf0ed6a(in_ptr0, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant persistent; fused aten ops:
    #   aten.sum.dim_IntList
    xnumel = 12
    rnumel = 64
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    rbase = tl.arange(0, RBLOCK)[None, :]
    rindex = rbase
    rmask = rindex < rnumel
    rowmask = xmask & rmask
    tmp0 = tl.load(in_ptr0 + (rindex * 12 + xindex), rowmask, other=0)
    tmp1 = tl.where(rowmask, tmp0, 0.0)
    red0_2 = tl.sum(tmp1, 1)[:, None]
    tl.store(out_ptr0 + xindex, red0_2, xmask)
