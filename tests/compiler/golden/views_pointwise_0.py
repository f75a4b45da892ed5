# golden: views_pointwise, kernel 0 (pointwise, pointwise)
import triton
import triton.language as tl


@triton.jit
def fused_cat_sigmoid_mul_2829ebb7(in_ptr0, in_ptr1, out_ptr0, XBLOCK: tl.constexpr):
    # pointwise kernel, variant pointwise; fused aten ops:
    #   aten.permute.default
    #   aten.slice.Tensor
    #   aten.cat.default
    #   aten.sigmoid.default
    #   aten.mul.Tensor
    xnumel = 44
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x0 = xindex // 11
    x1 = xindex % 11
    mask0 = xmask & ((x1 >= 0) & (x1 < 6))
    tmp1 = tl.load(in_ptr0 + (x1 * 4 + x0), mask0, other=0)
    mask2 = xmask & ((x1 >= 6) & (x1 < 11))
    tmp3 = tl.load(in_ptr1 + (x0 * 10 + ((x1 - 6) * 2)), mask2, other=0)
    tmp4 = tl.where((x1 >= 0) & (x1 < 6), tmp1, tmp3)
    tmp5 = tl.sigmoid(tmp4)
    tmp6 = tmp5 * 2.0
    tl.store(out_ptr0 + xindex, tmp6, xmask)
