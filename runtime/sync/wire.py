"""What the outer sync puts on the wire: codecs, error feedback and the reduction that sums in fp32.

``diloco.compression`` picks a codec for the pseudo-gradients:

- ``none``: fp32, one all-reduce (4 bytes per element, a ring sends 2 (n-1)/n of the payload).
- ``fp16`` / ``bf16``: 2 bytes per element.
- ``int8`` / ``int4``: symmetric integers with one fp32 scale per ``CHUNK_ELEMENTS`` chunk
  (byte counts: ``balancer.network.encoded_bytes``, which the planner's model shares)
  (the chunk's largest magnitude maps to the largest code), int4 packed two to a byte.

Every codec other than ``none`` goes through ``reduce_sum_compressed``: each node encodes its
contribution, an all-to-all hands node j the j-th shard of every contribution, node j decodes
them and sums in fp32 (never in the wire dtype), encodes the sum, and an all-gather brings every
node all the summed shards. Both hops send (n-1)/n of the encoded payload per node.

Lossy codecs carry their rounding error into the next round (error feedback): a node adds its
residual to the next contribution before encoding, and the owner of a shard adds its residual of
the encoded sum to the next sum. Over many rounds nothing is lost but the last residual, so the
sum over rounds of what arrived equals the sum of what was sent minus what is still carried.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from geodiloco.balancer.network import CHUNK_ELEMENTS, encoded_bytes

CODECS = ("none", "fp16", "bf16", "int8", "int4")
FLOAT_WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
INTEGER_BITS = {"int8": 8, "int4": 4}


def sent_bytes(codec: str, numel: int, num_nodes: int) -> int:
    """Bytes one node sends to sum ``numel`` elements over ``num_nodes`` nodes with ``codec``.

    fp32 all-reduce as a ring: 2 (n-1)/n x payload; compressed: all-to-all then all-gather,
    (n-1)/n x encoded payload each."""
    if num_nodes <= 1:
        return 0
    return int(2 * (num_nodes - 1) * encoded_bytes(codec, numel) / num_nodes)


@dataclass
class Encoded:
    """One encoded vector: integer codes (uint8, int4 packed) or floats, and per-chunk scales."""

    payload: torch.Tensor
    scales: Optional[torch.Tensor] = None


def encode(codec: str, values: torch.Tensor) -> Encoded:
    """``values`` (flat fp32, length a multiple of CHUNK_ELEMENTS for integer codecs) -> wire form."""
    if codec in FLOAT_WIRE_DTYPES:
        return Encoded(values.to(FLOAT_WIRE_DTYPES[codec]))
    bits = INTEGER_BITS[codec]
    levels = 2 ** (bits - 1) - 1
    chunks = values.view(-1, CHUNK_ELEMENTS)
    low, high = torch.aminmax(chunks, dim=1)  # the largest magnitude in one read, without an abs() copy
    scales = torch.maximum(low.neg_(), high).clamp_min_(torch.finfo(torch.float32).tiny).div_(levels)
    codes = torch.div(chunks, scales[:, None]).round_().clamp_(-levels, levels).add_(levels)
    codes = codes.to(torch.uint8).view(-1)
    if bits == 4:
        codes = codes[0::2] | (codes[1::2] << 4)
    return Encoded(codes, scales.to(torch.float32))


def decode(codec: str, encoded: Encoded, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Wire form -> flat fp32, written into ``out`` (flat fp32 of the decoded length) when given.
    The integer codecs decode in place, one buffer for the whole vector."""
    if codec in FLOAT_WIRE_DTYPES:
        return encoded.payload.to(torch.float32) if out is None else out.copy_(encoded.payload)
    bits = INTEGER_BITS[codec]
    levels = 2 ** (bits - 1) - 1
    codes = encoded.payload
    if bits == 4:
        codes = torch.stack([codes & 0x0F, codes >> 4], dim=1).view(-1)
    values = codes.to(torch.float32) if out is None else out.copy_(codes)
    values.view(-1, CHUNK_ELEMENTS).sub_(levels).mul_(encoded.scales[:, None])
    return values


