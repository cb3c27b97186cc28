#!/usr/bin/env python3
"""BERT-base-sized encoder training throughput on synthetic token batches, padded dynamically
(to each batch's longest sequence, rounded up to a multiple of 64) or to a fixed --max-len.

A script that the console sends to a host (with `_recipe_harness.py` beside it) and runs there
with python3 or torchrun: it imports only the standard library, torch and that harness. It prints
one JSON object per line: "step" events, then one "summary", or one "error" and a non-zero exit
status.

    python3 bert.py --preset tuned --padding dynamic
    python3 bert.py --preset tuned --padding fixed

Sequence lengths follow a log-normal spread (median 150 tokens, sigma 0.4, clipped to
[16, --max-len]); the loss is masked-LM-like over ~15% of each sequence's real tokens.
`--batch-size` is per process. tokens_per_s counts real (unpadded) tokens.
"""

from __future__ import annotations

import math
import sys
from _recipe_harness import (
    Batch,
    RecipeError,
    Runtime,
    checkpoint_blocks,
    common_parser,
    configure_math,
    emit,
    make_optimizer,
    positive_int,
    prepare_model,
    resolve_knobs,
    run,
    start_runtime,
    summary,
    train,
)
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

RECIPE = "bert"
PRESETS = {
    "baseline": {
        "precision": "fp32",
        "compile": False,
        "compile_mode": None,
        "cudnn_benchmark": False,
        "fused_optimizer": False,
    },
    "tuned": {
        "precision": "bf16",
        "compile": True,
        "compile_mode": "default",
        "cudnn_benchmark": True,
        "fused_optimizer": True,
    },
}
MASK_TOKEN = 103
FIRST_WORD_TOKEN = 1000  # ids below are special tokens in BERT's vocabulary
MASKED_FRACTION = 0.15
# Dynamic padding rounds each batch up to a multiple of this. Every distinct shape costs (kernel
# and allocator choices per shape): on an H200, multiples of 8 made about 40 shapes and ran at
# 654 sequences/s, slower than fixed padding to 512 (794); multiples of 64 ran at 1,022 eager
# and 1,318 compiled, against 1,037 for fixed (benchmarks in docs/benchmarks.md).
PAD_MULTIPLE = 64
PREDICTION_MULTIPLE = 8  # masked slots per sequence, rounded for tensor-core friendly shapes
IGNORED = -100  # the label of a prediction slot that is not scored
LOSS_CHUNK_BYTES = 64 * 2**20
"""Under checkpointing, the head's fp32 logits are made in chunks of at most this size: whole, at
batch 32 and sequence 512 they take 298 MiB, and as much again for their gradient."""


