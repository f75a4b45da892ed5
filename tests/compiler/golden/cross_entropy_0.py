# golden: cross_entropy, kernel 0 (reduction, persistent)
import triton
import triton.language as tl


@triton.jit
def fused_amax_sub_exp_sum_0(in_ptr0, out_ptr0, out_ptr1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant persistent; fused aten nodes:
    #   _to_copy: aten._to_copy.default
    #   amax: aten.amax.default
    #   sub: aten.sub.Tensor
    #   exp: aten.exp.default
    #   sum_1: aten.sum.dim_IntList
    xnumel = 4
    rnumel = 10
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    rbase = tl.arange(0, RBLOCK)[None, :]
    rindex = rbase
    rmask = rindex < rnumel
    rowmask = xmask & rmask
    tmp0 = tl.load(in_ptr0 + (xindex * 10 + rindex), rowmask, other=0).to(tl.float32)
    tmp1 = tl.where(rowmask, tmp0, float("-inf"))
    red0_2 = tl.max(tmp1, 1)[:, None]
    tmp3 = tmp0 - red0_2
    tmp4 = tl.exp(tmp3)
    tmp5 = tl.where(rowmask, tmp4, 0.0)
    red1_6 = tl.sum(tmp5, 1)[:, None]
    tl.store(out_ptr0 + xindex, red0_2, xmask)
    tl.store(out_ptr1 + xindex, red1_6, xmask)
