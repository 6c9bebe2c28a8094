"""Chapter 5's fused kernels (QK-norm + RoPE, SiLU-and-mul) against the torch layers they replace.
On CPU they run in Triton's interpreter (fp32); on CUDA also in bf16."""
import pytest
import torch
import torch.nn.functional as F

from minillm.kernels.qk_norm_rope import qk_norm_rope
from minillm.kernels.silu_mul import silu_and_mul_triton
from minillm.layers.layernorm import rms_norm
from minillm.layers.rotary import apply_rotary, rope_cos_sin

import os

# Triton runs on CPU tensors only in its interpreter (set by conftest where there is no CUDA)
DEVICES = (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1" else []) + (["cuda"] if torch.cuda.is_available() else [])
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _cases():
    for dev in DEVICES:
        for dtype in ([torch.float32] if dev == "cpu" else [torch.float32, torch.bfloat16]):
            yield dev, dtype


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("H, Hkv, D", [(4, 2, 32), (16, 8, 128)])
def test_qk_norm_rope_matches_torch_layers(device, dtype, norm, H, Hkv, D):
    g = torch.Generator().manual_seed(H * D + norm)
    N = 9
    qkv = torch.randn(N, (H + 2 * Hkv) * D, generator=g).to(device, dtype)
    pos = torch.tensor([0, 5, 3, 100, 2, 7, 9, 511, 64], device=device)
    cs = rope_cos_sin(D, 512, 1e6).to(device)
    qw = torch.randn(D, generator=g).to(device, dtype)
    kw = torch.randn(D, generator=g).to(device, dtype)
    q, k, v = qk_norm_rope(qkv, pos, cs, H, Hkv, D, qw if norm else None, kw if norm else None)
    rq, rk, rv = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    rq, rk = rq.reshape(N, H, D), rk.reshape(N, Hkv, D)
    if norm:
        rq, rk = rms_norm(rq, qw, 1e-6), rms_norm(rk, kw, 1e-6)
    rq, rk = apply_rotary(rq, pos, cs), apply_rotary(rk, pos, cs)
    tol = TOL[dtype]
    torch.testing.assert_close(q.float(), rq.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k.float(), rk.float(), atol=tol, rtol=tol)
    assert torch.equal(v, rv.reshape(N, Hkv, D))


@pytest.mark.parametrize("device, dtype", list(_cases()))
@pytest.mark.parametrize("N, I", [(1, 64), (5, 1500), (3, 3072)])
def test_silu_and_mul_matches_torch(device, dtype, N, I):
    x = torch.randn(N, 2 * I, generator=torch.Generator().manual_seed(I)).to(device, dtype)
    gate, up = x.float().chunk(2, dim=-1)
    want = (F.silu(gate) * up).to(dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(silu_and_mul_triton(x).float(), want.float(), atol=tol, rtol=tol)