def recipe_defaults(tiny: bool) -> dict[str, Any]:
    shape = (
        {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 256, "vocab": 2000, "max_len": 128}
        if tiny
        else {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "vocab": 30522}
    )
    return {
        "batch_size": 8 if tiny else 32,
        "accumulate": 1,
        "steps": 4 if tiny else 100,
        "warmup_steps": 1 if tiny else 30,
        "log_every": 1 if tiny else 10,
        "padding": "dynamic",
        "pad_multiple": PAD_MULTIPLE,
        "max_len": 512,
        "length_median": 40 if tiny else 150,
        "length_sigma": 0.4,
        **shape,
    }


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def init_weights(module: nn.Module) -> None:
    """BERT's initialization: N(0, 0.02) weights, zero biases. PyTorch's defaults give the tied
    embedding/decoder N(0, 1) weights, and with them logits of std √hidden."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class EncoderLayer(nn.Module):
    """Post-LayerNorm transformer block as in BERT; attention through
    scaled_dot_product_attention, with padded keys masked out."""

    def __init__(self, hidden: int, heads: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, hidden // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout)
        attended = attended.transpose(1, 2).reshape(batch, length, hidden)
        x = self.norm1(x + self.drop(self.out(attended)))
        return self.norm2(x + self.drop(self.down(F.gelu(self.up(x)))))


class MaskedLanguageModel(nn.Module):
    """Embeddings, encoder layers and a masked-LM head whose decoder shares the word
    embeddings; logits are computed only at the masked positions, and the model returns the
    loss. With ``loss_rows`` the vocabulary-sized logits are made that many rows at a time and
    recomputed in backward, so they never exist whole (the head's share of checkpointing)."""

    def __init__(self, knobs: dict[str, Any], dropout: float = 0.1, loss_rows: int = 0) -> None:
        super().__init__()
        hidden = knobs["hidden"]
        self.loss_rows = loss_rows
        self.words = nn.Embedding(knobs["vocab"], hidden)
        self.positions = nn.Embedding(knobs["max_len"], hidden)
        self.embedding_norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(hidden, knobs["heads"], knobs["intermediate"], dropout)
            for _ in range(knobs["layers"])
        )
        self.transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden))
        self.decoder_bias = nn.Parameter(torch.zeros(knobs["vocab"]))
        self.apply(init_weights)

    def forward(
        self,
        tokens: torch.Tensor,
        keep: torch.Tensor,
        masked_positions: torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        x = self.drop(self.embedding_norm(self.words(tokens) + self.positions(positions)))
        attention_keep = keep[:, None, None, :]  # [batch, heads, queries, keys]
        for layer in self.layers:
            x = layer(x, attention_keep)
        index = masked_positions.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        picked = self.transform(torch.gather(x, 1, index)).flatten(0, 1)
        labels = labels.flatten()
        scored = (labels != IGNORED).sum().clamp(min=1)
        if not self.loss_rows:
            return self._summed_loss(picked, labels) / scored
        chunks = (
            # non-reentrant: every chunk uses the word embeddings, and DistributedDataParallel
            # refuses a parameter made ready by several reentrant backward passes
            checkpoint(self._summed_loss, rows, row_labels, use_reentrant=False)
            for rows, row_labels in zip(
                picked.split(self.loss_rows), labels.split(self.loss_rows), strict=True
            )
        )
        return sum(chunks) / scored

    def _summed_loss(self, picked: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(picked, self.words.weight, self.decoder_bias)
        return F.cross_entropy(logits.float(), labels, ignore_index=IGNORED, reduction="sum")


def loss_rows(knobs: dict[str, Any]) -> int:
    """Rows of the head's logits per checkpointed chunk when checkpointing, else 0 (whole)."""
    if not knobs["checkpoint_every"]:
        return 0
    return max(1, LOSS_CHUNK_BYTES // (4 * knobs["vocab"]))


def sequence_lengths(knobs: dict[str, Any], generator: torch.Generator) -> torch.Tensor:
    median, sigma = knobs["length_median"], knobs["length_sigma"]
    lengths = torch.empty(knobs["batch_size"]).log_normal_(
        math.log(median), sigma, generator=generator
    )
    return lengths.round().clamp(16, knobs["max_len"]).long()


def token_batches(knobs: dict[str, Any], rt: Runtime, padded: list[int]) -> Iterator[Batch]:
    """New random lengths for every batch, drawn on the host (which must know each batch's
    padded shape); tokens and masks are made on the device. Appends each padded length."""
    generator = torch.Generator().manual_seed(knobs["seed"] + rt.rank)
    vocab, max_len = knobs["vocab"], knobs["max_len"]
    while True:
        lengths = sequence_lengths(knobs, generator)
        longest = int(lengths.max())
        length = (
            max_len
            if knobs["padding"] == "fixed"
            else min(max_len, round_up(longest, knobs["pad_multiple"]))
        )
        padded.append(length)
        predictions = round_up(int(length * MASKED_FRACTION), PREDICTION_MULTIPLE)
        # From pageable memory CUDA may wait for the stream before it copies (the runtime API's
        # "API synchronization behavior"), which would hold the host until the last step is
        # done; from pinned memory the copy is queued and the host goes on.
        pinned = lengths.pin_memory() if rt.device.type == "cuda" else lengths
        on_device = pinned.to(rt.device, non_blocking=True)
        keep = torch.arange(length, device=rt.device) < on_device[:, None]
        tokens = torch.randint(FIRST_WORD_TOKEN, vocab, (len(lengths), length), device=rt.device)
        tokens = tokens.masked_fill(~keep, 0)
        # Positions drawn within each sequence's real tokens; of the prediction slots, each
        # sequence scores only the first 15% of its own length (the rest are IGNORED).
        draws = torch.rand(len(lengths), predictions, device=rt.device)
        positions = (draws * on_device[:, None]).long()
        labels = torch.gather(tokens, 1, positions)
        scored = (
            torch.arange(predictions, device=rt.device) < (on_device * MASKED_FRACTION)[:, None]
        )
        labels = labels.masked_fill(~scored, IGNORED)
        tokens = tokens.scatter(1, positions, MASK_TOKEN)
        yield Batch((tokens, keep, positions, labels), len(lengths), int(lengths.sum()))


def masked_lm_loss(model: nn.Module, data: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return model(*data)


def parse_knobs(argv: list[str]) -> dict[str, Any]:
    parser = common_parser(__doc__.splitlines()[0], PRESETS)
    parser.add_argument("--padding", choices=("dynamic", "fixed"))
    parser.add_argument("--max-len", type=positive_int)
    parser.add_argument(
        "--pad-multiple",
        type=positive_int,
        help="dynamic padding rounds each batch's length up to a multiple of this (default 64)",
    )
    args = parser.parse_args(argv)
    knobs = resolve_knobs(args, PRESETS, recipe_defaults(args.tiny))
    if knobs["max_len"] < 16:
        raise RecipeError("usage", "--max-len must be at least 16")
    knobs["channels_last"] = None  # not applicable to a transformer
    knobs["workers"] = None  # batches are made on the device, no DataLoader
    # Dynamic padding changes the length (and the count of masked slots) every batch: compile
    # for symbolic shapes at once rather than after the first shape change.
    knobs["compile_dynamic"] = knobs["padding"] == "dynamic" if knobs["compile"] else None
    return knobs


def main(argv: list[str]) -> None:
    knobs = parse_knobs(argv)
    rt = start_runtime(knobs)
    configure_math(knobs)
    model = MaskedLanguageModel(knobs, loss_rows=loss_rows(knobs))
    layers = [(model.layers, index) for index in range(len(model.layers))]
    checkpoint_blocks(layers, knobs["checkpoint_every"], knobs["selective_checkpoint"])
    model = prepare_model(model, knobs, rt)
    optimizer = make_optimizer(torch.optim.AdamW, model, knobs, lr=1e-4, weight_decay=0.01)
    padded: list[int] = []
    batches = token_batches(knobs, rt, padded)
    result = train(RECIPE, knobs, rt, model, optimizer, batches, masked_lm_loss)
    extra = {"mean_padded_len": sum(padded) / len(padded) if padded else None}
    emit({**summary(RECIPE, knobs, rt, result), **extra}, rt)


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
