"""The paged decode kernel on the bench's context lengths (one H200): its time against the KV read floor
at batch 32 to 256 (the decode batches of the bench run), with the engine's launch and with other
(BLOCK_N, num_warps, num_stages) configs and split counts. Timed from CUDA graphs (time_fn's graph=True:
the GPU's time alone, as in the engine). minillm/kernels/paged_attention.py's DECODE_CONFIGS and split
rule cite this sweep.

    source tests/gpu/env.sh && python tests/gpu/decode_sweep.py
"""
import random

import torch
import triton

from minillm.kernels.paged_attention import paged_decode_attention
from minillm.timing import device_ceilings, time_fn

H, HKV, D, PAGE, MAX_BLOCKS = 16, 8, 128, 256, 16  # Qwen3-0.6B's heads; the engine's 256-token blocks
CONFIGS = [(64, 4, 3), (128, 4, 2), (64, 4, 4), (128, 8, 3)]


def main() -> None:
    torch.manual_seed(0)
    random.seed(0)
    bw = device_ceilings().copy_gbps
    print(f"copy {bw:.0f} GB/s")
    for batch in (32, 64, 96, 128, 192, 256):
        lens = [random.randint(100, 1024) + random.randint(0, 1024) for _ in range(batch)]  # prompt + tokens so far
        num_blocks = sum(triton.cdiv(n, PAGE) for n in lens)
        k_cache = torch.randn(num_blocks + 1, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        perm, tables = torch.randperm(num_blocks).tolist(), []
        for n in lens:
            used = triton.cdiv(n, PAGE)
            tables.append(perm[:used] + [-1] * (MAX_BLOCKS - used))
            perm = perm[used:]
        q = torch.randn(batch, H, D, device="cuda", dtype=torch.bfloat16)
        tables = torch.tensor(tables, dtype=torch.int32, device="cuda")
        lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
        floor_us = sum(lens) * HKV * D * 2 * 2 / bw / 1e3  # K and V, bf16

        def run(order=None, **kw):
            o = torch.arange(batch, device="cuda") if order is None else torch.tensor(order, device="cuda")
            qq, bt, cl = q[o].contiguous(), tables[o].contiguous(), lens_t[o].contiguous()
            t = 1e3 * time_fn(lambda: paged_decode_attention(qq, k_cache, v_cache, bt, cl, D ** -0.5, **kw), graph=True)
            return f"{t:7.1f} us  {100 * floor_us / t:5.1f}% of the {floor_us:.1f} us floor"
        print(f"B={batch:3d} random order      {run()}")
        print(f"B={batch:3d} longest first     {run(sorted(range(batch), key=lambda b: -lens[b]))}")
        print(f"B={batch:3d} shortest first    {run(sorted(range(batch), key=lambda b: lens[b]))}")
        for block_n, warps, stages in CONFIGS:
            for splits in (1, 2, 4):
                cfg = {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "num_splits": splits}
                print(f"   config {block_n}/{warps}/{stages}, {splits} split(s)   {run(config=cfg)}")


if __name__ == "__main__":
    main()
