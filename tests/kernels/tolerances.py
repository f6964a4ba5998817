"""The one tolerance table for kernel parity: (rtol, atol) per kernel family and dtype path."""

TOLERANCES = {
    "rmsnorm": (1e-5, 1e-6),
}


def tolerance(kernel: str) -> tuple[float, float]:
    return TOLERANCES[kernel]


# attention / GDN rows (kernels engineer): float64 references, f32 kernels.
TOLERANCES["attention"] = (1e-4, 2e-6)      # f32 vs float64 ref; a numpy f32 emulation errs ~1e-7 abs
# prompt rows (cuda/attention_prefill.cu, TF32 tensor cores): against their arithmetic model
# luce.ref.attention_prefill (f32 accumulation; a p whose TF32 rounding flips moves an output
# by up to 2^-10 p / l |v|: 8e-5 seen in the emulation, N(0, 1) data), and against the exact
# float64 math (TF32's 10-bit q, k, v and p).
TOLERANCES["attention_prompt"] = (1e-4, 3e-4)
TOLERANCES["attention_prompt_exact"] = (1e-2, 2e-3)
TOLERANCES["gdn_recurrent"] = (1e-4, 1e-6)  # f32 state per token vs float64 within a token

# matmul (quantized-matmul engineer): per output row, in units of the row's max |y|.
# Block types quantize x to 16 bits per 256 values (worst seen 6e-5; 8-bit x would err ~1e-2);
# float types only reorder an f32 sum.
TOLERANCES["matmul_blocks"] = (1e-5, 1.5e-4)
TOLERANCES["matmul_float"] = (1e-5, 1e-5)
# prompt-row GEMM vs luce.ref.matmul_prefill (the same 8-bit x): f32 combine order only. Its
# error against f32 x is error_bound's, checked separately (tests/kernels/test_matmul_prefill.py).
TOLERANCES["matmul_prefill"] = (1e-5, 2e-5)
# the same kernels on RMSNorm outputs (tests/kernels/test_norm_quant.py): rows with a few large
# values make max |y| small against sum |w| |x|, so the 16-bit x error reads larger in its units
# (worst seen on the H200: 1.8e-4, Q5_0, K 352, row 111 of 129; the fused op equals the unfused bitwise)
TOLERANCES["matmul_blocks_normed"] = (1e-5, 3e-4)
TOLERANCES["gdn_chunked"] = (1e-4, 1e-6)    # f32 chunk form vs float64; a numpy f32 emulation errs ~4e-7 rel
# the tensor-core chunk kernel (cuda/gdn_chunked_tc.cuh) vs float64, per element. Default 3xTF32:
# f32-class products (the host emulation, exact f32, errs 1e-6 abs on states of max 0.7, like the
# f32 kernel), atol 1e-5 for the device's own mma accumulation. "tf32" (one pass, operands rounded
# to 10 bits): errs ~6e-4 of the largest |value| (emulated: 4e-4 on a state of max 0.7), so its
# atol is in units of max |want| (tests/kernels/test_gdn_chunked.py scales it).
TOLERANCES["gdn_chunked_tc"] = (1e-4, 1e-5)
TOLERANCES["gdn_chunked_tf32"] = (2e-3, 2e-3)

# build engineer's families: float64 references, f32 kernels.
TOLERANCES["gated_rmsnorm"] = (1e-5, 1e-6)
TOLERANCES["rotary"] = (1e-5, 1e-5)          # f32 rotation of |x| <= ~15 errs ~4e-6 abs at worst
TOLERANCES["swiglu"] = (1e-5, 1e-7)
TOLERANCES["conv1d"] = (1e-5, 1e-6)
TOLERANCES["top_k_logprobs"] = (1e-5, 1e-5)  # exp sums in double; logprob rounded to f32

# pointwise family (CUDA backend engineer): double maths rounded once to f32; device exp/log1p
# in double are within 1-2 ulp of libm, so results differ from numpy by at most 1 f32 ulp.
TOLERANCES["pointwise_unary"] = (2e-7, 1e-30)
TOLERANCES["l2norm"] = (2e-7, 1e-30)
