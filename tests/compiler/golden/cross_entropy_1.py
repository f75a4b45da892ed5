# golden: cross_entropy, kernel 1 (reduction, persistent)
import triton
import triton.language as tl


@triton.jit
def fused_sub_log_ne_scalar_tensor_f26b7a1c(in_ptr0, in_ptr1, in_ptr2, in_ptr3, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant persistent; fused aten ops:
    #   aten._to_copy.default
    #   aten.sub.Tensor
    #   aten.log.default
    #   aten.sub.Tensor
    #   aten._to_copy.default
    #   aten.ne.Scalar
    #   aten.scalar_tensor.default
    #   aten.where.self
    #   aten.unsqueeze.default
    #   aten.gather.default
    #   aten.squeeze.dims
    #   aten.neg.default
    #   aten.ne.Scalar
    #   aten.scalar_tensor.default
    #   aten.where.self
    #   aten.ne.Scalar
    #   aten.sum.dim_IntList
    #   aten._to_copy.default
    #   aten.sum.dim_IntList
    #   aten.div.Tensor
    xnumel = 1
    rnumel = 4
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    rbase = tl.arange(0, RBLOCK)[None, :]
    rindex = rbase
    rmask = rindex < rnumel
    rowmask = xmask & rmask
    tmp0 = tl.load(in_ptr0 + rindex, rowmask, other=0)
    tmp1 = tmp0 != (-100)
    tmp2 = tl.where(rowmask, tmp1.to(tl.int64), 0)
    red0_3 = tl.sum(tmp2, 1)[:, None]
    tmp4 = tl.full([], 0, tl.int64)
    tmp5 = tl.where(tmp1, tmp0, tmp4)
    tmp6 = tl.load(in_ptr1 + (rindex * 10 + tmp5), rowmask, other=0).to(tl.float32)
    tmp7 = tl.load(in_ptr2 + rindex, rowmask, other=0)
    tmp8 = tmp6 - tmp7
    tmp9 = tl.load(in_ptr3 + rindex, rowmask, other=0)
    tmp10 = tl.log(tmp9)
    tmp11 = tmp8 - tmp10
    tmp12 = tmp11.to(tl.bfloat16).to(tl.float32)
    tmp13 = -tmp12
    tmp14 = tl.full([], 0.0, tl.float32)
    tmp15 = tl.where(tmp1, tmp13, tmp14)
    tmp16 = tl.where(rowmask, tmp15, 0.0)
    red1_17 = tl.sum(tmp16, 1)[:, None]
    tmp18 = (red0_3.to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    tmp19 = red1_17 / tmp18
    tl.store(out_ptr0 + xindex, tmp19.to(tl.bfloat16), xmask)
