"""When no known wrong version matches, the grader says what the error looks like
(minillm.course.error_patterns). Each bug below is written here, outside the mistakes catalogue,
against torch.nn.functional / transformers references; each must get its pattern, and results with
no simple shape (noise) must get none: a wrong pattern would send a student after the wrong bug."""
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "exercises"))

from minillm.course.error_patterns import describe_error, describe_mismatch  # noqa: E402
from minillm.course.exercises import load_impl  # noqa: E402
from minillm.course.grading import check_close, check_equal  # noqa: E402

ATOL = RTOL = 1e-5


def rms_ref(x, w, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


@pytest.fixture
def x_w():
    g = torch.Generator().manual_seed(0)
    return torch.randn(18, 64, generator=g) * 3, torch.randn(64, generator=g)


def test_statistic_over_the_wrong_dimension_is_a_row_times_column_factor(x_w):
    x, w = x_w
    wrong = w * x * torch.rsqrt(x.pow(2).mean(dim=0, keepdim=True) + 1e-6)
    msg = describe_error(wrong, rms_ref(x, w), ATOL, RTOL)
    assert "a factor per row times a factor per column" in msg and "wrong dimension" in msg
    bf16 = describe_error(wrong.bfloat16(), rms_ref(x, w).bfloat16(), 1e-2, 1e-2)  # rounded results too
    assert "a factor per row times a factor per column" in bf16


def test_one_factor_is_named_from_the_shape(x_w):
    x, w = x_w
    sum_not_mean = w * x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + 1e-6)
    assert "times 0.125 (= 1/sqrt(64)) everywhere" in describe_error(sum_not_mean, rms_ref(x, w), ATOL, RTOL)
    assert "times 3 everywhere" in describe_error(3 * rms_ref(x, w), rms_ref(x, w), ATOL, RTOL)


def test_a_factor_per_row_or_per_channel(x_w):
    x, w = x_w
    ref = rms_ref(x, w)
    no_weight = F.rms_norm(x, (64,), None, 1e-6)  # the weight forgotten: a signed factor per channel
    assert "a factor per index of the last dimension" in describe_error(no_weight, ref, ATOL, RTOL)
    per_row = ref * torch.linspace(0.5, 2, 18)[:, None]
    assert "differs from row to row (0.5 to 2)" in describe_error(per_row, ref, ATOL, RTOL)


def test_sign_shift_halves_transpose_and_a_confined_error(x_w):
    x, w = x_w
    ref = rms_ref(x, w)
    assert "opposite sign" in describe_error(-ref, ref, ATOL, RTOL)
    shifted = torch.cat([ref[:1], ref[:-1]])
    assert "shifted by one along dim 0: got[i] = expected[i - 1]" in describe_error(shifted, ref, ATOL, RTOL)
    assert "halves of the last dimension swapped" in describe_error(ref.roll(32, dims=-1), ref, ATOL, RTOL)
    square = ref[:, :18]
    assert "transposed" in describe_error(square.T.contiguous(), square, ATOL, RTOL)
    late_rows = ref.clone()
    late_rows[12:] += 1
    assert "wrong only at indices 12-17 of dim 0 (size 18); the other 12 match" in describe_error(
        late_rows, ref, ATOL, RTOL)


def test_no_pattern_for_noise_or_for_too_little_evidence(x_w):
    x, w = x_w
    ref = rms_ref(x, w)
    g = torch.Generator().manual_seed(1)
    assert describe_error(ref + 0.1 * torch.randn(ref.shape, generator=g), ref, ATOL, RTOL) is None
    assert describe_error(torch.randn(8, generator=g), torch.randn(8, generator=g), ATOL, RTOL) is None
    assert describe_error(torch.tensor([2.0]), torch.tensor([1.0]), ATOL, RTOL) is None  # one number: no shape
    mostly_wrong = ref + 1
    mostly_wrong[:, 0] = ref[:, 0]  # one right column of 64 is no "confined" error
    assert describe_error(mostly_wrong, ref, ATOL, RTOL) is None


