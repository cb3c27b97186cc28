#!/usr/bin/env python3
"""A small YOLO-like anchor-free detector trained on synthetic mosaic images.

A script that the console sends to a host (with `_recipe_harness.py` beside it) and runs there
with python3 or torchrun: it imports only the standard library, torch and that harness. It prints
one JSON object per line: "step" events, then one "summary", or one "error" and a non-zero exit
status.

The defaults are the guide's YOLOv5 settings (section 5.1): mosaic augmentation, a global batch
of 32 (32 / world size per GPU), an optimizer step every 4 micro-batches, mixed precision (the
guide says fp16; `tuned` uses bf16, which needs no loss scaling; `--precision fp16` runs the
guide's literal setting with a GradScaler).

    python3 detection.py --preset tuned
    torchrun --standalone --nproc-per-node 8 detection.py --preset tuned

Images are made by DataLoader workers on the host, as a real loader's would be, and copied to
the device from pinned memory. `--batch-size` is per process.
"""

from __future__ import annotations

import math
import os
import random
import sys
from _recipe_harness import (
    Batch,
    RecipeError,
    Runtime,
    checkpoint_blocks,
    common_parser,
    configure_math,
    emit,
    loader_batches,
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

RECIPE = "detection"
PRESETS = {
    "baseline": {
        "precision": "fp32",
        "channels_last": False,
        "compile": False,
        "compile_mode": None,
        "cudnn_benchmark": False,
        "fused_optimizer": False,
    },
    "tuned": {
        "precision": "bf16",
        "channels_last": True,
        "compile": True,
        "compile_mode": "default",
        "cudnn_benchmark": True,
        "fused_optimizer": True,
    },
}
GUIDE_GLOBAL_BATCH = 32
GUIDE_ACCUMULATE = 4
STRIDES = (8, 16, 32)
LEVEL_SIZES = (0.1, 0.25)  # a box goes to stride 16 above 10% of the image side, 32 above 25%
CENTRE, SIZE, OBJECTNESS, CLASSES = slice(0, 2), slice(2, 4), 4, slice(5, None)  # channels
OBJECTS_PER_SCENE = 8
PRIOR = 0.01  # initial objectness/class probability (Lin et al. 2017, focal loss)


def recipe_defaults(tiny: bool) -> dict[str, Any]:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    return {
        "batch_size": max(1, GUIDE_GLOBAL_BATCH // world_size),
        "accumulate": GUIDE_ACCUMULATE,
        "steps": 8 if tiny else 100,
        "warmup_steps": 0 if tiny else 20,
        "log_every": 4 if tiny else 10,
        "workers": 0 if tiny else min(8, max(1, (os.cpu_count() or 1) // local_world_size)),
        "image_size": 64 if tiny else 640,
        "width": 8 if tiny else 32,
        "classes": 4 if tiny else 80,
    }


def conv_bn_act(in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.SiLU(inplace=True),
    )


class Residual(nn.Module):
    """1×1 squeeze, 3×3 expand, added to the input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.branch = nn.Sequential(
            conv_bn_act(channels, channels // 2, 1), conv_bn_act(channels // 2, channels, 3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


def stage(in_channels: int, out_channels: int, blocks: int) -> nn.Sequential:
    """A stride-2 convolution, then residual blocks."""
    layers = [conv_bn_act(in_channels, out_channels, 3, 2)]
    layers += [Residual(out_channels) for _ in range(blocks)]
    return nn.Sequential(*layers)


class Detector(nn.Module):
    """Backbone to stride 32, an FPN-lite neck (1×1 laterals, top-down nearest upsampling and
    addition) and one head shared by strides 8, 16 and 32 that predicts, per cell, a box
    (centre offset, log size), objectness and class logits."""

    BACKBONE = ("stem", "stage2", "stage3", "stage4", "stage5")

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.stem = conv_bn_act(3, width, 3, 2)
        self.stage2 = stage(width, 2 * width, 1)
        self.stage3 = stage(2 * width, 4 * width, 2)
        self.stage4 = stage(4 * width, 8 * width, 2)
        self.stage5 = stage(8 * width, 16 * width, 1)
        neck = 4 * width
        self.lateral = nn.ModuleList(conv_bn_act(c * width, neck, 1) for c in (4, 8, 16))
        self.smooth = nn.ModuleList(conv_bn_act(neck, neck) for _ in STRIDES)
        predict = nn.Conv2d(neck, 5 + classes, 1)
        nn.init.constant_(predict.bias, -math.log((1 - PRIOR) / PRIOR))
        self.head = nn.Sequential(conv_bn_act(neck, neck), conv_bn_act(neck, neck), predict)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        c3 = self.stage3(self.stage2(self.stem(images)))
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        p5 = self.lateral[2](c5)
        p4 = self.lateral[1](c4) + F.interpolate(p5, scale_factor=2.0, mode="nearest")
        p3 = self.lateral[0](c3) + F.interpolate(p4, scale_factor=2.0, mode="nearest")
        return [self.head(self.smooth[level](p)) for level, p in enumerate((p3, p4, p5))]


def backbone_slots(model: Detector) -> list[tuple[Detector, str]]:
    """The backbone's stages after the stem, in forward order, as (model, attribute)."""
    return [(model, name) for name in Detector.BACKBONE[1:]]


class MosaicScenes(torch.utils.data.Dataset):
    """Synthetic scenes of class-coloured rectangles on a plain background; each item is four
    scenes tiled around a random centre (mosaic), boxes shifted and clipped with them.

    Items are reproducible from (seed, index). Boxes are rows of (class, x1, y1, x2, y2) in
    pixels, padded with class -1 to a fixed count so batches stack."""

    def __init__(self, size: int, classes: int, length: int, seed: int) -> None:
        self.size, self.classes, self.length, self.seed = size, classes, length, seed
        palette_generator = torch.Generator().manual_seed(seed)
        self.palette = torch.randint(
            256, (classes, 3), generator=palette_generator, dtype=torch.uint8
        )

    def __len__(self) -> int:
        return self.length

    def scene(self, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
        """A scene as its background colour and its boxes; it is drawn only where a tile
        shows it, which spares the workers three quarters of the pixels."""
        size = self.size
        background = torch.tensor([rng.randrange(256) for _ in range(3)], dtype=torch.uint8)
        rows = []
        for _ in range(rng.randint(1, OBJECTS_PER_SCENE)):
            w, h = rng.randint(size // 16, size // 2), rng.randint(size // 16, size // 2)
            x, y = rng.randint(0, size - w), rng.randint(0, size - h)
            rows.append([rng.randrange(self.classes), x, y, x + w, y + h])
        return background, torch.tensor(rows, dtype=torch.float32)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + index)
        size = self.size
        cx, cy = rng.randint(size // 4, 3 * size // 4), rng.randint(size // 4, 3 * size // 4)
        canvas = torch.empty((3, size, size), dtype=torch.uint8)  # the four tiles cover it
        # Canvas region (x0, y0, x1, y1) and the shift (dx, dy) that puts a scene's corner on
        # the centre: the top-left tile shows its scene's bottom-right, and so on.
        tiles = (
            (0, 0, cx, cy, cx - size, cy - size),
            (cx, 0, size, cy, cx, cy - size),
            (0, cy, cx, size, cx - size, cy),
            (cx, cy, size, size, cx, cy),
        )
        kept = []
        for x0, y0, x1, y1, dx, dy in tiles:
            background, boxes = self.scene(rng)
            canvas[:, y0:y1, x0:x1] = background.view(3, 1, 1)
            for label, bx0, by0, bx1, by1 in boxes.long().tolist():  # later boxes occlude
                rows = slice(max(by0 + dy, y0), max(min(by1 + dy, y1), y0))
                cols = slice(max(bx0 + dx, x0), max(min(bx1 + dx, x1), x0))
                canvas[:, rows, cols] = self.palette[label].view(3, 1, 1)
            kept.append(shift_and_clip(boxes, dx, dy, (x0, y0, x1, y1)))
        boxes = torch.cat(kept)
        padded = torch.full((4 * OBJECTS_PER_SCENE, 5), -1.0)
        padded[: len(boxes)] = boxes
        return canvas, padded


def shift_and_clip(
    boxes: torch.Tensor, dx: int, dy: int, region: tuple[int, int, int, int]
) -> torch.Tensor:
    """Boxes moved with their tile and cut to it; those left with under a fifth of their area
    or under 2 px a side are dropped."""
    x0, y0, x1, y1 = region
    moved = boxes + torch.tensor([0.0, dx, dy, dx, dy])
    clipped = moved.clone()
    clipped[:, 1::2] = moved[:, 1::2].clamp(x0, x1)
    clipped[:, 2::2] = moved[:, 2::2].clamp(y0, y1)
    width, height = clipped[:, 3] - clipped[:, 1], clipped[:, 4] - clipped[:, 2]
    area = (moved[:, 3] - moved[:, 1]) * (moved[:, 4] - moved[:, 2])
    keep = (width >= 2) & (height >= 2) & (width * height >= 0.2 * area)
    return clipped[keep]


def detection_loss(
    outputs: list[torch.Tensor], boxes: torch.Tensor, image_size: int
) -> torch.Tensor:
    """Each box is assigned, by its size, to one level and to the cell holding its centre.
    Objectness: BCE over every cell (mean per level). Box (smooth L1 on centre offset and log
    size) and class (cross-entropy): at assigned cells, averaged over boxes. Masks, not boolean
    indexing, select the boxes, so the host never waits on the device for a count."""
    valid = boxes[..., 0] >= 0
    labels = boxes[..., 0].clamp(min=0).long()
    x1, y1, x2, y2 = boxes[..., 1:].unbind(-1)
    width, height = (x2 - x1).clamp(min=1), (y2 - y1).clamp(min=1)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    longest = torch.maximum(width, height)
    level = sum((longest > image_size * share).long() for share in LEVEL_SIZES)
    objects = valid.sum().clamp(min=1)
    objectness_loss = box_loss = class_loss = outputs[0].new_zeros((), dtype=torch.float32)
    for index, output in enumerate(outputs):
        stride = STRIDES[index]
        channels, rows, cols = output.shape[1:]
        cells = output.float().flatten(2).transpose(1, 2)  # [batch, cells, channels]
        assigned = (valid & (level == index)).float()
        gx = (cx / stride).long().clamp(0, cols - 1)
        gy = (cy / stride).long().clamp(0, rows - 1)
        cell = gy * cols + gx
        picked = torch.gather(cells, 1, cell.unsqueeze(-1).expand(-1, -1, channels))
        target_objectness = torch.zeros_like(cells[..., OBJECTNESS]).scatter_add_(1, cell, assigned)
        objectness_loss = objectness_loss + F.binary_cross_entropy_with_logits(
            cells[..., OBJECTNESS], target_objectness.clamp(max=1)
        )
        target_box = torch.stack(
            (cx / stride - gx, cy / stride - gy, (width / stride).log(), (height / stride).log()),
            -1,
        )
        predicted_box = torch.cat((picked[..., CENTRE].sigmoid(), picked[..., SIZE]), -1)
        box_error = F.smooth_l1_loss(predicted_box, target_box, reduction="none").sum(-1)
        box_loss = box_loss + (box_error * assigned).sum()
        class_error = F.cross_entropy(
            picked[..., CLASSES].transpose(1, 2), labels, reduction="none"
        )
        class_loss = class_loss + (class_error * assigned).sum()
    return objectness_loss + (box_loss + class_loss) / objects


def mosaic_batches(knobs: dict[str, Any], rt: Runtime) -> Iterator[Batch]:
    epoch_length = 64 * knobs["batch_size"] * rt.world_size
    dataset = MosaicScenes(knobs["image_size"], knobs["classes"], epoch_length, knobs["seed"])
    memory_format = torch.channels_last if knobs["channels_last"] else torch.contiguous_format

    def to_batch(item: tuple[torch.Tensor, torch.Tensor]) -> Batch:
        pixels, boxes = item
        images = pixels.to(rt.device, non_blocking=True).float().div_(255)
        images = images.contiguous(memory_format=memory_format)
        return Batch((images, boxes.to(rt.device, non_blocking=True)), len(boxes))

    return loader_batches(dataset, knobs, rt, to_batch)


def parse_knobs(argv: list[str]) -> dict[str, Any]:
    parser = common_parser(__doc__.splitlines()[0], PRESETS)
    parser.add_argument("--image-size", type=positive_int, help="a multiple of 32")
    parser.add_argument("--classes", type=positive_int)
    args = parser.parse_args(argv)
    knobs = resolve_knobs(args, PRESETS, recipe_defaults(args.tiny))
    if knobs["image_size"] % max(STRIDES):
        raise RecipeError("usage", f"--image-size must be a multiple of {max(STRIDES)}")
    return knobs


def main(argv: list[str]) -> None:
    knobs = parse_knobs(argv)
    rt = start_runtime(knobs)
    configure_math(knobs)
    model = Detector(knobs["width"], knobs["classes"])
    checkpoint_blocks(
        backbone_slots(model), knobs["checkpoint_every"], knobs["selective_checkpoint"]
    )
    model = prepare_model(model, knobs, rt)
    # YOLOv5's default hyperparameters: lr 0.01, momentum 0.937, weight decay 5e-4, Nesterov.
    optimizer = make_optimizer(
        torch.optim.SGD, model, knobs, lr=0.01, momentum=0.937, weight_decay=5e-4, nesterov=True
    )
    image_size = knobs["image_size"]
    result = train(
        RECIPE,
        knobs,
        rt,
        model,
        optimizer,
        mosaic_batches(knobs, rt),
        lambda model, data: detection_loss(model(data[0]), data[1], image_size),
    )
    emit(summary(RECIPE, knobs, rt, result), rt)


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
