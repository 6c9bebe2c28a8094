"""Chapter 3 kernels against their torch references and torch SDPA.

CPU: the Triton kernels run in the interpreter, in fp32 and fp16 (bf16 math is wrong there), with
guard regions around every buffer a kernel writes. GPU (`-m gpu`): bf16 at Qwen3-0.6B shapes, and
the decode kernel replayed inside a CUDA graph (it must not sync or read lengths on the host).
"""
import pytest
import torch
import torch.nn.functional as F

from minillm.kernels import paged_attention as pa
from minillm.kernels.paged_attention import paged_decode_attention, paged_decode_config
from minillm.kernels.prefill_attention import prefill_attention
from minillm.kernels.store_kvcache import store_kvcache, store_kvcache_ref
from minillm.layers.attention import paged_attention_ref, paged_decode_torch, varlen_attention

SENTINEL = 77.0
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def make_paged(lengths, num_kv_heads, head_dim, block_size, dtype, device="cpu", seed=0, spare_blocks=3):
    """Random per-sequence K/V scattered into shuffled cache blocks, with one guard block each side;
    every row no sequence owns is NaN (unwritten memory may be). -> (ks, vs, k_cache, v_cache, k_buf,
    v_buf, block_tables): caches are views of the *_buf."""
    g = torch.Generator().manual_seed(seed)
    ks = [torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype) for n in lengths]
    vs = [torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype) for n in lengths]
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + spare_blocks
    k_buf = torch.full((num_blocks + 2, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_buf = k_buf.clone()
    k_cache, v_cache = k_buf[1:-1], v_buf[1:-1]
    perm = torch.randperm(num_blocks, generator=g)
    width = max(need) + 1  # one extra column of -1 padding
    tables = torch.full((len(lengths), width), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lengths):
        tables[i, :need[i]] = perm[used:used + need[i]].int()
        used += need[i]
        pos = torch.arange(n)
        slots = tables[i, pos // block_size].long() * block_size + pos % block_size
        store_kvcache_ref(ks[i], vs[i], k_cache, v_cache, slots)
    to = dict(device=device)
    return ([k.to(**to) for k in ks], [v.to(**to) for v in vs], k_cache.to(**to), v_cache.to(**to),
            k_buf.to(**to), v_buf.to(**to), tables.to(**to))


def sdpa_reference(q, k, v, causal_offset=None):
    """One sequence, fp32: q [Lq, H, D], k/v [Lk, Hkv, D] -> [Lq, H, D]; causal aligned to the end."""
    Lq, Lk = q.shape[0], k.shape[0]
    mask = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq)
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), k.float().transpose(0, 1),
                                         v.float().transpose(0, 1), attn_mask=mask, enable_gqa=True,
                                         scale=q.shape[-1] ** -0.5)
    return out.transpose(0, 1)


# ---- store_kvcache ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 256])
def test_store_kvcache_matches_reference(dtype, block_size):
    g = torch.Generator().manual_seed(1)
    n, hkv, d, num_blocks = 37, 2, 24, 5  # odd token count, row of 48 (not a power of two)
    qkv = torch.randn(n, 3 * hkv * d, generator=g).to(dtype)  # k/v as strided views, as in the model
    k = qkv[:, hkv * d:2 * hkv * d].view(n, hkv, d)
    v = qkv[:, 2 * hkv * d:].view(n, hkv, d)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    slots[::4] = -1
    bufs = [torch.full((num_blocks + 2, block_size, hkv, d), SENTINEL, dtype=dtype) for _ in range(4)]
    store_kvcache(k, v, bufs[0][1:-1], bufs[1][1:-1], slots)
    store_kvcache_ref(k, v, bufs[2][1:-1], bufs[3][1:-1], slots)
    assert torch.equal(bufs[0], bufs[2]) and torch.equal(bufs[1], bufs[3])


# ---- paged decode ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_paged_decode_matches_references(dtype, block_size, num_splits):
    lengths = [1, 37, 130]
    H, hkv, d = 6, 2, 40  # group of 3, head_dim 40: neither a power of two
    ks, vs, k_cache, v_cache, k_buf, v_buf, tables = make_paged(lengths, hkv, d, block_size, dtype)
    q = torch.randn(len(lengths), H, d, generator=torch.Generator().manual_seed(2)).to(dtype)
    lens = torch.tensor(lengths, dtype=torch.int32)
    out_buf = torch.full((len(lengths) + 2, H, d), SENTINEL, dtype=dtype)
    k_before = k_buf.clone()
    got = paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5, num_splits=num_splits,
                                 out=out_buf[1:-1])
    assert got.data_ptr() == out_buf[1:-1].data_ptr()
    assert (out_buf[0] == SENTINEL).all() and (out_buf[-1] == SENTINEL).all()
    assert torch.equal(k_buf.nan_to_num(0), k_before.nan_to_num(0))  # decode only reads the cache
    want = torch.stack([sdpa_reference(q[i:i + 1], ks[i], vs[i])[0] for i in range(len(lengths))])
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    ref = paged_attention_ref(q, k_cache, v_cache, list(range(len(lengths) + 1)), lengths, tables, d ** -0.5)
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])
    torch.testing.assert_close(paged_decode_torch(q, k_cache, v_cache, tables, lens, d ** -0.5).float(), want,
                               **TOL[dtype])


