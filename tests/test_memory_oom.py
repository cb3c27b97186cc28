"""PyTorch's out-of-memory messages, read and explained.

The messages below are written from the allocator's documented formats, one per era of PyTorch
(see gpuconsole/actions/memory/oom.py), with figures made up to exercise each cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuconsole.actions.memory.oom as oom
from gpuconsole.actions.memory.oom import OomParseError, diagnose, parse_oom
from gpuconsole.model import GpuProcess

# PyTorch up to 1.4: the last field said "cached".
V1_4 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total "
    "capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)"
)
# 1.5 to 2.0; a card shared with another job: this process holds little, nearly nothing is free.
V2_0_SHARED = (
    "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 1; 7.93 GiB total "
    "capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total by "
    "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# 2.1 (with its "capacty"): much reserved but unallocated, more than the request.
V2_1_FRAGMENTED = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a "
    "total capacty of 23.65 GiB of which 1.66 GiB is free. Including non-PyTorch memory, this "
    "process has 20.81 GiB memory in use. Of the allocated memory 12.09 GiB is allocated by "
    "PyTorch, and 4.84 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting max_split_size_mb to avoid fragmentation."
)
# 2.2 and later, another process named in the message.
V2_4_OTHERS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.72 GiB of which 1.12 GiB is free. Process 4242 has 90.00 GiB memory in use. "
    "Including non-PyTorch memory, this process has 48.58 GiB memory in use. Of the allocated "
    "memory 46.10 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# 2.2 and later, the job alone fills an 80 GB card.
V2_4_TOO_BIG = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total "
    "capacity of 79.14 GiB of which 517.88 MiB is free. Including non-PyTorch memory, this process "
    "has 78.62 GiB memory in use. Of the allocated memory 76.52 GiB is allocated by PyTorch, and "
    "1.58 GiB is reserved by PyTorch but unallocated."
)
TOO_LARGE = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 55.57 GiB. GPU 0 has a "
    "total capacty of 12.00 GiB of which 9.02 GiB is free. Of the allocated memory 984.52 MiB is "
    "allocated by PyTorch, and 463.48 MiB is reserved by PyTorch but unallocated."
)


def test_every_era_of_the_message_is_read() -> None:
    old = parse_oom(V1_4)
    assert (old.gpu, old.requested_mib, old.allocated_mib) == (0, 12.5, 8.57)
    assert old.free_mib == pytest.approx(9.28 * 1024)
    assert old.reserved_mib == 4.68 and old.version == "up to 1.4"
    shared = parse_oom(V2_0_SHARED)
    assert shared.gpu == 1 and shared.version == "1.5-2.0"
    assert shared.total_mib == pytest.approx(7.93 * 1024) and shared.reserved_mib == 188.0
    fragmented = parse_oom(V2_1_FRAGMENTED)
    assert fragmented.version == "2.1 (capacty)"
    assert fragmented.unallocated_mib == pytest.approx(4.84 * 1024)
    assert fragmented.process_mib == pytest.approx(20.81 * 1024)
    others = parse_oom(V2_4_OTHERS)
    assert others.others == ((4242, 90.0 * 1024),)
    assert others.reserved_mib == pytest.approx((46.10 + 1.02) * 1024)


def test_the_last_message_of_a_log_is_the_one_read() -> None:
    log = f"epoch 1\n{V1_4}\nretrying with a smaller batch\nTraceback ...\n{V2_4_TOO_BIG}\n"
    assert parse_oom(log).total_mib == pytest.approx(79.14 * 1024)
    with pytest.raises(OomParseError):
        parse_oom("RuntimeError: NCCL error: unhandled system error")


def test_each_cause_is_told_apart() -> None:
    assert diagnose(parse_oom(TOO_LARGE)).cause == "request-exceeds-card"
    fragmented = diagnose(parse_oom(V2_1_FRAGMENTED))
    assert fragmented.cause == "fragmentation"
    assert fragmented.fixes[0].title == "expandable segments"
    assert diagnose(parse_oom(V2_4_OTHERS)).cause == "other-processes"
    # no process named: what the card lacks beyond this process's own is someone else's
    assert diagnose(parse_oom(V2_0_SHARED)).cause == "other-processes"
    too_big = diagnose(parse_oom(V2_4_TOO_BIG))
    assert too_big.cause == "too-big"
    assert [f.title for f in too_big.fixes][:3] == [
        "mixed precision",
        "activation checkpointing",
        "micro-batches with gradient accumulation",
    ]


def test_the_consoles_own_reading_names_the_other_processes() -> None:
    holder = GpuProcess(pid=777, gpu=0, used_memory_mib=60_000.0, user="ana", command="python x")
    elsewhere = GpuProcess(pid=778, gpu=3, used_memory_mib=70_000.0, user="bo", command="y")
    diagnosis = diagnose(parse_oom(V2_4_TOO_BIG), [holder, elsewhere])
    assert diagnosis.cause == "other-processes"
    assert "pid 777 (ana: python x)" in diagnosis.summary and "778" not in diagnosis.summary


def _oom(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuconsole", "oom", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )


def test_oom_reads_a_log_file_or_stdin(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(f"step 10 loss 2.3\n{V2_1_FRAGMENTED}\n")
    done = _oom(str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fragmentation: PyTorch held 4.84 GiB reserved but unallocated")
    assert "1. expandable segments" in done.stdout
    piped = _oom("-", "--json", stdin=V2_4_TOO_BIG)
    assert json.loads(piped.stdout)["cause"] == "too-big"


def test_oom_on_bad_input_says_which_file(tmp_path: Path) -> None:
    missing = _oom(str(tmp_path / "nope.log"))
    assert missing.returncode != 0 and "nope.log" in missing.stderr
    assert "Traceback" not in missing.stderr
    plain = tmp_path / "plain.log"
    plain.write_text("all good\n")
    done = _oom(str(plain))
    assert done.returncode != 0
    assert done.stderr.strip().startswith(f"gpuconsole: {plain}: no 'CUDA out of memory")


def test_a_huge_log_is_read_from_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("wb") as out:  # sparse: 2 GiB of zeros, then the message
        out.truncate(2 << 30)
        out.seek(0, 2)
        out.write(f"\n{V2_1_FRAGMENTED}\n".encode())
    done = _oom(str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fragmentation:")


def test_an_endless_pipe_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom, "MAX_STREAM_BYTES", 3 << 20)  # 3 MiB of /dev/zero, not a GiB
    with open("/dev/zero", "rb") as zeros, pytest.raises(OomParseError, match="without an end"):
        oom.read_log(zeros)


def test_a_number_no_allocator_writes_is_no_message() -> None:
    text = V2_1_FRAGMENTED.replace("GPU 0 has", "GPU " + "9" * 5000 + " has")
    assert parse_oom(text).gpu is None  # not a traceback from int() of 5000 digits
