"""Decode-step GEMMs of Qwen3-0.6B (one H200): cuBLAS (F.linear, what the engine runs from batch 2 up)
against a plain Triton tl.dot GEMM over a few tile shapes, each timed as CUDA-graph replays (as the
engine runs them) and set against its own floor (weights read at the copy bandwidth, or FLOPs at the
matmul rate, whichever is larger). Issue 21's question: at batch 256 the 113 GEMMs of a step took
907 us against a 282 us floor (notebook 05, section 8); is a better GEMM there to be had?

    source tests/gpu/env.sh && python tests/gpu/gemm_sweep.py
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from minillm.timing import device_ceilings

# (name, K, N): the projections of one Qwen3-0.6B layer (hidden 1024, 16 q + 8 kv heads of 128, MLP 3072)
SHAPES = [("qkv_proj", 1024, 4096), ("o_proj", 2048, 1024), ("gate_up_proj", 1024, 6144), ("down_proj", 3072, 1024)]
BATCHES = (16, 64, 128, 256)
CONFIGS = [(16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4),
           (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 32, 128, 4, 4)]  # BM, BN, BK, warps, stages


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K]^T (F.linear's layout), fp32 accumulation; one program per output tile."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + (k0 + rk)[:, None], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_linear(x: torch.Tensor, w: torch.Tensor, cfg) -> torch.Tensor:
    bm, bn, bk, warps, stages = cfg
    (M, K), N = x.shape, w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _gemm_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](x, w, y, M, N, K, BM=bm, BN=bn, BK=bk,
                                                         num_warps=warps, num_stages=stages)
    return y


def main() -> None:
    torch.manual_seed(0)
    ceil = device_ceilings()
    print(f"copy {ceil.copy_gbps:,.0f} GB/s, matmul {ceil.matmul_tflops:.0f} TFLOP/s")
    total = {}
    for M in BATCHES:
        for name, K, N in SHAPES:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
            ref = F.linear(x, w)
            floor = max((M * K + K * N + M * N) * 2 / ceil.copy_gbps / 1e3, 2 * M * K * N / ceil.matmul_tflops / 1e6)
            cublas = do_bench_cudagraph(lambda: F.linear(x, w), rep=50) * 1e3
            best = None
            for cfg in CONFIGS:
                err = (triton_linear(x, w, cfg).float() - ref.float()).abs().max().item()
                if err > 0.05:
                    print(f"  {name} M={M} {cfg}: max |diff| {err:.3f}: wrong, skipped")
                    continue
                us = do_bench_cudagraph(lambda: triton_linear(x, w, cfg), rep=50) * 1e3
                if best is None or us < best[0]:
                    best = (us, cfg)
            if best is None:
                raise SystemExit(f"{name} M={M}: no Triton config computed the product correctly")
            total.setdefault(M, [0.0, 0.0, 0.0])
            for i, v in enumerate((floor, cublas, best[0])):
                total[M][i] += v
            print(f"M={M:4d} {name:<13} floor {floor:6.2f} us  cuBLAS {cublas:6.2f} us ({100 * floor / cublas:3.0f}%)  "
                  f"Triton best {best[0]:6.2f} us ({100 * floor / best[0]:3.0f}%) {best[1]}")
    for M, (floor, cublas, tri) in total.items():
        print(f"M={M:4d} one layer's four GEMMs: floor {floor:6.2f} us, cuBLAS {cublas:6.2f} us, best Triton {tri:6.2f} us")


if __name__ == "__main__":
    main()
