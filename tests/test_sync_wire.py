"""Codecs, error feedback and fragment schedules of the outer sync (no processes needed)."""
import pytest
import torch

from geodiloco.runtime.sync.overlap import launch_steps, split_fragments
from geodiloco.runtime.sync.wire import (CHUNK_ELEMENTS, Encoded, ErrorFeedback, decode, encode, encoded_bytes, reduce_sum,
                               sent_bytes)


def spread(numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("codec, levels", [("int8", 127), ("int4", 7)])
def test_integer_codecs_round_to_half_a_step_of_each_chunk(codec, levels):
    values = spread(4 * CHUNK_ELEMENTS)
    values[:CHUNK_ELEMENTS] *= 100.0  # one chunk far larger: its scale must not spoil the others
    decoded = decode(codec, encode(codec, values))
    for chunk, restored in zip(values.view(-1, CHUNK_ELEMENTS), decoded.view(-1, CHUNK_ELEMENTS)):
        step = float(chunk.abs().max()) / levels
        assert float((restored - chunk).abs().max()) <= step / 2 * (1 + 1e-5)
    assert float(decoded.view(-1, CHUNK_ELEMENTS)[1:].abs().max()) < 10.0


def test_int4_packs_two_codes_per_byte_and_keeps_signs():
    values = torch.tensor([-7.0, 7.0, 0.0, -1.0] * (CHUNK_ELEMENTS // 4))
    encoded = encode("int4", values)
    assert encoded.payload.dtype == torch.uint8 and encoded.payload.numel() == CHUNK_ELEMENTS // 2
    assert torch.equal(decode("int4", encoded), values)


def test_all_zero_chunk_decodes_to_zero():
    assert torch.equal(decode("int8", encode("int8", torch.zeros(CHUNK_ELEMENTS))), torch.zeros(CHUNK_ELEMENTS))


@pytest.mark.parametrize("codec, dtype, mantissa_bits", [("bf16", torch.bfloat16, 7), ("fp16", torch.float16, 10)])
def test_float_codecs_send_two_bytes_per_element(codec, dtype, mantissa_bits):
    values = spread(100)
    encoded = encode(codec, values)
    assert isinstance(encoded, Encoded) and encoded.payload.dtype == dtype and encoded.scales is None
    assert encoded.payload.numel() == 100 and encoded.payload.element_size() == 2
    # round to nearest: at most half a unit in the last place, 2 ** -(mantissa bits + 1) relative
    relative = ((decode(codec, encoded) - values).abs() / values.abs()).max().item()
    assert 0 < relative <= 2.0 ** -(mantissa_bits + 1)


def test_bytes_on_the_wire_per_codec():
    numel = 1_000 * CHUNK_ELEMENTS
    assert encoded_bytes("none", numel) == 4 * numel
    assert encoded_bytes("fp16", numel) == 2 * numel
    assert encoded_bytes("int8", numel) == numel + 4 * 1_000
    assert encoded_bytes("int4", numel) == numel // 2 + 4 * 1_000
    # A ring all-reduce of fp32 and the two hops of a compressed sum send 2 (n-1)/n of the payload.
    assert sent_bytes("none", numel, 4) == int(1.5 * 4 * numel)
    assert sent_bytes("int8", numel, 4) == int(1.5 * (numel + 4_000))
    assert sent_bytes("int8", numel, 1) == 0


def test_error_feedback_loses_nothing_but_the_last_residual():
    """Sum over rounds of what arrived == sum of what was sent - the residual still carried."""
    feedback = ErrorFeedback()
    sent_total = torch.zeros(3 * CHUNK_ELEMENTS)
    arrived_total = torch.zeros(3 * CHUNK_ELEMENTS)
    for round_idx in range(20):
        values = spread(3 * CHUNK_ELEMENTS, seed=round_idx) * 1e-3
        sent_total += values
        arrived_total += reduce_sum(values, "int4", feedback, None, 1)
    torch.testing.assert_close(arrived_total + feedback.sent, sent_total, rtol=0, atol=1e-6)
    assert float(feedback.sent.abs().max()) < 1e-3
    # Without feedback (a fresh residual every round) int4's rounding errors add up over the rounds.
    forgetful_total = torch.zeros(3 * CHUNK_ELEMENTS)
    for round_idx in range(20):
        forgetful_total += reduce_sum(spread(3 * CHUNK_ELEMENTS, seed=round_idx) * 1e-3, "int4", ErrorFeedback(), None, 1)
    with_feedback_error = float((arrived_total - sent_total).norm())
    assert float((forgetful_total - sent_total).norm()) > 3 * with_feedback_error


def test_fragments_are_contiguous_cover_every_parameter_and_are_balanced():
    sizes = [1000, 10, 10, 4000, 3000, 2000, 50, 1000, 1000]
    fragments = split_fragments(sizes, 4)
    assert [index for fragment in fragments for index in fragment] == list(range(len(sizes)))
    totals = [sum(sizes[index] for index in fragment) for fragment in fragments]
    assert len(fragments) == 4 and max(totals) <= 2 * sum(sizes) / 4
    assert split_fragments(sizes, 1) == [list(range(len(sizes)))]
    assert len(split_fragments([5, 5], 8)) == 2  # never an empty fragment


def test_streaming_launch_points_spread_through_the_round():
    assert launch_steps(20, 4) == [0, 5, 10, 15]
    assert launch_steps(3, 4) == [0, 0, 1, 2]


def reference_codes(values: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The integer codec by its definition: per chunk, scale = largest magnitude / levels (at least the
    smallest normal float), code = round(value / scale) clamped to +-levels, stored offset by levels."""
    chunks = values.view(-1, CHUNK_ELEMENTS)
    scales = chunks.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / levels
    codes = torch.round(chunks / scales[:, None]).clamp(-levels, levels) + levels
    return codes.to(torch.uint8).view(-1), scales


@pytest.mark.parametrize("magnitude", [1e-6, 1.0, 1e20])
def test_the_int8_codec_is_bitwise_its_definition_and_decodes_into_a_given_buffer(magnitude):
    values = spread(6 * CHUNK_ELEMENTS, seed=3) * magnitude
    values[:CHUNK_ELEMENTS] = 0.0  # an all-zero chunk takes the smallest scale
    values[CHUNK_ELEMENTS:2 * CHUNK_ELEMENTS] *= -1e-30
    codes, scales = reference_codes(values, 127)
    encoded = encode("int8", values)
    assert torch.equal(encoded.payload, codes) and torch.equal(encoded.scales, scales)
    expected = ((codes.to(torch.float32) - 127).view(-1, CHUNK_ELEMENTS) * scales[:, None]).view(-1)
    assert torch.equal(decode("int8", encoded), expected)
    buffer = torch.full_like(values, float("nan"))
    assert decode("int8", encoded, out=buffer) is buffer and torch.equal(buffer, expected)


def test_error_feedback_keeps_what_the_codec_lost_and_leaves_the_caller_residual_alone():
    from geodiloco.runtime.sync.wire import _encode_with_feedback
    values, residual = spread(2 * CHUNK_ELEMENTS, seed=4), spread(2 * CHUNK_ELEMENTS, seed=5) * 1e-3
    kept = residual.clone()
    _, decoded, new_residual = _encode_with_feedback("int8", values, residual)
    assert torch.equal(residual, kept), "a checkpoint may hold the old residual"
    assert torch.equal(new_residual, (values + kept) - decoded)
