# golden: softmax_wide, kernel 0 (reduction, online)
import triton
import triton.language as tl


@triton.jit
def fused_mul_amax_sub_exp_0(in_ptr0, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant online; fused aten nodes:
    #   mul: aten.mul.Tensor
    #   amax: aten.amax.default
    #   sub: aten.sub.Tensor
    #   exp: aten.exp.default
    #   sum_1: aten.sum.dim_IntList
    #   div: aten.div.Tensor
    xnumel = 2
    rnumel = 5000
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    rbase = tl.arange(0, RBLOCK)[None, :]
    acc0 = tl.full([XBLOCK, RBLOCK], float("-inf"), tl.float32)
    sum1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp0 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp1 = tmp0 * 0.125
        tmp2 = tl.where(rowmask, tmp1, float("-inf"))
        tmp3 = tl.maximum(acc0, tmp2)
        sum1 = tl.where(tmp3 == float("-inf"), 0.0, sum1 * tl.exp(acc0 - tmp3) + tl.where(rowmask, tl.exp(tmp2 - tmp3), 0.0))
        acc0 = tmp3
    red0_4 = tl.max(acc0, 1)[:, None]
    red1_5 = tl.sum(tl.where(acc0 == float("-inf"), 0.0, sum1 * tl.exp(acc0 - red0_4)), 1)[:, None]
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp6 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp7 = tmp6 * 0.125
        tmp8 = tmp7 - red0_4
        tmp9 = tl.exp(tmp8)
        tmp10 = tmp9 / red1_5
        tl.store(out_ptr0 + (xindex * 5000 + rindex), tmp10, rowmask)
