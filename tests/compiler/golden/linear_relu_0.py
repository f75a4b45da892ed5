# golden: linear_relu, kernel 0 (matmul, triton)
import triton
import triton.language as tl


@triton.jit
def fused_addmm_relu_7859cd56(in_ptr0, in_ptr1, in_ptr2, out_ptr0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # matmul kernel, variant triton; fused aten ops:
    #   aten.permute.default
    #   aten.addmm.default
    #   aten.relu.default
    M = 8
    N = 32
    K = 16
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]
    # rows and columns wrap for loads (the tutorial's trick): only stores are masked
    ram = rm % M
    rbn = rn % N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ka = k0 + tl.arange(0, BLOCK_K)[None, :]
        kb = k0 + tl.arange(0, BLOCK_K)[:, None]
        if 16 % BLOCK_K == 0:  # static: no mask on K when blocks tile it
            a = tl.load(in_ptr0 + (ram * 16 + ka))
            b = tl.load(in_ptr1 + (rbn * 16 + kb))
        else:
            a = tl.load(in_ptr0 + (ram * 16 + ka), ka < K, other=0.0)
            b = tl.load(in_ptr1 + (rbn * 16 + kb), kb < K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    mmask = (rm < M) & (rn < N)
    tmp0 = tl.load(in_ptr2 + rn, mmask, other=0)
    tmp1 = acc + tmp0
    tmp2 = tl.where(tmp1 < 0, 0.0, tmp1)
    tl.store(out_ptr0 + (rm * 32 + rn), tmp2, mmask)
