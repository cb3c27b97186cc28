"""What NVML's start costs the console before its first frame, and whether it holds the
interpreter's lock meanwhile.

    python benchmarks/nvml_start.py

On a GPU host it times, in one fresh process: ``import pynvml``; the first ``nvmlInit`` (wall
and CPU time); ``nvmlDeviceGetCount``; ``nvmlShutdown``; a second ``nvmlInit`` after it and a
nested one. Then it runs ``nvmlInit`` on a thread while the main thread counts in a loop for
0.1 s, against the same loop alone: a ratio near 1 says the library released the lock, so a
start could overlap it with the imports.
"""

from __future__ import annotations

import threading
import time


def spin(seconds: float) -> int:
    count = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += 1
    return count


def main() -> None:
    began = time.perf_counter()
    import pynvml

    imported = time.perf_counter()
    cpu = time.process_time()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise SystemExit(f"nvml_start: NVML does not start here: {error}") from None
    initialised = time.perf_counter()
    init_cpu = time.process_time() - cpu
    pynvml.nvmlDeviceGetCount()
    counted = time.perf_counter()
    pynvml.nvmlShutdown()
    shut = time.perf_counter()
    pynvml.nvmlInit()
    again = time.perf_counter()
    pynvml.nvmlInit()
    nested = time.perf_counter()
    pynvml.nvmlShutdown()
    pynvml.nvmlShutdown()
    print(
        f"import pynvml {imported - began:.4f} s, nvmlInit {initialised - imported:.4f} s "
        f"({init_cpu:.4f} s of CPU), count {counted - initialised:.4f} s, "
        f"shutdown {shut - counted:.4f} s, init again {again - shut:.4f} s, "
        f"nested init {nested - again:.4f} s"
    )
    alone = spin(0.1)
    done: list[float] = []
    beside = threading.Thread(
        target=lambda: (pynvml.nvmlInit(), done.append(time.perf_counter())), daemon=True
    )
    started = time.perf_counter()
    beside.start()
    counted_beside = spin(0.1)
    beside.join()
    pynvml.nvmlShutdown()
    print(
        f"a loop beside nvmlInit on a thread kept {counted_beside / alone:.2f} of its pace; "
        f"the init took {done[0] - started:.4f} s"
    )


if __name__ == "__main__":
    main()