@pytest.mark.parametrize("layout", ["one block", "consecutive blocks", "shuffled blocks", "equal lengths",
                                    "unequal lengths"])
def test_paged_decode_torch_each_path(layout):
    """paged_decode_torch reads one sequence on consecutive blocks in place, copies the blocks of any
    other batch, and masks only when the lengths differ: each path against SDPA on each sequence's
    own K/V. Every row no sequence owns is NaN, the last block's tail included."""
    lengths, bs = {"one block": ([13], 16), "consecutive blocks": ([40], 16), "shuffled blocks": ([40], 16),
                   "equal lengths": ([21, 21], 16), "unequal lengths": ([21, 3], 16)}[layout]
    H, hkv, d = 6, 2, 8
    ks, vs, k_cache, v_cache, _, _, tables = make_paged(lengths, hkv, d, bs, torch.float32)
    if layout == "consecutive blocks":  # move the sequence onto blocks 1, 2, 3 (NaN everywhere else)
        k_cache[1:4] = k_cache[tables[0, :3].long()].clone()
        v_cache[1:4] = v_cache[tables[0, :3].long()].clone()
        k_cache[4:], v_cache[4:], k_cache[0], v_cache[0] = float("nan"), float("nan"), float("nan"), float("nan")
        tables[0, :3] = torch.tensor([1, 2, 3], dtype=torch.int32)
    elif layout == "shuffled blocks":
        assert not bool((tables[0, :3].diff() == 1).all())  # the copy path, not the view
    q = torch.randn(len(lengths), H, d, generator=torch.Generator().manual_seed(3))
    got = paged_decode_torch(q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), d ** -0.5)
    want = torch.stack([sdpa_reference(q[i:i + 1], ks[i], vs[i])[0] for i in range(len(lengths))])
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_paged_decode_torch_reads_nothing_back_off_a_cpu():
    """Off a CPU paged_decode_torch reads no value back to the host: on a GPU a read would wait for
    the device, and notebooks 02a and 03 time it inside a CUDA graph, whose capture a read breaks.
    Meta tensors have no values, so any read (int(), .item(), bool()) raises here."""
    meta = dict(device="meta")
    q, cache = torch.empty(2, 4, 8, **meta), torch.empty(5, 16, 2, 8, **meta)
    tables, lens = torch.empty(2, 3, dtype=torch.int32, **meta), torch.empty(2, dtype=torch.int32, **meta)
    assert paged_decode_torch(q, cache, cache, tables, lens, 0.3).shape == (2, 4, 8)


def test_store_kvcache_ref_every_slot_kept():
    """With no skipped slot the reference takes its index_copy_ path: the same cache as the Triton store."""
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    slots = torch.randperm(3 * 16, generator=g)[:5]
    bufs = [torch.full((3, 16, 2, 8), SENTINEL) for _ in range(4)]
    store_kvcache(k, v, bufs[0], bufs[1], slots)
    store_kvcache_ref(k, v, bufs[2], bufs[3], slots)
    assert torch.equal(bufs[0], bufs[2]) and torch.equal(bufs[1], bufs[3])


