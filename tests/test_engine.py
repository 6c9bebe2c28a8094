"""The engine against transformers: greedy tokens equal HF `generate`, batching, prefix caching
and preemption change nothing."""
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import TINY_MODELS, greedy_reference, ref_path, small_engine_args
from minillm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def reference():
    return greedy_reference()


@pytest.mark.parametrize("name", TINY_MODELS)
def test_greedy_equals_stored_hf_tokens(name, reference):
    llm = LLM(ref_path(name), **small_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=reference["max_new_tokens"], ignore_eos=True)
    out = llm.generate(reference["prompts"], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == reference["tokens"][name]


@pytest.mark.parametrize("name", TINY_MODELS)
def test_greedy_equals_live_hf_generate(name, reference):
    """The same comparison against transformers run now (not the stored file)."""
    hf = AutoModelForCausalLM.from_pretrained(ref_path(name), dtype=torch.float32).eval()
    prompts = reference["prompts"][:4]
    llm = LLM(ref_path(name), **small_engine_args())
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    for p, o in zip(prompts, out):
        want = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):]
        assert o.outputs[0].token_ids == want.tolist()


def test_qwen3_tiny_with_real_vocabulary_equals_hf():
    """The embedded qwen3-tiny (real Qwen tokenizer, 151,936-row vocabulary) against HF, text prompts."""
    llm = LLM("qwen3-tiny", **small_engine_args())
    hf = AutoModelForCausalLM.from_pretrained(llm.model_path, dtype=torch.float32).eval()
    prompts = ["Hello", "The capital of France is", "1 2 3 4 5 6 7 8", "def fib(n):\n    return"]
    out = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    for p, o in zip(prompts, out):
        ids = llm.tokenizer.encode(p)
        want = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids):]
        assert o.outputs[0].token_ids == want.tolist()
        assert o.outputs[0].text == llm.tokenizer.decode(o.outputs[0].token_ids)


def test_vllm_prompt_dicts_and_get_tokenizer():
    """vLLM's TextPrompt / TokensPrompt dicts run as the text or ids they hold, in generate and stream;
    get_tokenizer() encodes as transformers' tokenizer of the same folder does."""
    from transformers import AutoTokenizer

    from minillm.inputs import TextPrompt, TokensPrompt  # vllm.inputs' names: plain dicts
    assert TokensPrompt(prompt_token_ids=[1]) == {"prompt_token_ids": [1]} and TextPrompt(prompt="a") == {"prompt": "a"}
    llm = LLM("qwen3-tiny", **small_engine_args())
    text = "The capital of France is"
    ids = AutoTokenizer.from_pretrained(llm.model_path).encode(text)
    assert llm.get_tokenizer().encode(text) == ids
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain = llm.generate([text, ids], params, use_tqdm=False)
    dicts = llm.generate([TextPrompt(prompt=text), TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in dicts] == [o.outputs[0].token_ids for o in plain]
    assert dicts[0].prompt == text and dicts[1].prompt is None and dicts[1].prompt_token_ids == ids
    one = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)  # one dict: one prompt
    assert len(one) == 1 and one[0].outputs[0].token_ids == plain[1].outputs[0].token_ids
    assert "".join(llm.stream({"prompt": text}, params)) == plain[0].outputs[0].text
    for bad, says in [({"prompt": text, "prompt_token_ids": ids}, "exactly one of"),
                      ({"prompt": text, "multi_modal_data": {}}, "exactly one of"),
                      ({"role": "user", "content": text}, "llm.chat"), ({"prompt": ""}, "empty")]:
        with pytest.raises(ValueError, match=says):
            llm.generate(bad, params, use_tqdm=False)
    llm.shutdown()


