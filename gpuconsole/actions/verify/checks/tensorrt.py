"""Is TensorRT installed: its Python package, a libnvinfer package, or the library itself?"""

from __future__ import annotations

from gpuconsole.actions.verify import compat
from gpuconsole.actions.verify.judging import no_answer
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

TENSORRT = Probe(
    "tensorrt",
    "if command -v python3 >/dev/null 2>&1 && python3 -c "
    "'import tensorrt; print(\"python tensorrt\", tensorrt.__version__)' 2>/dev/null; "
    "then exit 0; fi; "
    "if command -v dpkg-query >/dev/null 2>&1 && dpkg-query -W "
    "-f='${db:Status-Abbrev} ${Package} ${Version}\\n' 'libnvinfer*' 2>/dev/null "
    '| awk \'$1 == "ii" { print "dpkg", $2, $3 }\' | grep .; then exit 0; fi; '
    "ls /usr/lib/x86_64-linux-gnu/libnvinfer.so.* /usr/lib64/libnvinfer.so.* 2>/dev/null "
    "| sed 's/^/library /' | grep . || exit 127",
    timeout=30.0,
)
"""One line per find: "python tensorrt 10.3.0", "dpkg libnvinfer10 10.3.0.26-1+cuda12.5" or
"library /usr/lib/x86_64-linux-gnu/libnvinfer.so.10.3.0"; exit 127 when none."""


def _tensorrt_version(line: str) -> str | None:
    source, _, rest = line.partition(" ")
    if source == "library":
        return rest.split(".so.")[-1] if ".so." in rest else None
    words = rest.split()
    return words[-1].split("-")[0] if words else None


def _judge_tensorrt(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[TENSORRT.name]
    if output.timed_out:
        return no_answer(TENSORRT, Status.WARN, "Run `python3 -c 'import tensorrt'` by hand.")
    finds = [line for line in output.lines(20) if _tensorrt_version(line)] if output.ok else []
    if not finds:
        return Verdict(
            Status.SKIP,
            "TensorRT is not installed (no tensorrt Python package, libnvinfer package or library)",
        )
    versions = [_tensorrt_version(line) or "" for line in finds]
    newest = max(versions, key=lambda v: compat.version(v) or ())
    source = finds[versions.index(newest)].split()[0]
    return Verdict(Status.PASS, f"TensorRT {newest} ({source})", tuple(finds[:6]))


CHECKS: tuple[Check, ...] = (Check("tensorrt", "TensorRT installed", (TENSORRT,), _judge_tensorrt),)