def test_exact_results_offsets_and_where_a_sequence_goes_wrong():
    assert "every value is +1 off" in describe_mismatch([5, 6, 7, 9], [4, 5, 6, 8])
    grid = torch.tensor([[0, 1], [2, 3]])
    assert "every value is -16 off" in describe_mismatch(grid, grid + 16)
    tokens = [7, 7, 3, 9, 1]
    assert "up to index 1 and differs at every index from 2 on" in describe_mismatch([7, 7, 4, 4, 4], tokens)
    assert describe_mismatch("abc", "abd") is None and describe_mismatch({"a": 1}, {"a": 2}) is None
    assert describe_mismatch([[1, 2], [3]], [[1, 2], [4]]) is None  # ragged: no tensor, no pattern
    assert describe_mismatch((1, 2, 3), [1, 2, 3]) is None  # unequal as Python values, equal numbers


def test_the_grader_prints_the_pattern_only_when_no_known_bug_matches(x_w):
    x, w = x_w
    ref = rms_ref(x, w)
    with pytest.raises(AssertionError) as failure:
        check_close(-ref, ref, "2.1", "rms_norm", ATOL, RTOL)
    assert "the error's pattern: your rms_norm has the opposite sign" in str(failure.value)
    with pytest.raises(AssertionError) as failure:
        check_close(-ref, ref, "2.1", "rms_norm", ATOL, RTOL, suspects={"a known sign bug": -ref})
    assert "looks like a known bug: a known sign bug" in str(failure.value)
    assert "the error's pattern" not in str(failure.value)
    with pytest.raises(AssertionError) as failure:
        check_equal([1, 2, 3], [0, 1, 2], "3.1", "slot mapping")
    assert "the error's pattern: your slot mapping every value is +1 off" in str(failure.value)
    with pytest.raises(AssertionError) as failure:  # a description with its own article is not "your the ..."
        check_equal([1, 2, 3], [0, 1, 2], "3.1", "the slot mapping of 3 tokens")
    assert "the error's pattern: the slot mapping of 3 tokens every value is +1 off" in str(failure.value)


def test_a_raised_outcome_fails_as_a_crash_and_copies_as_its_text():
    """Raised (what a graded call raised) equals its text, so it matches a known bug that raised the same; a
    check that fails on it says the code raised and is raised from that error (the grader shows its line),
    also from inside a list of outcomes; a copy is the plain text."""
    import copy
    from minillm.course.grading import Raised
    error = IndexError("index 7 is out of bounds")
    got = Raised(error)
    assert got == "raised IndexError: index 7 is out of bounds" and got.error is error
    assert type(copy.deepcopy(got)) is str and copy.deepcopy(got) == got
    with pytest.raises(AssertionError) as failure:
        check_equal(got, [1, 2], "3.1", "the slot mapping")
    assert "the slot mapping: your code raised IndexError: index 7" in str(failure.value)
    assert failure.value.__cause__ is error and "the error's pattern" not in str(failure.value)
    with pytest.raises(AssertionError) as failure:
        check_equal([None, got], [None, "x"], "3.1", "each line's outcome")
    assert failure.value.__cause__ is error


def test_a_graded_test_names_the_pattern_of_a_bug_outside_the_catalogue():
    """Exercise 2.1 with the mean over rows (dim 0): no known wrong version, so the pattern speaks."""
    from test_ch2 import test_rms_norm_matches_qwen3_rmsnorm

    def rms_norm_over_rows(x, weight, eps):
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=0, keepdim=True) + eps)).to(x.dtype)

    impl = types.SimpleNamespace(**{**vars(load_impl("ref")), "rms_norm": rms_norm_over_rows})
    with pytest.raises(AssertionError) as failure:
        test_rms_norm_matches_qwen3_rmsnorm(impl=impl, shape=(18, 64))
    message = str(failure.value)
    assert "looks like a known bug" not in message
    assert "a factor per row times a factor per column" in message, message