def test_paged_decode_padding_row_is_zero():
    """A CUDA-graph padding row has context length 0 and a table of -1: its output is 0, not NaN."""
    _, _, k_cache, v_cache, _, _, tables = make_paged([20], 2, 16, 16, torch.float32)
    tables = torch.cat([tables, torch.full_like(tables, -1)])
    q = torch.randn(2, 4, 16)
    for splits in (1, 2):
        out = paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor([20, 0], dtype=torch.int32), 0.25,
                                     num_splits=splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_decode_split_rule_uses_shapes_only(monkeypatch):
    monkeypatch.setattr(pa, "num_sms", lambda device: 132)  # an H200
    cuda = torch.device("cuda")
    big = paged_decode_config(256, 8, 2, 128, 4096, 256, cuda)  # 2,048 programs: no split
    assert big["num_splits"] == 1 and big["BLOCK_N"] == pa.DECODE_CONFIGS[128][0]
    assert big["BLOCK_H"] == 16 and big["BLOCK_D"] == 128
    target = pa.SPLIT_TARGET_PROGRAMS_PER_SM * 132
    assert paged_decode_config(target // 8, 8, 2, 128, 4096, 256, cuda)["num_splits"] == 1  # on target: no split
    mid = paged_decode_config(64, 8, 2, 128, 4096, 256, cuda)  # 512 programs: split until there are enough
    assert mid["num_splits"] == -(-target // 512)
    small = paged_decode_config(1, 8, 2, 128, 4096, 256, cuda)
    assert 1 < small["num_splits"] <= pa.MAX_SPLITS
    assert paged_decode_config(1, 8, 2, 128, 256, 256, cuda)["num_splits"] == 1  # one split per MIN_SPLIT_KEYS


def test_decode_rejects_mismatched_inputs():
    _, _, k_cache, v_cache, _, _, tables = make_paged([5], 2, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(torch.randn(1, 4, 16).half(), k_cache, v_cache, tables,
                               torch.tensor([5], dtype=torch.int32), 0.25)
    with pytest.raises(ValueError, match="divisible"):
        paged_decode_attention(torch.randn(1, 3, 16), k_cache, v_cache, tables, torch.tensor([5], dtype=torch.int32), 0.25)


# ---- prefill ---------------------------------------------------------------------------------------
def _packed(lengths_q, lengths_k, H, hkv, d, block_size, dtype, device="cpu"):
    ks, vs, k_cache, v_cache, k_buf, v_buf, tables = make_paged(lengths_k, hkv, d, block_size, dtype, device=device)
    g = torch.Generator().manual_seed(3)
    qs = [torch.randn(n, H, d, generator=g).to(dtype).to(device) for n in lengths_q]
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)  # noqa: E731
    return qs, ks, vs, k_cache, v_cache, tables, cu(lengths_q), cu(lengths_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 256])
def test_prefill_with_cached_prefix_matches_sdpa(dtype, block_size):
    lengths_k = [70, 5, 33]
    cached = [48, 0, 16]  # the first tokens' K/V came from the prefix cache
    lengths_q = [k - c for k, c in zip(lengths_k, cached)]
    H, hkv, d = 4, 2, 24
    qs, ks, vs, k_cache, v_cache, tables, cu_q, cu_k = _packed(lengths_q, lengths_k, H, hkv, d, block_size, dtype)
    q = torch.cat(qs)
    out_buf = torch.full((q.shape[0] + 2, H, d), SENTINEL, dtype=dtype)
    got = prefill_attention(q, k_cache, v_cache, cu_q, cu_k, max(lengths_q), d ** -0.5, block_tables=tables,
                            out=out_buf[1:-1])
    assert (out_buf[0] == SENTINEL).all() and (out_buf[-1] == SENTINEL).all()
    want = torch.cat([sdpa_reference(qq, kk, vv) for qq, kk, vv in zip(qs, ks, vs)])
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    ref = paged_attention_ref(q, k_cache, v_cache, cu_q.tolist(), lengths_k, tables, d ** -0.5)
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_without_cache_matches_varlen_reference(dtype):
    lengths = [1, 45, 64, 19]
    H, hkv, d = 8, 2, 32
    g = torch.Generator().manual_seed(4)
    q = torch.randn(sum(lengths), H, d, generator=g).to(dtype)
    kv = torch.randn(sum(lengths), 2, hkv, d, generator=g).to(dtype)
    k, v = kv[:, 0], kv[:, 1]  # strided views, different base pointers
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    got = prefill_attention(q, k, v, cu, cu, max(lengths), d ** -0.5)
    want = varlen_attention(q, k, v, cu.tolist(), cu.tolist(), d ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


# ---- GPU: bf16 at Qwen3-0.6B shapes, CUDA graphs ----------------------------------------------------
QWEN = dict(H=16, hkv=8, d=128)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_decode_matches_sdpa(block_size, dtype):
    lengths = [1, 255, 256, 257, 1000, 4096, 3000, 77]
    ks, vs, k_cache, v_cache, _, _, tables = make_paged(lengths, QWEN["hkv"], QWEN["d"], block_size, dtype, "cuda")
    q = torch.randn(len(lengths), QWEN["H"], QWEN["d"], device="cuda").to(dtype)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    want = torch.stack([sdpa_reference(q[i:i + 1], ks[i], vs[i])[0] for i in range(len(lengths))])
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    for splits in (None, 1, 4):
        got = paged_decode_attention(q, k_cache, v_cache, tables, lens, QWEN["d"] ** -0.5, num_splits=splits)
        torch.testing.assert_close(got.float(), want, **tol)


@pytest.mark.gpu
def test_gpu_store_and_prefill_bf16():
    dtype = torch.bfloat16
    lengths_k, cached = [700, 300, 1024], [512, 0, 256]
    lengths_q = [k - c for k, c in zip(lengths_k, cached)]
    qs, ks, vs, k_cache, v_cache, tables, cu_q, cu_k = _packed(lengths_q, lengths_k, QWEN["H"], QWEN["hkv"],
                                                              QWEN["d"], 256, dtype, "cuda")
    q = torch.cat(qs)
    got = prefill_attention(q, k_cache, v_cache, cu_q, cu_k, max(lengths_q), QWEN["d"] ** -0.5, block_tables=tables)
    want = torch.cat([sdpa_reference(qq, kk, vv) for qq, kk, vv in zip(qs, ks, vs)])
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    n = 4096
    k = torch.randn(n, QWEN["hkv"], QWEN["d"], device="cuda", dtype=dtype)
    slots = torch.randperm(64 * 256, device="cuda")[:n]
    slots[::7] = -1
    a = [torch.zeros(64, 256, QWEN["hkv"], QWEN["d"], device="cuda", dtype=dtype) for _ in range(4)]
    store_kvcache(k, k, a[0], a[1], slots)
    store_kvcache_ref(k, k, a[2], a[3], slots)
    assert torch.equal(a[0], a[2]) and torch.equal(a[1], a[3])


@pytest.mark.gpu
def test_gpu_decode_replays_in_a_cuda_graph():
    """Capture decode once, then change lengths and tables in place: the replay must follow them."""
    dtype, block_size, B = torch.bfloat16, 256, 4
    lengths = [300, 1, 2000, 513]
    ks, vs, k_cache, v_cache, _, _, tables = make_paged(lengths, QWEN["hkv"], QWEN["d"], block_size, dtype, "cuda",
                                                        spare_blocks=8)
    q = torch.randn(B, QWEN["H"], QWEN["d"], device="cuda", dtype=dtype)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    tables_static = torch.full((B, 16), -1, dtype=torch.int32, device="cuda")  # max context 4096
    tables_static[:, :tables.shape[1]] = tables
    out = torch.empty_like(q)
    paged_decode_attention(q, k_cache, v_cache, tables_static, lens, 0.1, out=out)  # compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k_cache, v_cache, tables_static, lens, 0.1, out=out)
    for new_lens in ([300, 1, 2000, 513], [17, 1, 1999, 512]):  # within the rows make_paged wrote
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        want = paged_decode_torch(q, k_cache, v_cache, tables_static, lens, 0.1)
        torch.testing.assert_close(out.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("kernel_name", ["add_rms_norm_kernel", "paged_decode_kernel"])
def test_pdl_only_for_an_exercise_kernel_that_waits(kernel_name, tmp_path, monkeypatch):
    """An exercise kernel is launched early (PDL) only when its code calls gdc_wait(). The stub a
    student starts from mentions gdc_wait in its docstring, and its code does not: no PDL, and
    USE_PDL is not passed (a kernel from an older stub does not declare it)."""
    import importlib.util

    from minillm.course.exercises import generated_files
    from minillm.kernels import gemv
    from minillm.kernels import rmsnorm
    reference = {"add_rms_norm_kernel": rmsnorm, "paged_decode_kernel": pa}[kernel_name]
    chapter = 2 if kernel_name == "add_rms_norm_kernel" else 3
    stub_file = tmp_path / f"stub_ch{chapter}.py"
    stub_file.write_text(generated_files()[f"exercises/ch{chapter}.py"])
    spec = importlib.util.spec_from_file_location(f"stub_ch{chapter}", stub_file)
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    cpu = torch.device("cpu")
    monkeypatch.setattr(gemv, "pdl_supported", lambda device: True)
    assert gemv.pdl_args(cpu, getattr(reference, kernel_name)) == {"USE_PDL": True, "launch_pdl": True}
    assert "gdc_wait" in getattr(stub, kernel_name).fn.__doc__
    assert gemv.pdl_args(cpu, getattr(stub, kernel_name)) == {}
    assert gemv.pdl_args(cpu) == {"USE_PDL": True, "launch_pdl": True}  # the engine's own kernels
    monkeypatch.setattr(gemv, "pdl_supported", lambda device: False)
    assert gemv.pdl_args(cpu, getattr(reference, kernel_name)) == {}
    assert gemv.pdl_args(cpu) == {"USE_PDL": False}
