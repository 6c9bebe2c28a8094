"""minillm/course/speed_ladder.py: notebook 05's batch-1 ladder switches and kernel profile."""
import os
from dataclasses import fields

import pytest
import torch
from helpers import one_torch_thread, small_engine_args  # noqa: F401

from minillm import LLM, SamplingParams
from minillm.config import EngineConfig, ModelConfig
from minillm.course import speed_ladder as sl
from minillm.kernels.gemv import pdl_supported
from minillm.model_zoo import QWEN3_06B
from minillm.models import qwen3

# kernel names from an H200 profile of the engine (tests/gpu/profile_steps.py) and their classes
H200_KERNELS = {"nvjet_sm90_tst_64x32_64x16_4x2_h_bz_TNT": "gemm", "_gemv_kernel": "gemv",
                "paged_decode_kernel": "attention", "_decode_b1_kernel": "attention",
                "paged_decode_combine_kernel": "attention", "add_rms_norm_kernel": "norm",
                "_qk_norm_rope_kernel": "qk_norm_rope", "_silu_mul_kernel": "silu",
                "_sample_chunk_kernel": "sample", "Memcpy HtoD (Pinned -> Device)": "copy",
                "void cublasLt::splitKreduce_kernel<32, 16, int, float>": "gemm",
                "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16>": "embed",
                "_pick_input_ids_kernel": "other"}


def test_kernel_classes_of_the_engines_kernels():
    assert {name: sl.kernel_class(name) for name in H200_KERNELS} == H200_KERNELS


def test_a_profile_groups_divides_and_sets_each_class_against_its_floor():
    prof = sl.KernelProfile({"_gemv_kernel": (8, 40.0), "nvjet_x": (2, 20.0), "add_rms_norm_kernel": (4, 8.0)}, 1e-3)
    assert prof.count == 14 and prof.busy_us == 68.0
    assert prof.by_class() == {"gemv": (8, 40.0), "gemm": (2, 20.0), "norm": (4, 8.0)}  # most time first
    table = prof.table(per=2, floors_us={"gemv": 5.0}, top=1).splitlines()
    gemv = next(line for line in table if line.startswith("gemv"))
    assert gemv.split()[1:4] == ["4.0", "20.0", "58.8%"] and "25% (5.0 us)" in gemv  # 5 us of 20 us per step
    assert table[-2].split()[:2] == ["all", "7.0"] and "_gemv_kernel" in table[-1]


def test_profile_kernels_says_it_needs_a_gpu_on_a_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        sl.profile_kernels(lambda: None)


def _layer_forward(llm):
    return llm.engine.model_runner.model.model.layers[0].layer_forward


def test_layer_path_chooses_the_layer_an_engine_is_built_with_and_only_inside():
    if os.environ.get("TRITON_INTERPRET") != "1":  # the CPU suite turns it on (conftest)
        pytest.skip("a CPU engine's fused kernels need Triton's interpreter, which this run has turned off")
    with sl.layer_path("fused"):
        fused = LLM("qwen3-tiny", **small_engine_args())
    plain = LLM("qwen3-tiny", **small_engine_args())
    try:
        assert _layer_forward(fused) is qwen3.decoder_layer_fused
        assert _layer_forward(plain) is qwen3.eager_decoder_layer  # a CPU engine's own choice
        # the fused kernels (interpreted here) compute chapter 2's math: the same greedy tokens
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        prompt = list(range(100, 140))
        assert (fused.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
                == plain.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids)
    finally:
        fused.shutdown()
        plain.shutdown()
    with pytest.raises(ValueError, match="choose one of torch, fused, gemv, b1"):
        with sl.layer_path("megakernel"):
            pass


def test_pdl_switch_sets_and_restores_minillm_pdl():
    before = os.environ.get("MINILLM_PDL")
    with sl.pdl(False):
        assert os.environ["MINILLM_PDL"] == "0"
        assert not pdl_supported(torch.device("cpu"))
    assert os.environ.get("MINILLM_PDL") == before


