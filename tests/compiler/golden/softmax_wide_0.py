# golden: softmax_wide, kernel 0 (reduction, looped)
import triton
import triton.language as tl


@triton.jit
def fused_mul_amax_sub_exp_034181f1(in_ptr0, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant looped; fused aten ops:
    #   aten.mul.Tensor
    #   aten.amax.default
    #   aten.sub.Tensor
    #   aten.exp.default
    #   aten.sum.dim_IntList
    #   aten.div.Tensor
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
        acc0 = tl.maximum(acc0, tmp2, propagate_nan=tl.PropagateNan.ALL)
    tmp3 = tl.max(acc0, 1)[:, None]
    red0_4 = tl.where((tl.max((acc0 != acc0).to(tl.int32), 1)[:, None] != 0), float("nan"), tmp3)
    acc1 = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp5 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp6 = tmp5 * 0.125
        tmp7 = tmp6 - red0_4
        tmp8 = tl.exp(tmp7)
        tmp9 = tl.where(rowmask, tmp8, 0.0)
        acc1 = acc1 + tmp9
    red1_10 = tl.sum(acc1, 1)[:, None]
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        rowmask = xmask & rmask
        tmp11 = tl.load(in_ptr0 + (xindex * 5000 + rindex), rowmask, other=0)
        tmp12 = tmp11 * 0.125
        tmp13 = tmp12 - red0_4
        tmp14 = tl.exp(tmp13)
        tmp15 = tmp14 / red1_10
        tl.store(out_ptr0 + (xindex * 5000 + rindex), tmp15, rowmask)
