"""The grader names the bug: every known wrong version (tests/exercises/mistakes_ch*.py), fed to the
graded test named in it, must fail with its own diagnosis in the message."""
import importlib
import os
import sys

import pytest

EXERCISE_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exercises")
sys.path.insert(0, EXERCISE_TESTS)

from minillm.course.exercises import load_impl  # noqa: E402
from mistakes import all_mistakes, with_mistake  # noqa: E402

MISTAKES = all_mistakes()


def test_every_exercise_has_named_mistakes():
    """Each exercise names at least two common wrong versions."""
    from minillm.course.exercises import find_exercises
    count = {e.id: 0 for e in find_exercises()}
    for m in MISTAKES.values():
        count[m.exercise] += 1
    thin = {ex: n for ex, n in count.items() if n < 2}
    assert not thin, f"exercises with fewer than two named mistakes: {thin}"


def graded_failure(mistake, request) -> str:
    """The failure message of the graded test named in `mistake`, run on minillm with the mistake in it."""
    module_name, test_name = mistake.test.split("::")
    test_fn = getattr(importlib.import_module(module_name.removesuffix(".py")), test_name)
    impl = with_mistake(load_impl("ref"), mistake)
    args = dict(mistake.test_args)
    for arg in test_fn.__code__.co_varnames[:test_fn.__code__.co_argcount]:
        if arg != "impl" and arg not in args:  # pytest's own fixtures the test asks for: monkeypatch, tmp_path, ...
            args[arg] = request.getfixturevalue(arg)
    with pytest.raises(AssertionError) as failure:
        test_fn(impl=impl, **args)
    return str(failure.value)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_grader_names_the_mistake(name, request):
    mistake = MISTAKES[name]
    message = graded_failure(mistake, request)
    assert mistake.hint in message, (
        f"the grader caught mistake {name!r} but did not name it; its message was:\n{message}")


# wrong versions that end in another known one's symptom, not in its result: the same exception on another rank,
# the same (no) events for a reader from other text, the same first wrong step of an admission scenario that
# goes on differently, the same collectives with other results. Each once got the other's hint, which told the
# student to fix what they had right.
SAME_SYMPTOM = {
    "ch4_vocab_embed_mask_includes_end": "ch4_vocab_embed_without_offset",  # IndexError: on rank 0, not rank 1
    "ch4_lm_head_all_gather_then_none": "ch4_lm_head_on_every_rank",  # an all-gather; None on rank 1 though
    "ch6_sse_event_splitlines": "ch6_sse_event_no_blank_line",  # a reader gets nothing from sse_event('')
    "ch6_admit_id_before_queue": "ch6_admit_one_too_many",  # ValueError where the queue is full
    "ch5_gumbel_argmax_only_if_any_greedy": "ch5_gumbel_greedy_by_clamp",  # temperature-0 rows sampled
    "ch6_detok_prefix_jumps_to_end": "ch6_detok_new_tokens_alone",  # the same text on the graded input
    "ch3_paged_decode_one_key_too_many": "ch3_paged_decode_masks_without_zeroing",  # wrong where a row holds junk
    "ch1_load_completeness_any_shard": "ch1_load_without_completeness_check",  # a load that does not refuse
    "ch1_naive_counts_the_prompt": "ch1_naive_one_step_short",  # too few new tokens, for another reason
    "ch1_naive_one_step_short": "ch1_naive_counts_the_prompt",
    "ch1_cached_without_zero_guard": "ch1_cached_one_step_too_many",  # a token past the limit where it is 0
    "ch2_layer_post_norm_residual_discarded": "ch2_layer_post_norm_without_residual",  # no residual comes back
    "ch2_attention_mask_diagonal_negated": "ch2_attention_mask_inverted",  # a token that cannot see itself
    "ch4_vocab_embed_no_upper_bound": "ch4_vocab_embed_mask_includes_end",  # an id past the shard kept
    "ch3_append_slot_copies_before_the_new_block_test": "ch3_append_slot_new_block_when_full",  # wrong block
    "ch3_append_slot_new_block_when_full": "ch3_append_slot_copies_before_the_new_block_test",
    "ch5_append_counts_real_tokens_only": "ch5_append_limit_before_placeholder",  # one sequence too many
    "ch5_kv_of_hidden_size": "ch5_kv_of_query_heads",  # a KV budget too large
    "ch5_graph_size_largest_when_too_big": "ch5_graph_size_rounds_down",  # a graph too small for the batch
    "ch6_sse_event_rstrips_newlines": "ch6_sse_event_splitlines",  # a reader gets other text at the line ends
    "ch2_primer_matmul_dot_acc_fp16": "ch2_primer_matmul_dot_acc_out_fp16",  # tl.dot's bare AssertionError
    "ch5_floor_attention_without_the_2": "ch5_floor_attention_of_kv_heads",  # one floor where H = 2 x Hkv
    "ch1_header_big_endian": "ch1_header_rejects_a_header_ending_the_file",  # a file that is all header refused
    "ch4_shard_packed_without_row_check": "ch4_shard_packed_on_columns",  # torch's RuntimeError in split
}


@pytest.mark.parametrize("name", sorted(SAME_SYMPTOM))
def test_a_bug_with_another_ones_symptom_is_not_named_for_it(name, request, monkeypatch):
    """With its own entry out of the catalogue, the wrong version is not named as the one whose symptom it
    shares: a known bug is named only where its result equals the student's (suspects_of's second look,
    which ranks raised)."""
    import mistakes
    others = {k: m for k, m in MISTAKES.items() if k != name}
    monkeypatch.setattr(mistakes, "all_mistakes", lambda: others)
    message = graded_failure(MISTAKES[name], request)
    assert MISTAKES[SAME_SYMPTOM[name]].hint not in message, message
    assert "looks like a known bug" not in message, message


def test_a_bug_that_does_not_show_on_the_input_is_not_named():
    """Graded against a reference one FLOP off (seen: torch 2.11's FLOP counter on transformers' forward
    counts 192 more than 2.13's for tiny-qwen3), minillm's own prefill floor fails, and a decode-only bug
    gives that same prefill floor: the grader must not name it (it once did, sending the student to fix
    code that was right)."""
    import torch

    from minillm.config import ModelConfig
    from minillm.course.grading import check_close
    from helpers import ref_path
    from mistakes import suspects_of
    ref = load_impl("ref")
    args = (ModelConfig.from_folder(ref_path("tiny-qwen3")), 4, [12], [1], 1e-9, 1e-12)

    def prefill_floor(fn) -> torch.Tensor:
        return torch.tensor(float(fn(*args)["floor_prefill_s"]), dtype=torch.float64)
    decode_only = [m for m in MISTAKES.values() if "first token too" in m.hint]
    assert decode_only and torch.equal(prefill_floor(decode_only[0].replaces["workload_floor"]), prefill_floor(
        ref.workload_floor))  # the premise: this bug does not change a prefill-only floor
    with pytest.raises(AssertionError) as failure:
        check_close(prefill_floor(ref.workload_floor), prefill_floor(ref.workload_floor) + 1, "5.4", atol=0,
                    rtol=1e-9, suspects=suspects_of("workload_floor", prefill_floor))
    assert "looks like a known bug" not in str(failure.value), str(failure.value)
    with pytest.raises(AssertionError) as failure:  # where the bug does show, it is still named
        wrong = prefill_floor(decode_only[0].replaces["workload_floor"])
        check_close(wrong, wrong + 1, "5.4", atol=0, rtol=1e-9,
                    suspects={decode_only[0].hint: lambda: wrong})
    assert decode_only[0].hint in str(failure.value)