def test_each_rung_adds_one_lever_and_the_last_is_the_engine_as_it_ships():
    levers = [f.name for f in fields(sl.Rung) if f.name != "name"]
    for lower, upper in zip(sl.LADDER, sl.LADDER[1:]):
        changed = [k for k in levers if getattr(lower, k) != getattr(upper, k)]
        assert len(changed) == 1, (lower.name, upper.name, changed)
    top = sl.LADDER[-1]
    assert top.engine_kwargs() == {"enforce_eager": False, "async_scheduling": True} and top.pdl
    defaults = EngineConfig.__dataclass_fields__
    assert defaults["enforce_eager"].default is False and defaults["async_scheduling"].default is True
    triton_backend = type("Backend", (), {"name": "triton"})
    qwen3_06b = ModelConfig.from_dict(dict(QWEN3_06B, model_type="qwen3"))
    shipped = qwen3.layer_forward_for("cuda", triton_backend, 1, qwen3_06b)
    assert (shipped.func, shipped.keywords) == (sl.LAYER_PATHS[top.layer].func, sl.LAYER_PATHS[top.layer].keywords)


@pytest.mark.gpu
def test_profile_kernels_counts_the_kernels_a_cuda_graph_replays():
    """Section 7 counts kernels per token inside CUDA graphs: a graph of 3 matmuls and 2 adds is at
    least 3 GEMM and 5 kernel launches per replay to the profiler, and two replays twice one's."""
    a = torch.randn(256, 256, device="cuda")
    (a @ a) @ a + 1.0  # cuBLAS sets up its handle and workspace on first use, which a capture must not see
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        c = (a @ a) @ a + 1.0
        d = c @ a + 2.0  # noqa: F841 (only the kernels matter)
    once = sl.profile_kernels(graph.replay)
    twice = sl.profile_kernels(lambda: [graph.replay() for _ in range(2)])
    assert once.by_class()["gemm"][0] >= 3 and once.count >= 5, once.table(top=10)
    assert twice.count == 2 * once.count and twice.by_class()["gemm"][0] == 2 * once.by_class()["gemm"][0]


def test_batch1_ablation_says_it_needs_cuda_graphs():
    """On a CPU engine (no CUDA graphs) the ablation names what it needs instead of failing inside."""
    llm = LLM("qwen3-tiny", **small_engine_args())
    try:
        with pytest.raises(ValueError, match="CUDA-graph replays"):
            sl.batch1_ablation(llm, [1, 2, 3], n_tokens=2)
    finally:
        llm.shutdown()


def test_ablations_replace_only_inside_and_restore():
    """Each variant's replacements hold while its graph is captured and are undone after, even when
    the capture fails."""
    kernel = sl.decode_b1.paged_decode_combine_kernel
    attention = qwen3.decode_attention_b1
    with pytest.raises(RuntimeError):
        with sl._replaced(sl.ABLATIONS["no split merge (wrong output)"]):
            assert isinstance(sl.decode_b1.paged_decode_combine_kernel, sl._NoLaunch)
            raise RuntimeError("capture failed")
    with sl._replaced(sl.ABLATIONS["no attention (wrong output)"]):
        out = qwen3.decode_attention_b1(torch.zeros(1, 64), *([None] * 11), 4, 2, 16)
        assert out.shape == (1, 4, 16)
    assert sl.decode_b1.paged_decode_combine_kernel is kernel and qwen3.decode_attention_b1 is attention


@pytest.mark.gpu
def test_batch1_ablation_times_each_variant_and_leaves_the_engine_as_it_was():
    """Notebook 05's ablation: every variant timed, the step without attention the fastest of them, and
    the engine generating the same greedy tokens after as before (its own graphs and logits intact)."""
    llm = LLM("qwen3-0.6b-random", dtype="bfloat16", max_model_len=1024, max_num_seqs=4)
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
        before = llm.generate([5, 6, 7, 8], greedy, use_tqdm=False)[0].outputs[0]
        us = sl.batch1_ablation(llm, list(range(100, 228)), n_tokens=32)
        after = llm.generate([5, 6, 7, 8], greedy, use_tqdm=False)[0].outputs[0]
        assert list(us) == list(sl.ABLATIONS) and all(t > 0 for t in us.values()), us
        assert us["no attention (wrong output)"] < us["the engine's step"], us
        assert after.token_ids == before.token_ids
        assert [lp[t].logprob for lp, t in zip(after.logprobs, after.token_ids)] == \
               [lp[t].logprob for lp, t in zip(before.logprobs, before.token_ids)]
    finally:
        llm.shutdown()