def test_smollm2_greedy_equals_hf_for_32_tokens():
    llm = LLM("smollm2-135m", **small_engine_args(max_model_len=512))
    hf = AutoModelForCausalLM.from_pretrained(llm.model_path, dtype=torch.float32).eval()
    convs = [[{"role": "user", "content": q}] for q in
             ("What is the capital of France?", "Name three colors.", "Write a haiku about the sea.",
              "How many legs does a spider have?")]
    prompts = [llm.tokenizer.encode_chat(c) for c in convs]
    assert len({len(p) for p in prompts}) > 1  # different lengths in one batch
    out = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    for p, o in zip(prompts, out):
        want = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):]
        assert o.outputs[0].token_ids == want.tolist()
    answer = llm.chat(convs[0], SamplingParams(temperature=0.0, max_tokens=20))[0]
    assert "Paris" in answer.outputs[0].text


def test_a_cpu_engine_keeps_its_weight_matrices_column_major():
    """On a CPU the engine stores each matrix transposed in memory (strides (1, out)), the layout MKL's
    one-token matmul streams fastest; the values are the checkpoint's."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    model = llm.engine.model_runner.model
    matrices = [p for p in model.parameters() if p.dim() == 2]
    assert matrices and all(p.stride() == (1, p.shape[0]) for p in matrices)
    hf = AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3"), dtype=model.lm_head.weight.dtype)
    attn = hf.model.layers[0].self_attn
    want = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.weight, want)
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)
    llm.shutdown()


def test_batched_equals_one_at_a_time(reference):
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    prompts = reference["prompts"]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    single = [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert batched == single


def test_prefix_caching_hits_and_changes_nothing():
    system = list(range(10, 80))  # 70 shared tokens: 4 full blocks of 16
    prompts = [system + [100 + i, 200 + i, 300 + i] for i in range(4)]
    plain = LLM(ref_path("tiny-qwen3"), **small_engine_args(enable_prefix_caching=False))
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
    cached = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    cached.generate(prompts[:1], GREEDY, use_tqdm=False)  # warms the cache with the shared prefix
    bm = cached.engine.scheduler.block_manager
    before = bm.num_cached_tokens_total
    got = [o.outputs[0].token_ids for o in cached.generate(prompts, GREEDY, use_tqdm=False)]
    assert got == want
    assert bm.num_cached_tokens_total - before >= 4 * 64  # every prompt reused its 4 full prefix blocks


def test_reset_prefix_cache_empties_it_and_refuses_while_blocks_are_held():
    # vLLM's LLM.reset_prefix_cache: True and no hits after it; False, the cache kept, while a request runs
    prompt = list(range(10, 80)) + [100]  # 4 full blocks of 16 before the block of the last token
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    first = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 64
    assert llm.reset_prefix_cache() is True
    again = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    running = llm.engine.add_request(prompt, GREEDY)
    llm.engine.step()  # a running request holds its blocks until it finishes or is aborted
    with pytest.warns(UserWarning, match="still hold KV-cache blocks"):
        assert llm.reset_prefix_cache() is False
    llm.engine.abort(running)
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 64  # the refused reset kept it
    llm.shutdown()


def test_preemption_under_kv_pressure_finishes_every_request(reference):
    prompts = reference["prompts"]
    roomy = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    want = [o.outputs[0].token_ids for o in roomy.generate(prompts, SamplingParams(temperature=0.0, max_tokens=48,
                                                                           ignore_eos=True), use_tqdm=False)]
    # 16 blocks x 16 tokens: one 256-token sequence fits, the five together (~370 tokens) do not
    tight = LLM(ref_path("tiny-qwen3"), **small_engine_args(num_kvcache_blocks=16))
    got = tight.generate(prompts, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True), use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in got] == want
    assert all(o.outputs[0].finish_reason == "length" for o in got)
    assert tight.engine.scheduler.block_manager.num_free_blocks == 16  # every block came back


def test_outputs_keep_input_order_and_per_prompt_params():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    prompts = [[5] * 30, [6], [7] * 10]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 9, 5)]
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [3, 9, 5]


def test_stop_token_ids_and_max_model_len():
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(max_model_len=64))
    first = llm.generate([3, 4, 5], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].token_ids
    stop_at = first[4]
    out = llm.generate([3, 4, 5], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                                 stop_token_ids=[stop_at]), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == first[:first.index(stop_at) + 1] and out.outputs[0].finish_reason == "stop"
    long = llm.generate([3] * 60, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True), use_tqdm=False)[0]
    assert len(long.outputs[0].token_ids) == 4 and long.outputs[0].finish_reason == "length"  # 60 + 4 = max_model_len


def test_eos_stops_generation():
    ref = greedy_reference()
    name = "tiny-qwen3"
    tokens = ref["tokens"][name][1]
    # make the model's 3rd greedy token count as EOS: generation must stop right there
    llm = LLM(ref_path(name), **small_engine_args())
    llm.engine.eos_token_ids = {tokens[2]}
    out = llm.generate(ref["prompts"][1], SamplingParams(temperature=0.0, max_tokens=20), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == tokens[:3] and out.outputs[0].finish_reason == "stop"


def test_stream_yields_the_generated_text():
    llm = LLM("qwen3-tiny", **small_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    streamed = "".join(llm.stream("Once upon a time", params))
    assert streamed == llm.generate("Once upon a time", params, use_tqdm=False)[0].outputs[0].text


def test_stop_strings_cut_the_text():
    llm = LLM("qwen3-tiny", **small_engine_args())
    full = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0]
    stop = full.outputs[0].text[len(full.outputs[0].text) // 2:][:3]
    assert stop.strip()
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                          stop=[stop]), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "stop" and stop not in out.outputs[0].text
    assert full.outputs[0].text.startswith(out.outputs[0].text)


def test_async_scheduling_gives_the_same_outputs_as_sync():
    """Reading tokens back one step late must change nothing: stop tokens, max_tokens, preemption."""
    ref = greedy_reference()
    prompts = ref["prompts"]
    stop_tok = ref["tokens"]["tiny-qwen3"][2][5]  # stops prompt 2 after 6 tokens
    params = [SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop_token_ids=[stop_tok]),
              SamplingParams(temperature=0.8, max_tokens=60, ignore_eos=True, seed=7),
              SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)]
    outs = {}
    for mode in (True, False):
        llm = LLM(ref_path("tiny-qwen3"), **small_engine_args(num_kvcache_blocks=16, async_scheduling=mode))
        outs[mode] = llm.generate(prompts, params, use_tqdm=False)
        assert llm.engine.scheduler.num_preemptions > 0
        assert llm.engine.scheduler.block_manager.num_free_blocks == 16
    assert outs[True] == outs[False]
    assert outs[True][2].outputs[0].token_ids[-1] == stop_tok and outs[True][2].outputs[0].finish_reason == "stop"
    assert len(outs[True][1].outputs[0].token_ids) == 1


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_phase_seconds_are_charged_with_and_without_async(async_scheduling):
    """The engine's prefill/decode wall-time counters (the bench's phase split) count every step."""
    llm = LLM(ref_path("tiny-qwen3"), async_scheduling=async_scheduling, **small_engine_args())
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    seconds = llm.engine.phase_seconds
    assert seconds["prefill"] > 0 and seconds["decode"] > 0, seconds


def test_a_sharded_checkpoint_reads_only_the_files_its_index_names(tmp_path):
    """transformers' save_pretrained shards with an index; a stray consolidated.safetensors beside the
    shards (as some hub repositories carry) is not part of the checkpoint, as for transformers."""
    import shutil

    from safetensors.torch import save_file
    AutoModelForCausalLM.from_pretrained(ref_path("tiny-qwen3")).save_pretrained(tmp_path, max_shard_size="200KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) >= 2 and (tmp_path / "model.safetensors.index.json").exists()
    save_file({"junk": torch.zeros(3)}, str(tmp_path / "consolidated.safetensors"))
    ref = greedy_reference()
    llm = LLM(str(tmp_path), **small_engine_args())
    params = SamplingParams(temperature=0.0, max_tokens=ref["max_new_tokens"], ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(ref["prompts"], params, use_tqdm=False)] == ref["tokens"]["tiny-qwen3"]
    llm.shutdown()
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shutil.move(str(shard), str(tmp_path / "elsewhere.bin"))
    with pytest.raises(ValueError, match=rf"index.json names \['{shard.name}'\], which this folder lacks"):
        LLM(str(tmp_path), **small_engine_args())


def test_generation_config_sets_the_default_sampling_params(tmp_path):
    """vLLM's generation_config="auto": generate without SamplingParams samples with the model's
    generation_config.json (the fields transformers' GenerationConfig reads there); "vllm" ignores it."""
    import json
    import shutil

    from transformers import GenerationConfig
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(ref_path("tiny-qwen3"), name), tmp_path / name)
    gen = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1,
           "max_new_tokens": 7, "do_sample": True, "eos_token_id": 2}
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    hf = GenerationConfig.from_pretrained(tmp_path)
    llm = LLM(str(tmp_path), **small_engine_args())
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.repetition_penalty, d.max_tokens) == (
        hf.temperature, hf.top_k, hf.top_p, hf.min_p, hf.repetition_penalty, hf.max_new_tokens)
    out = llm.generate([[1, 2, 3]], use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 7 or out.outputs[0].finish_reason == "stop"
    llm.shutdown()
    plain = LLM(str(tmp_path), generation_config="vllm", **small_engine_args())
    assert plain.get_default_sampling_params() == SamplingParams()
    plain.shutdown()
    (tmp_path / "generation_config.json").write_text(json.dumps(dict(gen, top_p=1.5)))
    with pytest.raises(ValueError, match=r"generation_config.json: SamplingParams.top_p must be .*generation_config='vllm'"):
        LLM(str(tmp_path), **small_engine_args())


def test_decode_batches_run_longest_context_first(monkeypatch):
    """Each decode step hands the runner its sequences longest context first (the decode kernel's long
    programs start first), and the outputs are those of prompts given in any order."""
    llm = LLM(ref_path("tiny-qwen3"), **small_engine_args())
    runner, orders = llm.engine.model_runner, []
    launch = runner.launch

    def recording_launch(seqs, is_prefill, *args):
        if not is_prefill:
            orders.append([s.num_tokens for s in seqs])
        return launch(seqs, is_prefill, *args)
    monkeypatch.setattr(runner, "launch", recording_launch)
    prompts = [[1, 2, 3], list(range(1, 40)), list(range(5, 17)), list(range(2, 30))]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert orders and any(len(o) > 1 for o in orders)
    assert all(o == sorted(o, reverse=True) for o in orders), orders
    assert orders[0] != [len(p) for p in prompts]  # not the order the prompts came in
    one_by_one = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == one_by_one


# ---- stop tokens, stop strings with min_tokens, max_tokens=None, chat prompts (vLLM's semantics) -----
STORY = "Once upon a time"


@pytest.fixture(scope="module")
def qwen():
    llm = LLM("qwen3-tiny", **small_engine_args(max_model_len=64))
    yield llm
    llm.shutdown()


def _streamed(llm, prompt, params):
    """(the stream's text deltas joined, its final RequestOutput)."""
    with llm.stream(prompt, params) as stream:
        text = "".join(stream)
    return text, stream.output


def test_a_stop_tokens_text_is_left_out_unless_include_stop_str_in_output(qwen):
    """vLLM's detokenizer leaves out the text of the token that stopped the sequence (a stop token id
    or EOS); token_ids keep it. include_stop_str_in_output=True keeps its text. Streams agree."""
    tok = qwen.get_tokenizer()
    full = qwen.generate(STORY, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
    stop = next(t for t in full.token_ids[3:] if tok.decode([t]).strip())  # a token with visible text
    ids = full.token_ids[:full.token_ids.index(stop) + 1]
    assert tok.decode(ids[:-1]) != tok.decode(ids)
    for include, want in ((False, tok.decode(ids[:-1])), (True, tok.decode(ids))):
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop_token_ids=[stop],
                                include_stop_str_in_output=include)
        out = qwen.generate(STORY, params, use_tqdm=False)[0]
        c = out.outputs[0]
        assert (c.token_ids, c.text, c.finish_reason, c.stop_reason) == (ids, want, "stop", stop), include
        assert _streamed(qwen, STORY, params) == (want, out)
    engine = qwen.engine
    eos, model_eos = engine.eos_token_ids, engine.tokenizer_eos_token_id
    try:
        params = SamplingParams(temperature=0.0, max_tokens=16)
        # the same token as the model's EOS (the tokenizer's): stop_reason None; as an extra EOS id of
        # generation_config.json, which vLLM makes a stop token id: stop_reason that id
        for engine.tokenizer_eos_token_id, reason in ((stop, None), (model_eos, stop)):
            engine.eos_token_ids = {stop, model_eos}
            out = qwen.generate(STORY, params, use_tqdm=False)[0]
            c = out.outputs[0]
            assert (c.token_ids, c.text, c.finish_reason, c.stop_reason) == (ids, tok.decode(ids[:-1]), "stop", reason)
            assert _streamed(qwen, STORY, params) == (c.text, out)
    finally:
        engine.eos_token_ids, engine.tokenizer_eos_token_id = eos, model_eos


def test_stop_strings_count_only_past_the_first_min_tokens(qwen):
    """vLLM checks stop strings only once more than min_tokens tokens exist, and only where they end
    past the text of the first min_tokens tokens: one wholly inside that text does not stop, one that
    begins there and ends after it does."""
    tok, m = qwen.get_tokenizer(), 4
    full = qwen.generate(STORY, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
    text, edge = full.text, len(tok.decode(full.token_ids[:m]))
    inside, across = text[edge - 4:edge - 1], text[edge - 2:edge + 2]
    assert text.count(inside) == 1 and text.count(across) == 1, (text, edge)

    def run(stop, min_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop], min_tokens=min_tokens)
        out = qwen.generate(STORY, params, use_tqdm=False)[0]
        assert _streamed(qwen, STORY, params) == (out.outputs[0].text, out)
        return out.outputs[0]

    c = run(inside, 0)  # without min_tokens it stops there
    assert (c.text, c.finish_reason, c.stop_reason) == (text[:text.index(inside)], "stop", inside)
    c = run(inside, m)
    assert (c.text, c.finish_reason, c.stop_reason, len(c.token_ids)) == (text, "length", None, 16)
    c = run(across, m)
    assert (c.text, c.finish_reason, c.stop_reason) == (text[:edge - 2], "stop", across)
    assert len(c.token_ids) == m + 1


def test_max_tokens_none_runs_up_to_max_model_len(qwen):
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    out = qwen.generate([1, 2, 3, 4, 5], params, use_tqdm=False)[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (64 - 5, "length")
    assert SamplingParams(max_tokens=None, min_tokens=100).min_tokens == 100  # no max_tokens to bound it


def test_chat_gives_the_rendered_prompt_and_takes_text_parts(qwen):
    """vLLM's LLM.chat: RequestOutput.prompt is the chat template's rendering (as transformers renders
    it); a content given as OpenAI's list of text parts is the parts joined, as the server takes it."""
    from transformers import AutoTokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colors."}]
    text = AutoTokenizer.from_pretrained(qwen.model_path).apply_chat_template(messages, tokenize=False,
                                                                              add_generation_prompt=True)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    out = qwen.chat(messages, params)[0]
    assert out.prompt == text
    assert out.prompt_token_ids == qwen.get_tokenizer().encode(text, add_special_tokens=False)
    parts = [dict(m, content=[{"type": "text", "text": m["content"][:5]}, {"type": "text", "text": m["content"][5:]}])
             for m in messages]
    joined = [dict(m, content=m["content"][:5] + "\n" + m["content"][5:]) for m in messages]  # vLLM's join
    want = qwen.chat(joined, params)[0]
    assert qwen.chat(parts, params)[0] == want
    assert _streamed(qwen, parts, params) == (want.outputs[0].text, want)
    with pytest.raises(ValueError, match=r"messages\[1\]\['content'\] must be a string or a list of text parts"):
        qwen.chat([messages[0], {"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], params)


def test_chat_hands_tool_calls_and_reasoning_to_the_template_as_vllm():
    """vLLM's LLM.chat parses a conversation as its server does: an assistant's null content is "", its
    tool calls' JSON arguments an object, its reasoning also reasoning_content; the prompt equals
    transformers' rendering of the turns in that form."""
    from helpers import TOOL_TEMPLATE, TOOL_TURNS, hf_tool_rendering
    with LLM("qwen3-tiny", **small_engine_args()) as llm:
        out = llm.chat(TOOL_TURNS, SamplingParams(temperature=0.0, max_tokens=2), chat_template=TOOL_TEMPLATE)[0]
    assert out.prompt == hf_tool_rendering()


def test_skip_special_tokens_and_detokenize_as_vllm(qwen):
    """vLLM's SamplingParams.skip_special_tokens (default True) and detokenize: the text is transformers'
    decode of the token ids with the same skip_special_tokens, streamed alike; with it False a stop
    string may be a special token's text; detokenize=False gives the same ids with no text."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(qwen.model_path)
    im_end = hf.convert_tokens_to_ids("<|im_end|>")
    words = hf.encode(" cat dog", add_special_tokens=False)
    base = dict(temperature=1.0, seed=3, max_tokens=24, ignore_eos=True, allowed_token_ids=[im_end, *words])
    ids = None
    for skip in (True, False):
        params = SamplingParams(**base, skip_special_tokens=skip)
        out = qwen.generate(STORY, params, use_tqdm=False)[0]
        c = out.outputs[0]
        ids = ids or c.token_ids
        assert c.token_ids == ids  # the option changes the text only
        assert im_end in ids[:-1] and set(ids) - {im_end}, ids  # special tokens between words: the case to test
        assert c.text == hf.decode(ids, skip_special_tokens=skip)
        assert ("<|im_end|>" in c.text) == (not skip)
        assert _streamed(qwen, STORY, params) == (c.text, out)
    # a special token's text as a stop string: found only when it is in the text
    first = ids.index(im_end)
    stopped = qwen.generate(STORY, SamplingParams(**base, skip_special_tokens=False, stop="<|im_end|>"),
                            use_tqdm=False)[0].outputs[0]
    assert (stopped.text, stopped.token_ids, stopped.stop_reason) == (hf.decode(ids[:first]), ids[:first + 1],
                                                                      "<|im_end|>")
    assert qwen.generate(STORY, SamplingParams(**base, stop="<|im_end|>"), use_tqdm=False)[0].outputs[0].token_ids == ids
    params = SamplingParams(**base, detokenize=False, logprobs=1)
    out = qwen.generate(STORY, params, use_tqdm=False)[0]
    c = out.outputs[0]
    assert (c.token_ids, c.text) == (ids, "")
    assert all(lp.decoded_token is None for step in c.logprobs for lp in step.values())
    assert _streamed(qwen, STORY, params) == ("", out)
    with pytest.raises(ValueError, match="SamplingParams.stop needs detokenize=True"):
        SamplingParams(stop="x", detokenize=False)
    with pytest.raises(ValueError, match="SamplingParams.skip_special_tokens must be True or False"):
        SamplingParams(skip_special_tokens="no")
