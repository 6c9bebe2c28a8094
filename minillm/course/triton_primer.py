"""The Triton primer's kernels (notebooks/02a_triton_primer.ipynb, exercises 2.7-2.11): five small
kernels on a ladder, each the smallest instance of one idea that the course's real kernels use.

    2.7  add_kernel             a 1-D grid of programs, block offsets, a mask on the tail
    2.8  softmax_kernel         one program per row: a reduction held in registers
    2.9  gather_pages_kernel    a gather through an index table (the KV cache's block table)
    2.10 matmul_kernel          2-D tiles, tl.dot, an fp32 accumulator carried over the K loop
    2.11 online_softmax_kernel  a softmax-weighted sum over tiles with a running max and sum (3.5's heart)

These are course material, not engine code: nothing in the engine calls them (exercise 2.12's
add+RMSNorm kernel and chapter 3's kernels are the real ones). Each kernel has a given launcher
(torch tensors in, a torch tensor out, with an optional `out=` to write into) and a torch reference
beside it (`*_ref`). The student writes the kernel bodies.

On a machine without CUDA they run in Triton's interpreter: importing minillm.kernels (below) sets
TRITON_INTERPRET=1 before the kernels here are defined. There, compute in fp32 (bf16 arithmetic is
wrong in the interpreter) and mask every load and store: the interpreter reads junk out of bounds
and writes there silently, which the graded tests catch with guard regions around every tensor.
"""
from __future__ import annotations

import math

import torch

import minillm.kernels  # noqa: F401,I001  (first: sets TRITON_INTERPRET=1 without CUDA, before triton is imported)
import triton
import triton.language as tl

# Launch configurations. The tests pass small blocks so that tiny inputs still span several
# programs and end in a partial tile; these defaults are what the notebook times on a GPU.
ADD_BLOCK = 1024  # elements per program of the vector add: 4 warps x 32 threads x 8 elements
GATHER_BLOCK_T = 8  # tokens per program of the page gather
ONLINE_BLOCK_N = 64  # keys per tile of the online softmax
MATMUL_TILES_CUDA = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
MATMUL_TILES_CPU = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)  # tl.dot needs every dim >= 16 on a GPU
MIN_DOT_DIM = 16
BYTES_PER_THREAD_LOAD = 16  # one 128-bit load per thread: the widest a GPU thread issues
THREADS_PER_WARP = 32
MAX_WARPS = 16