def padded_length(numel: int, num_nodes: int) -> int:
    """Length padded so every node's shard is a whole number of chunks."""
    block = CHUNK_ELEMENTS * num_nodes
    return -(-numel // block) * block


@dataclass
class ErrorFeedback:
    """Rounding residuals carried into the next round: this node's (``sent``) and, for the shard
    this node sums, the residual of the encoded sum (``summed``). Both fp32, checkpointed."""

    sent: Optional[torch.Tensor] = None
    summed: Optional[torch.Tensor] = None

    def state_dict(self) -> dict:
        return {"sent": self.sent, "summed": self.summed}

    def load_state_dict(self, state: dict) -> None:
        self.sent, self.summed = state["sent"], state["summed"]

    def copy(self) -> "ErrorFeedback":
        return ErrorFeedback(None if self.sent is None else self.sent.clone(),
                             None if self.summed is None else self.summed.clone())


def _encode_with_feedback(codec: str, values: torch.Tensor, residual: Optional[torch.Tensor]
                          ) -> tuple[Encoded, torch.Tensor, torch.Tensor]:
    """(wire form, what it decodes to, the new residual) of ``values`` plus the carried residual."""
    compensated = values if residual is None else values + residual
    encoded = encode(codec, compensated)
    decoded = decode(codec, encoded)
    new_residual = compensated - decoded if residual is None else compensated.sub_(decoded)  # a fresh sum: in place
    return encoded, decoded, new_residual


def _all_gather(output: torch.Tensor, shard: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, shard, group=group)


def _exchange(encoded: Encoded, num_nodes: int, group, collective: str) -> Encoded:
    """all-to-all (each node gets its shard of everyone's) or all-gather (everyone gets all shards)."""
    def move(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if tensor is None:
            return None
        if collective == "all_to_all":
            received = torch.empty_like(tensor)
            dist.all_to_all_single(received, tensor.contiguous(), group=group)
            return received
        received = torch.empty(tensor.numel() * num_nodes, dtype=tensor.dtype, device=tensor.device)
        _all_gather(received, tensor.contiguous(), group)
        return received
    return Encoded(move(encoded.payload), move(encoded.scales))


def _split(encoded: Encoded, parts: int) -> list[Encoded]:
    payloads = encoded.payload.chunk(parts)
    scales = encoded.scales.chunk(parts) if encoded.scales is not None else [None] * parts
    return [Encoded(payload, scale) for payload, scale in zip(payloads, scales)]


def reduce_sum_compressed(values: torch.Tensor, codec: str, feedback: ErrorFeedback, group,
                          num_nodes: int) -> torch.Tensor:
    """sum_i values_i over the group's nodes, every hop encoded with ``codec``, summed in fp32.

    ``values``: this node's flat fp32 contribution (already weighted). ``feedback`` is updated in
    place. Every node returns the same fp32 vector (the decoded encoded sums)."""
    numel = values.numel()
    padded = torch.empty(padded_length(numel, num_nodes), dtype=torch.float32, device=values.device)
    padded[:numel].copy_(values)
    padded[numel:].zero_()
    sent, _, feedback.sent = _encode_with_feedback(codec, padded, feedback.sent)
    received = _exchange(sent, num_nodes, group, "all_to_all")
    shard_sum = torch.zeros(padded.numel() // num_nodes, dtype=torch.float32, device=values.device)
    for piece in _split(received, num_nodes):
        shard_sum += decode(codec, piece)
    summed, _, feedback.summed = _encode_with_feedback(codec, shard_sum, feedback.summed)
    gathered = _exchange(summed, num_nodes, group, "all_gather")
    total = torch.empty(padded.numel(), dtype=torch.float32, device=values.device)
    for out, piece in zip(total.chunk(num_nodes), _split(gathered, num_nodes)):
        decode(codec, piece, out=out)
    return total[:numel]


def reduce_sum(values: torch.Tensor, codec: str, feedback: ErrorFeedback, group, num_nodes: int) -> torch.Tensor:
    """The fp32 sum of every node's ``values``: one fp32 all-reduce for ``none``, else compressed."""
    if num_nodes <= 1:
        if codec == "none":
            return values.clone()
        padded = torch.zeros(padded_length(values.numel(), 1), dtype=torch.float32, device=values.device)
        padded[:values.numel()] = values
        _, decoded, feedback.sent = _encode_with_feedback(codec, padded, feedback.sent)
        return decoded[:values.numel()]
    if codec == "none":
        summed = values.clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        return summed
    return reduce_sum_compressed(values, codec, feedback, group, num_nodes)
