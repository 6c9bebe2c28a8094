"""The paged decode kernel on the bench's context lengths (one H200): its time against the KV read floor
at batch 256, 160 and 64, with the sequences in random order, longest first and shortest first (is
time lost to load imbalance?), for several (BLOCK_N, num_warps, num_stages) configs and split counts.
minillm/kernels/paged_attention.py's DECODE_CONFIGS cite this sweep.

    source tests/gpu/env.sh && python tests/gpu/decode_sweep.py
"""
import random

import torch
import triton

from minillm.kernels.paged_attention import paged_decode_attention
from minillm.timing import device_ceilings, time_fn

H, HKV, D, PAGE, MAX_BLOCKS = 16, 8, 128, 256, 16  # Qwen3-0.6B's heads; the engine's 256-token blocks
CONFIGS = [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2), (32, 4, 3)]


def main() -> None:
    torch.manual_seed(0)
    random.seed(0)
    bw = device_ceilings().copy_gbps
    print(f"copy {bw:.0f} GB/s")
    for batch in (256, 160, 64):
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
            t = 1e3 * time_fn(lambda: paged_decode_attention(qq, k_cache, v_cache, bt, cl, D ** -0.5, **kw))
            return f"{t:7.1f} us  {100 * floor_us / t:5.1f}% of the {floor_us:.1f} us floor"
        print(f"B={batch:3d} random order      {run()}")
        print(f"B={batch:3d} longest first     {run(sorted(range(batch), key=lambda b: -lens[b]))}")
        print(f"B={batch:3d} shortest first    {run(sorted(range(batch), key=lambda b: lens[b]))}")
        for block_n, warps, stages in CONFIGS:
            cfg = {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
            print(f"   config {block_n}/{warps}/{stages}    {run(config=cfg)}")
        for splits in (2, 4):
            print(f"   {splits} splits          {run(num_splits=splits)}")


if __name__ == "__main__":
    main()