def _warps_for(block: int, itemsize: int) -> int:
    """Warps for a program that loads `block` elements: one 16-byte load per thread, 1 to 16 warps."""
    return min(max(block * itemsize // (BYTES_PER_THREAD_LOAD * THREADS_PER_WARP), 1), MAX_WARPS)


def _output(out: torch.Tensor | None, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """`out` checked against the shape and dtype the launcher writes, or a new contiguous tensor."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(shape)} {like.dtype} with a contiguous last dimension, got "
                         f"{tuple(out.shape)} {out.dtype} with strides {out.stride()}")
    return out


# ---- references (torch) ---------------------------------------------------------------------------
def vector_add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x, y: [n] -> x + y [n]."""
    return x + y


def softmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [R, C] -> softmax over each row, computed in fp32, [R, C] in x.dtype."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def gather_pages_ref(cache: torch.Tensor, page_table: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """cache: [num_pages, PAGE, d]; page_table: [max_pages] int (-1 past the last page in use) ->
    [n_tokens, d]: token t is row t % PAGE of page page_table[t // PAGE]."""
    page = cache.shape[1]
    pos = torch.arange(n_tokens, device=cache.device)
    return cache[page_table.long()[pos // page], pos % page]


def matmul_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: [M, K] @ b: [K, N] -> [M, N] in a.dtype, accumulated in fp32."""
    return (a.float() @ b.float()).to(a.dtype)


def softmax_weighted_sum_ref(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """scores: [R, L], values: [L, D] -> softmax(scores, -1) @ values, [R, D] in values.dtype
    (one attention output per row of scores: the rows are queries, the columns keys)."""
    return (torch.softmax(scores.float(), dim=-1) @ values.float()).to(values.dtype)


# >>> exercise 2.7 | notebooks/02a_triton_primer.ipynb | 1. Programs, offsets and masks: a vector add
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for i < n. Program p (p = tl.program_id(0)) owns elements
    p*BLOCK .. p*BLOCK + BLOCK - 1; the launcher starts cdiv(n, BLOCK) programs, so the last one
    may run past n. x_ptr, y_ptr, out_ptr: contiguous [n], one dtype.

    Hints: offsets = p * BLOCK + tl.arange(0, BLOCK); mask = offsets < n on the loads and on the
    store (lanes past n must read nothing and write nothing: another tensor may live there).
    """
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# exercise: given
def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = ADD_BLOCK, out: torch.Tensor | None = None):
    """x, y: [n] contiguous, same dtype -> x + y [n] (written into `out` if given), by add_kernel
    with cdiv(n, block) programs of `block` elements (block: a power of two)."""
    if x.shape != y.shape or x.dim() != 1 or x.dtype != y.dtype or not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError(f"vector_add needs two contiguous 1-D tensors of one shape and dtype, got "
                         f"{tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype}")
    n = x.numel()
    out = _output(out, (n,), x)
    if n:
        add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out
# <<< exercise 2.7


# >>> exercise 2.8 | notebooks/02a_triton_primer.ipynb | 2. One program per row: softmax
@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """Softmax of one row per program (row = tl.program_id(0)), the whole row held in registers:
        out[row, :] = exp(x[row, :] - max) / sum(exp(x[row, :] - max))
    x_ptr: [n_rows, n_cols], rows `stride_x` elements apart (columns contiguous); out_ptr: rows
    `stride_out` apart. BLOCK_N: a power of two >= n_cols. Compute in fp32; store in out's dtype.

    Hints: cols = tl.arange(0, BLOCK_N), mask = cols < n_cols. The lanes past n_cols must not
    count: load them as -inf (other=float("-inf")), so exp gives 0 there. Subtract the row's max
    (tl.max(x, axis=0)) before tl.exp: exp(89) already overflows fp32. tl.sum(e, axis=0).
    Row offsets come from the strides, not from n_cols (a row may be a slice of a wider tensor).
    """
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride overflows int32 past 2 GiB
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    out = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


# exercise: given
def softmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [R, C] (columns contiguous) -> softmax over each row [R, C] in x.dtype (into `out` if
    given), by softmax_kernel with one program per row."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"softmax_rows needs a 2-D tensor with contiguous rows, got {tuple(x.shape)} "
                         f"with strides {x.stride()}")
    rows, cols = x.shape
    out = _output(out, (rows, cols), x)
    if rows and cols:
        block = triton.next_power_of_2(cols)
        softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK_N=block,
                                num_warps=_warps_for(block, x.element_size()))
    return out
# <<< exercise 2.8


# >>> exercise 2.9 | notebooks/02a_triton_primer.ipynb | 3. A gather through an index table: pages
@triton.jit
def gather_pages_kernel(cache_ptr, table_ptr, out_ptr, n_tokens, n_cols, stride_page, stride_row, stride_out,
                        PAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Copy tokens BLOCK_T at a time (program p owns tokens p*BLOCK_T .. p*BLOCK_T + BLOCK_T - 1)
    from a paged cache into a contiguous output, through the page table:
        out[t, :] = cache[table[t // PAGE], t % PAGE, :]          for t < n_tokens
    cache_ptr: [num_pages, PAGE, n_cols], element (page, row, c) at page*stride_page + row*stride_row + c;
    table_ptr: int32 page ids (entries past the last page in use are -1: never follow them);
    out_ptr: [n_tokens, n_cols], rows stride_out apart. BLOCK_D: a power of two >= n_cols.

    Hints: tokens = p * BLOCK_T + tl.arange(0, BLOCK_T) and cols = tl.arange(0, BLOCK_D) make a 2-D
    tile with tokens[:, None] and cols[None, :]. Load the page ids with tl.load(table_ptr + tokens // PAGE,
    mask=tokens < n_tokens) and cast them to int64 before multiplying by stride_page (a big cache
    overflows int32). Mask the tile on both axes, loads and store alike.
    """
    pid = tl.program_id(0)
    tokens = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    mask_t = tokens < n_tokens
    mask = mask_t[:, None] & (cols < n_cols)[None, :]
    page = tl.load(table_ptr + tokens // PAGE, mask=mask_t, other=0).to(tl.int64)
    src = page[:, None] * stride_page + (tokens % PAGE)[:, None] * stride_row + cols[None, :]
    rows = tl.load(cache_ptr + src, mask=mask)
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * stride_out + cols[None, :], rows, mask=mask)


# exercise: given
def gather_pages(cache: torch.Tensor, page_table: torch.Tensor, n_tokens: int, block_t: int = GATHER_BLOCK_T,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """cache: [num_pages, PAGE, d] (last dim contiguous); page_table: [max_pages] int32 (-1 past the
    last page in use); n_tokens <= max_pages * PAGE -> the sequence's tokens [n_tokens, d] in
    order (into `out` if given), by gather_pages_kernel with cdiv(n_tokens, block_t) programs."""
    num_pages, page, d = cache.shape
    if cache.stride(2) != 1 or page_table.dim() != 1 or page_table.dtype != torch.int32:
        raise ValueError("gather_pages needs a cache with a contiguous last dimension and a 1-D int32 page table")
    if n_tokens > page_table.numel() * page:
        raise ValueError(f"{n_tokens} tokens need {math.ceil(n_tokens / page)} pages; the table holds "
                         f"{page_table.numel()}")
    out = _output(out, (n_tokens, d), cache)
    if n_tokens:
        gather_pages_kernel[(triton.cdiv(n_tokens, block_t),)](
            cache, page_table, out, n_tokens, d, cache.stride(0), cache.stride(1), out.stride(0),
            PAGE=page, BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(d))
    return out
# <<< exercise 2.9


# >>> exercise 2.10 | notebooks/02a_triton_primer.ipynb | 4. Tiles and tl.dot: a matmul
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ B, one [BLOCK_M, BLOCK_N] tile of C per program: (pid_m, pid_n) = (tl.program_id(0),
    tl.program_id(1)) owns rows pid_m*BLOCK_M .. +BLOCK_M and columns pid_n*BLOCK_N .. +BLOCK_N.
    a_ptr: [M, K], b_ptr: [K, N], c_ptr: [M, N], each element (i, j) at i*stride_0 + j*stride_1.
    Walk K in steps of BLOCK_K: load an A tile [BLOCK_M, BLOCK_K] and a B tile [BLOCK_K, BLOCK_N],
    acc += tl.dot(a, b). Store acc in C's dtype. Every BLOCK_* is a power of two >= 16.

    Hints: keep acc in fp32 (acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)): a half-precision
    accumulator rounds at every step. The loop covers all of K, the last partial tile too
    (range(0, K, BLOCK_K)), and masks it: k = k0 + tl.arange(0, BLOCK_K), mask k < K on both tiles with
    other=0.0 (zeros add nothing to the dot). Mask rows >= M, columns >= N on the loads and the store.
    """
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k < K)[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


# exercise: given
def tiled_matmul(a: torch.Tensor, b: torch.Tensor, tiles: dict | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """a: [M, K] @ b: [K, N] (same dtype, any strides) -> [M, N] in a.dtype (into `out` if given),
    by matmul_kernel with one program per output tile. tiles: BLOCK_M/N/K (and num_warps,
    num_stages) overriding the device's defaults (MATMUL_TILES_CUDA or MATMUL_TILES_CPU)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"tiled_matmul needs [M, K] and [K, N] of one dtype, got {tuple(a.shape)} {a.dtype} "
                         f"and {tuple(b.shape)} {b.dtype}")
    cfg = {**(MATMUL_TILES_CUDA if a.is_cuda else MATMUL_TILES_CPU), **(tiles or {})}
    if min(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) < MIN_DOT_DIM:
        raise ValueError(f"tl.dot needs tiles of at least {MIN_DOT_DIM} on every side, got {cfg}")
    (M, K), N = a.shape, b.shape[1]
    out = _output(out, (M, N), a)
    if M and N:
        grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
        matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            out.stride(0), out.stride(1), **cfg)
    return out
# <<< exercise 2.10


# >>> exercise 2.11 | notebooks/02a_triton_primer.ipynb | 5. Online softmax over tiles
@triton.jit
def online_softmax_kernel(scores_ptr, values_ptr, out_ptr, n_keys, head_dim, stride_s, stride_v, stride_out,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One row (query) per program, row = tl.program_id(0), in ONE pass over its keys, BLOCK_N at a time:
        out[row, :] = sum_j softmax(scores[row, :])[j] * values[j, :]
    scores_ptr: [R, n_keys], rows stride_s apart; values_ptr: [n_keys, head_dim], rows stride_v apart;
    out_ptr: [R, head_dim], rows stride_out apart, in its own dtype. BLOCK_D: a power of two >= head_dim.
    Keep three running quantities in fp32 over the tiles seen so far: m (the max score), l (the
    sum of exp(score - m)) and acc[head_dim] (the sum of exp(score - m) * value). When a tile raises
    the max from m to m_new, everything summed so far was scaled by exp(-m): rescale l and acc by
    alpha = exp(m - m_new) before adding the tile's terms. At the end, out = acc / l.

    Hints: m = -inf (a scalar: tl.full([], float("-inf"), tl.float32) or float("-inf")), l = 0.0,
    acc = tl.zeros([BLOCK_D], dtype=tl.float32). Per tile: keys = n0 + tl.arange(0, BLOCK_N); load the
    scores with other=float("-inf") past n_keys (exp gives 0 there) and the values tile
    [BLOCK_N, BLOCK_D] with other=0.0; p = tl.exp(s - m_new); l = l * alpha + tl.sum(p, axis=0);
    acc = acc * alpha + tl.sum(p[:, None] * v, axis=0).
    """
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)  # noqa: E741  (m, l, acc: the names of the FlashAttention paper)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n_keys, BLOCK_N):
        keys = n0 + offs_n
        mask_n = keys < n_keys
        s = tl.load(scores_ptr + row * stride_s + keys, mask=mask_n, other=float("-inf")).to(tl.float32)
        v = tl.load(values_ptr + keys.to(tl.int64)[:, None] * stride_v + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)  # exp(-inf) = 0 on the first tile: nothing to rescale yet
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)  # noqa: E741
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + row * stride_out + offs_d, (acc / l).to(out_ptr.dtype.element_ty), mask=mask_d)


# exercise: given
def softmax_weighted_sum(scores: torch.Tensor, values: torch.Tensor, block_n: int = ONLINE_BLOCK_N,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """scores: [R, L], values: [L, D] (last dims contiguous, L >= 1) -> softmax(scores, -1) @ values,
    [R, D] in values.dtype (into `out` if given), by online_softmax_kernel: one program per row,
    `block_n` keys per tile."""
    if scores.dim() != 2 or values.dim() != 2 or scores.shape[1] != values.shape[0] or scores.shape[1] == 0:
        raise ValueError(f"softmax_weighted_sum needs scores [R, L] and values [L, D] with L >= 1, got "
                         f"{tuple(scores.shape)} and {tuple(values.shape)}")
    if scores.stride(1) != 1 or values.stride(1) != 1:
        raise ValueError("softmax_weighted_sum needs contiguous last dimensions")
    (rows, n_keys), d = scores.shape, values.shape[1]
    out = _output(out, (rows, d), values)
    if rows and d:
        online_softmax_kernel[(rows,)](scores, values, out, n_keys, d, scores.stride(0), values.stride(0),
                                       out.stride(0), BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d))
    return out
# <<< exercise 2.11


# ---- check your understanding: the questions that end the notebook -------------------------------
# Registered with minillm.course.questions as notebook "02a"; the notebook's last cell checks the
# reader's answers with check_answers("02a", ANSWERS). The expected values are computed here from
# the questions' givens; the worked answers are in notebooks/lecturer/02a_triton_primer.md.
QWEN3_VOCAB = 151_936
QWEN3_KV_WIDTH = 1024  # Qwen3-0.6B: 8 KV heads x head_dim 128 = its hidden size too
BF16_BYTES = 2
Q6_BANDWIDTH = 4.2e12  # bytes per second: about an H200's measured copy bandwidth
Q1_N, Q1_BLOCK = 1_000_000, 1024
Q3_PAGE, Q3_TABLE, Q3_TOKEN, Q3_COLUMN = 256, (7, 2, 9, 4), 700, 5
Q4_SIZE, Q4_TILE, Q4_BLOCK_K = 4096, 128, 64
Q5_M, Q5_L, Q5_TILE = 2.0, 3.0, (5.0, 1.0)
Q6_ROWS = 16_384


def _q3_offset(page: int) -> int:
    """Element offset of column Q3_COLUMN of token Q3_TOKEN's row in `page` of a contiguous K cache."""
    return page * Q3_PAGE * QWEN3_KV_WIDTH + (Q3_TOKEN % Q3_PAGE) * QWEN3_KV_WIDTH + Q3_COLUMN


def _q5_new_l(rescale: bool = True) -> float:
    """The running sum after Q5_TILE: the old sum rescaled to the new max, plus the tile's terms."""
    m_new = max(Q5_M, *Q5_TILE)
    return Q5_L * (math.exp(Q5_M - m_new) if rescale else 1.0) + sum(math.exp(s - m_new) for s in Q5_TILE)


def _norm_bytes(passes: int) -> int:
    """bf16 bytes of add+RMSNorm over [Q6_ROWS, 1024] moving `passes` whole tensors, plus the weight."""
    return (passes * Q6_ROWS * QWEN3_KV_WIDTH + QWEN3_KV_WIDTH) * BF16_BYTES


def _primer_questions():
    from minillm.course.questions import PERCENT_TOL, Approx, Part, Question
    block_n = triton.next_power_of_2(QWEN3_VOCAB)
    return [
        Question("q1", "vector add of 1,000,000 elements in blocks of 1024: programs, masked lanes of the last", (
            Part(lambda: math.ceil(Q1_N / Q1_BLOCK), label="programs",
                 hint="every element needs a program, and the last block may be partly empty",
                 traps=lambda: [(Q1_N // Q1_BLOCK, "the launcher rounds up (triton.cdiv): the elements past the last "
                                                   "full block need a program too")]),
            Part(lambda: math.ceil(Q1_N / Q1_BLOCK) * Q1_BLOCK - Q1_N, label="masked lanes",
                 hint="the last program's block starts at (programs - 1) * BLOCK; count its lanes at or past n",
                 traps=lambda: [(Q1_N - (math.ceil(Q1_N / Q1_BLOCK) - 1) * Q1_BLOCK,
                                 "those are the lanes of the last program that do work; the question asks for the "
                                 "ones the mask switches off")]),
        )),
        Question("q2", "one program per row of Qwen3's 151,936 logits: BLOCK_N, percent of lanes masked", (
            Part(lambda: block_n, label="BLOCK_N",
                 hint="a block is a power of two, at least as long as the row",
                 traps=lambda: [(QWEN3_VOCAB, "tl.arange needs a power of two: round the row length up"),
                                (block_n // 2, "that power of two is shorter than the row")]),
            Part(lambda: 100 * (block_n - QWEN3_VOCAB) / block_n, Approx(rel=0, abs=PERCENT_TOL),
                 label="percent masked", hint="masked lanes are the block's lanes past the row's end, over BLOCK_N",
                 traps=lambda: [(100 * QWEN3_VOCAB / block_n, "that is the share of lanes in use"),
                                ((block_n - QWEN3_VOCAB) / block_n, "give it in percent (0 to 100)")]),
        )),
        Question("q3", "token 700 through page table [7, 2, 9, 4], pages of 256: physical page, row, offset of "
                       "column 5", (
            Part(lambda: Q3_TABLE[Q3_TOKEN // Q3_PAGE], label="page",
                 hint="the logical page is the token // the page size; the table maps it to the physical one",
                 traps=lambda: [(Q3_TOKEN // Q3_PAGE, "that is the logical page: look it up in the table")]),
            Part(lambda: Q3_TOKEN % Q3_PAGE, label="row",
                 hint="the row within the page is what remains of the token after its whole pages"),
            Part(lambda: _q3_offset(Q3_TABLE[Q3_TOKEN // Q3_PAGE]), label="offset",
                 hint="offset = page * stride_page + row * stride_row + column, with the strides of a contiguous "
                      "[num_pages, 256, 1024] cache",
                 traps=lambda: [(_q3_offset(Q3_TOKEN // Q3_PAGE), "the offset uses the physical page, not the "
                                                                  "logical one")]),
        )),
        Question("q4", "4096-cubed matmul in 128 x 128 tiles, BLOCK_K 64: programs, K steps, loads of each A element", (
            Part(lambda: (Q4_SIZE // Q4_TILE) ** 2, label="programs",
                 hint="one program per tile of C, a grid in two dimensions",
                 traps=lambda: [(Q4_SIZE // Q4_TILE, "that is one side of the grid: it has two")]),
            Part(lambda: Q4_SIZE // Q4_BLOCK_K, label="K steps", hint="each program walks all of K, BLOCK_K at a time"),
            Part(lambda: Q4_SIZE // Q4_TILE, label="loads of each A element",
                 hint="which programs read a given row strip of A? all those of one row of the grid",
                 traps=lambda: [(Q4_SIZE // Q4_BLOCK_K, "that is the number of K steps of one program; count the "
                                                        "programs that read the same A tile"),
                                (1, "only an ideal cache reads each element once: every program loads its own tiles")]),
        )),
        Question("q5", "online softmax at m = 2, l = 3, next tile [5, 1]: the rescale factor, then l", (
            Part(lambda: math.exp(Q5_M - max(Q5_M, *Q5_TILE)), Approx(), label="alpha",
                 hint="alpha carries the old terms from the old max to the new one: exp(m_old - m_new)",
                 traps=lambda: [(math.exp(max(Q5_M, *Q5_TILE) - Q5_M), "turn it over: exp(m_old - m_new), below 1 "
                                                                       "when the max grows")]),
            Part(lambda: _q5_new_l(), Approx(), label="new l",
                 hint="l_new = l * alpha + the tile's exp(s - m_new)",
                 traps=lambda: [(_q5_new_l(rescale=False), "the old sum must be rescaled by alpha before the tile's "
                                                           "terms are added")]),
        )),
        Question("q6", "add+RMSNorm over [16384, 1024] bf16: bytes fused, bytes after a separate add, the µs "
                       "between", (
            Part(lambda: _norm_bytes(4), Approx(), label="fused bytes",
                 hint="the fused kernel reads x, the residual and the weight, and writes the output and the new "
                      "residual, once each",
                 traps=lambda: [(_norm_bytes(4) // BF16_BYTES, "count bytes: bf16 is two per element"),
                                (_norm_bytes(2), "four [N, d] tensors cross memory: two read, two written")]),
            Part(lambda: _norm_bytes(5), Approx(), label="unfused bytes",
                 hint="the add reads x and the residual and writes h; the norm then reads h and writes the output",
                 traps=lambda: [(_norm_bytes(6), "the add's output h is the new residual: nothing else is written")]),
            Part(lambda: (_norm_bytes(5) - _norm_bytes(4)) / Q6_BANDWIDTH * 1e6, Approx(), label="µs",
                 hint="the difference in bytes over 4.2e12 bytes per second, in microseconds"),
        )),
    ]


def _register_questions() -> None:
    from minillm.course.questions import register
    register("02a", _primer_questions())


_register_questions()
