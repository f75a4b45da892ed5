# golden: softmax_wide, kernel 0 (reduction, looped)
import triton
import triton.language as tl


@triton.jit
def fused_mul_amax_sub_exp_0(in_ptr0, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant looped; fused aten nodes:
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
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp0 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp1 = tmp0 * 0.125
        tmp2 = tl.where(rowmask, tmp1, float("-inf"))
        acc0 = tl.maximum(acc0, tmp2)
    red0_3 = tl.max(acc0, 1)[:, None]
    acc1 = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp4 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp5 = tmp4 * 0.125
        tmp6 = tmp5 - red0_3
        tmp7 = tl.exp(tmp6)
        tmp8 = tl.where(rowmask, tmp7, 0.0)
        acc1 = acc1 + tmp8
    red1_9 = tl.sum(acc1, 1)[:, None]
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp10 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp11 = tmp10 * 0.125
        tmp12 = tmp11 - red0_3
        tmp13 = tl.exp(tmp12)
        tmp14 = tmp13 / red1_9
        tl.store(out_ptr0 + (xindex * 5000 + rindex), tmp14, rowmask)