def test_check_equal_says_a_tensors_shape_first_and_where_its_values_differ():
    """A shard one column too wide printed only its values (two long lists that look alike): the shape leads,
    as in check_close; a tensor of the right shape names its first wrong element (and a dtype that differs)."""
    w = torch.arange(24).reshape(12, 2)
    with pytest.raises(AssertionError) as failure:
        check_equal(torch.zeros(12, 3, dtype=torch.int32), w, "4.1", "shard_weight(...)")
    assert "shard_weight(...) has shape (12, 3), expected (12, 2) (dtype torch.int32, expected torch.int64).\n" \
           "  got:      [[0, 0, 0]" in str(failure.value), str(failure.value)
    wrong = w.clone()
    wrong[3, 1] = -1
    with pytest.raises(AssertionError) as failure:
        check_equal(wrong, w, "4.1", "shard_weight(...)")
    assert ("shard_weight(...) is wrong: 1 of 24 elements differ, the first at index (3, 1): got -1, expected 7.\n"
            "  got:      [[0, 1]") in str(failure.value), str(failure.value)
    with pytest.raises(AssertionError) as failure:  # not tensors: as before
        check_equal([1, 2], [1, 3], "3.1", "slot mapping")
    assert "slot mapping is wrong.\n  got:      [1, 2]\n  expected: [1, 3]" in str(failure.value)


def test_one_number_is_told_as_a_number():
    """A 0-d result (a floor in seconds, a count) fails with its value, the expected one and the difference, not
    'at 1 of 1 elements; first at index ()'."""
    with pytest.raises(AssertionError) as failure:
        check_close(torch.tensor(3.56649, dtype=torch.float64), torch.tensor(3.5662, dtype=torch.float64), "5.4",
                    "floor_decode_s", atol=0, rtol=1e-9)
    message = str(failure.value)
    assert "floor_decode_s is 3.56649, expected 3.5662: off by 0.00029" in message
    assert "1 of 1" not in message and "index ()" not in message


def test_one_number_off_by_a_units_factor_is_named():
    """One number has no shape, but a slip of units leaves an exact ratio: bytes given in GB, GB counted in GiB,
    seconds in ms. Any other ratio (2: bf16 counted as 4 bytes; 7% off) says nothing and gets no pattern."""
    nbytes = torch.empty(151936, 1024, dtype=torch.bfloat16, device="meta").nbytes  # an LM head's weights
    assert "times 1e-09 (= 1 / 1e9: a decimal prefix" in describe_mismatch(nbytes / 1e9, nbytes)
    assert "(= 1e9 / 2**30: binary units for decimal ones: GiB for GB" in describe_mismatch(
        nbytes / 2 ** 30, nbytes / 1e9)
    square = torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta").nbytes  # 2 MiB
    assert "(= 2**20: a binary prefix" in describe_mismatch(square, square // 2 ** 20)  # integers too
    assert describe_mismatch(nbytes * 2, nbytes) is None  # twice: no unit
    assert describe_mismatch(nbytes / 1e9 * 1.07, nbytes / 1e9) is None  # near GiB/GB (1.0737), 0.3% away
    assert describe_mismatch(True, 1) is None and describe_mismatch(0.0, 1.0) is None
    # a floor that takes max(decode, prefill) instead of their sum, near 1e6 / 2**20 = 0.95367 by chance
    assert describe_mismatch(0.9535, 1.0) is None and describe_mismatch(1 / 0.9536, 1.0) is None
    kv = torch.tensor(28 * 8 * 128 * 2 * 2, dtype=torch.float32)  # a Qwen3-0.6B token's K/V bytes, in float32
    assert "(= 1 / 2**10: a binary prefix" in describe_error(kv / 1024, kv, ATOL, RTOL)
    seconds = torch.tensor(nbytes / 4.2e12, dtype=torch.float64)  # a read at 4.2 TB/s
    with pytest.raises(AssertionError) as failure:
        check_close(seconds * 1e3, seconds, "5.4", "floor_decode_s", atol=0, rtol=1e-9)
    assert "the error's pattern: your floor_decode_s is the reference times 1000 (= 1e3: a decimal prefix: ms for s" \
        in str(failure.value), str(failure.value)
    with pytest.raises(AssertionError) as failure:
        check_equal(float(nbytes) / 1e9, float(nbytes), "5.4", "weight bytes")
    assert "the error's pattern: your weight bytes is the reference times 1e-09" in str(failure.value)
