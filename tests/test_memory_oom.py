"""PyTorch's out-of-memory messages, read and explained.

The first messages below are written from the allocator's formats, one per era of PyTorch (see
gpuconsole/actions/memory/oom.py), with figures made up to exercise each cause; the `H200` ones are
real: ``str()`` of the ``torch.OutOfMemoryError`` that torch 2.11.0+cu130 raised on an NVIDIA H200
(driver 580.159.04), each from a fresh process made to fail that way. tests/test_memory_oom_rules.py
holds the rules' property test.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_runner import gpuconsole

import gpuconsole.actions.memory.oom as oom
from gpuconsole.actions.memory.oom import OomParseError, diagnose, parse_oom
from gpuconsole.core.model import GpuProcess

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
# 2.2 and later, the job alone fills an 80 GB card, and 1.58 GiB of what it reserved is split off
# partly used blocks: more than the 1 GiB asked, so it is fragmentation, as PyTorch defines it.
V2_4_FULL_FRAGMENTED = (
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

_H200_TAIL = (
    " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-"
    "cuda-alloc-conf)"
)
H200 = {
    # The issue's figures: four 4 GiB blocks freed and re-used by 2.15 GiB tensors. With
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the same program did not fail.
    "fragmented": "CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 2.30 GiB is free. Including non-PyTorch memory, this process has 137.49 "
    "GiB memory in use. Of the allocated memory 129.59 GiB is allocated by PyTorch, and 7.40 GiB "
    "is reserved by PyTorch but unallocated.",
    # One block of 1.50 GiB split off: not enough alone, enough with the free memory; with
    # expandable segments this one did not fail either.
    "fragmented_with_free": "CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total "
    "capacity of 139.80 GiB of which 2.30 GiB is free. Including non-PyTorch memory, this process "
    "has 137.49 GiB memory in use. Of the allocated memory 135.49 GiB is allocated by PyTorch, and "
    "1.50 GiB is reserved by PyTorch but unallocated.",
    "too_big": "CUDA out of memory. Tried to allocate 10.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 5.00 GiB is free. Including non-PyTorch memory, this process has 134.79 "
    "GiB memory in use. Of the allocated memory 134.29 GiB is allocated by PyTorch, and 0 bytes is "
    "reserved by PyTorch but unallocated.",
    "exceeds": "CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 139.29 GiB is free. Including non-PyTorch memory, this process has 518.00 "
    "MiB memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is "
    "reserved by PyTorch but unallocated.",
    # torch.cuda.set_per_process_memory_fraction(0.25): the card had room, the share did not.
    "capped": "CUDA out of memory. Tried to allocate 10.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 109.29 GiB is free. Including non-PyTorch memory, this process has 30.51 "
    "GiB memory in use. 34.95 GiB allowed; Of the allocated memory 30.00 GiB is allocated by "
    "PyTorch, and 0 bytes is reserved by PyTorch but unallocated.",
    # A child process holding 100 GiB; NVML names it after this process.
    "others": "CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 18.77 GiB is free. Including non-PyTorch memory, this process has 20.51 "
    "GiB memory in use. Process 581 has 100.51 GiB memory in use. Of the allocated memory 20.00 "
    "GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.",
    # A CUDA graph whose capture freed 1 GiB inside its private pool.
    "graph_pool": "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 2.00 GiB is free. Including non-PyTorch memory, this process has 137.79 "
    "GiB memory in use. Of the allocated memory 137.11 GiB is allocated by PyTorch, with 1.02 GiB "
    "allocated in private pools (e.g., CUDA Graphs), and 18.00 MiB is reserved by PyTorch but "
    "unallocated.",
}
H200 = {name: text + _H200_TAIL for name, text in H200.items()}


def test_every_era_of_the_message_is_read() -> None:
    old = parse_oom(V1_4)
    assert (old.gpu, old.requested_mib, old.allocated_mib) == (0, 12.5, 8.57)
    assert old.free_mib == pytest.approx(9.28 * 1024)
    # "cached" was what the allocator held beyond the allocated, not its total
    assert old.unallocated_mib == pytest.approx(4.68) and old.version == "up to 1.4"
    assert old.reserved_mib == pytest.approx(8.57 + 4.68)
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
    log = f"epoch 1\n{V1_4}\nretrying with a smaller batch\nTraceback ...\n{V2_4_FULL_FRAGMENTED}\n"
    assert parse_oom(log).total_mib == pytest.approx(79.14 * 1024)
    with pytest.raises(OomParseError):
        parse_oom("RuntimeError: NCCL error: unhandled system error")


def test_the_real_messages_are_read() -> None:
    others = parse_oom(H200["others"])
    assert others.others == ((581, pytest.approx(100.51 * 1024)),)
    assert others.process_mib == pytest.approx(20.51 * 1024)
    pools = parse_oom(H200["graph_pool"])  # the private pools' clause between the two figures
    assert pools.allocated_mib == pytest.approx(137.11 * 1024)
    assert pools.unallocated_mib == pytest.approx(18.0)
    capped = parse_oom(H200["capped"])
    assert capped.allowed_mib == pytest.approx(34.95 * 1024)
    assert parse_oom(H200["too_big"]).unallocated_mib == 0.0  # "0 bytes"
    assert parse_oom(V2_4_OTHERS).allowed_mib is None


def test_an_old_message_with_a_cap_is_read() -> None:
    capped = V2_0_SHARED.replace("47.06 MiB free; ", "47.06 MiB free; 3.96 GiB allowed; ")
    message = parse_oom(capped)
    assert message.allowed_mib == pytest.approx(3.96 * 1024) and message.reserved_mib == 188.0


def _fixes(text: str) -> list[str]:
    return [fix.title for fix in diagnose(parse_oom(text)).fixes]


def test_each_cause_is_told_apart() -> None:
    assert diagnose(parse_oom(TOO_LARGE)).cause == "request-exceeds-card"
    assert diagnose(parse_oom(H200["exceeds"])).cause == "request-exceeds-card"
    fragmented = (V2_1_FRAGMENTED, V2_4_FULL_FRAGMENTED, H200["fragmented"])
    for text in (*fragmented, H200["fragmented_with_free"]):
        assert diagnose(parse_oom(text)).cause == "fragmentation"
        assert _fixes(text)[0] == "expandable segments"
    assert diagnose(parse_oom(V2_4_OTHERS)).cause == "other-processes"
    # fragments that could hold the request come first, other processes or not
    split = V2_4_OTHERS.replace("1.02 GiB is reserved", "2.02 GiB is reserved")
    assert diagnose(parse_oom(split)).cause == "fragmentation"
    others = diagnose(parse_oom(H200["others"]))
    assert others.cause == "other-processes" and "pid 581 100.51 GiB" in others.summary
    too_big = diagnose(parse_oom(H200["too_big"]))
    assert too_big.cause == "too-big"
    assert _fixes(H200["too_big"])[:3] == [
        "mixed precision",
        "activation checkpointing",
        "micro-batches with gradient accumulation",
    ]
    # 18 MiB of fragments and 2 GiB free do not make 4 GiB; the graphs' pools are not reusable
    assert diagnose(parse_oom(H200["graph_pool"])).cause == "too-big"


def test_a_cap_is_named_where_the_card_had_room() -> None:
    capped = diagnose(parse_oom(H200["capped"]))
    assert capped.cause == "too-big"
    assert "too big for the 34.95 GiB this process is allowed" in capped.summary
    assert capped.fixes[0].title == "raise the memory fraction"


def test_free_memory_enough_for_the_request_is_not_blamed_on_the_job() -> None:
    # 9.28 GiB free, 12.50 MiB asked: nothing in the figures says why
    famous = diagnose(parse_oom(V1_4))
    assert famous.cause == "unexplained" and "9.28 GiB free" in famous.summary
    # 47.06 MiB free for 36 MiB, while others held the rest of the card: named, not blamed
    shared = diagnose(parse_oom(V2_0_SHARED))
    assert shared.cause == "unexplained" and "other processes held 7.20 GiB" in shared.summary
    assert [f.title for f in shared.fixes] == [
        "watch the card as the job runs",
        "give the job a card of its own",
    ]
    # within the driver's margin (2 to 4 MiB on an H200) the free memory is not enough
    tight = H200["too_big"].replace("5.00 GiB is free", "10.00 GiB is free")
    assert diagnose(parse_oom(tight)).cause == "too-big"


def test_the_consoles_own_reading_names_the_other_processes() -> None:
    holder = GpuProcess(pid=777, gpu=0, used_memory_mib=60_000.0, user="ana", command="python x")
    elsewhere = GpuProcess(pid=778, gpu=3, used_memory_mib=70_000.0, user="bo", command="y")
    diagnosis = diagnose(parse_oom(H200["too_big"]), [holder, elsewhere])
    assert diagnosis.cause == "other-processes"
    assert "pid 777 (ana: python x)" in diagnosis.summary and "778" not in diagnosis.summary


def _oom(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return gpuconsole("oom", *args, input=stdin, env={**os.environ, "NO_COLOR": "1"})


def test_oom_reads_a_log_file_or_stdin(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(f"step 10 loss 2.3\n{V2_1_FRAGMENTED}\n")
    done = _oom(str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fragmentation: PyTorch held 4.84 GiB reserved but unallocated")
    assert "1. expandable segments" in done.stdout
    piped = _oom("-", "--json", stdin=H200["too_big"])
    assert json.loads(piped.stdout)["cause"] == "too-big"


def test_oom_dash_on_a_terminal_says_to_paste_then_reads_until_ctrl_d(tmp_path: Path) -> None:
    """At a terminal, `oom -` asks for the log (a pipe gets no prompt: see above); what is pasted
    is read up to Ctrl-D and explained."""
    from cli_runner import GPUCONSOLE, ROOT
    from hostile import run_in_pty

    from gpuconsole.cli.commands.oom import PASTE_PROMPT

    pasted = H200["too_big"].replace("\n", "\r").encode() + b"\r\x04"
    env = {**os.environ, "NO_COLOR": "1", "TERM": "xterm"}
    command = [*GPUCONSOLE, "oom", "-"]
    output, _ = run_in_pty(command, env, [(1.5, pasted)], size=(200, 40), cwd=ROOT)
    text = output.decode(errors="replace").replace("\r\n", "\n")
    assert text.index(PASTE_PROMPT.split(",")[0]) < text.index("too big"), text[-800:]
    assert "Ctrl-D" in text


def test_the_issues_case_is_fragmentation_in_text_and_json(tmp_path: Path) -> None:
    """7.40 GiB reserved but unallocated, 3.50 GiB asked (the real message): `expandable_segments`
    first, in the text and in the JSON, from a file and from stdin."""
    log = tmp_path / "train.log"
    log.write_text(f"Traceback ...\ntorch.OutOfMemoryError: {H200['fragmented']}\n")
    text = _oom(str(log))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == (
        "fragmentation: PyTorch held 7.40 GiB reserved but unallocated, more than the 3.50 GiB it "
        "asked for, in pieces too small to use"
    )
    assert lines[3].startswith("  1. expandable segments: PYTORCH_CUDA_ALLOC_CONF=expandable_")
    piped = _oom("-", "--json", stdin=log.read_text())
    assert piped.returncode == 0, piped.stderr
    report = json.loads(piped.stdout)
    assert report["cause"] == "fragmentation"
    assert report["unallocated_mib"] == pytest.approx(7.40 * 1024)
    assert report["requested_mib"] == pytest.approx(3.50 * 1024)
    assert report["fixes"][0]["title"] == "expandable segments"
    assert "expandable_segments:True" in report["fixes"][0]["how"]
    assert report["allowed_mib"] is None


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
