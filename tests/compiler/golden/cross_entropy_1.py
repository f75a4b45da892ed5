# golden: cross_entropy, kernel 1 (reduction, persistent)
import triton
import triton.language as tl


@triton.jit
def fused_sub_log_ne_scalar_tensor_1(in_ptr0, in_ptr1, in_ptr2, in_ptr3, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # reduction kernel, variant persistent; fused aten nodes:
    #   _to_copy: aten._to_copy.default
    #   sub: aten.sub.Tensor
    #   log: aten.log.default
    #   sub_1: aten.sub.Tensor
    #   _to_copy_1: aten._to_copy.default
    #   ne: aten.ne.Scalar
    #   scalar_tensor: aten.scalar_tensor.default
    #   where: aten.where.self
    #   unsqueeze: aten.unsqueeze.default
    #   gather: aten.gather.default
    #   squeeze: aten.squeeze.dims
    #   neg: aten.neg.default
    #   ne_1: aten.ne.Scalar
    #   scalar_tensor_1: aten.scalar_tensor.default
    #   where_1: aten.where.self
    #   ne_2: aten.ne.Scalar
    #   sum_2: aten.sum.dim_IntList
    #   _to_copy_2: aten._to_copy.default
    #   sum_3: aten.sum.dim_IntList
    #   div: aten.div.Tensor
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
