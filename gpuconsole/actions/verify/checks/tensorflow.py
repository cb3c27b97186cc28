"""Does TensorFlow use the GPU, and can it set the mixed_float16 policy?"""

from __future__ import annotations

from gpuconsole.actions.verify import probes
from gpuconsole.actions.verify.judging import no_answer
from gpuconsole.actions.verify.model import Check, Evidence, Probe, Status, Verdict
from gpuconsole.hosts.targets import Context

_TENSORFLOW_SCRIPT = """
import json, sys
info = {"python": sys.executable}
try:
    import tensorflow as tf
    info["tensorflow"] = tf.__version__
    info["built_with_cuda"] = tf.test.is_built_with_cuda()
    info["gpus"] = [device.name for device in tf.config.list_physical_devices("GPU")]
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    info["mixed_float16"] = True
except ImportError as error:
    info["missing"] = getattr(error, "name", None) == "tensorflow"
    info["error"] = "%s: %s" % (type(error).__name__, error)
except Exception as error:
    info["error"] = "%s: %s" % (type(error).__name__, error)
print(json.dumps(info))
"""
TENSORFLOW = Probe(
    "tensorflow",
    f"{probes.NEEDS_PYTHON3}TF_CPP_MIN_LOG_LEVEL=2 python3 -c '{_TENSORFLOW_SCRIPT}'",
    timeout=60.0,
)


def _judge_tensorflow(evidence: Evidence, context: Context) -> Verdict:
    output = evidence[TENSORFLOW.name]
    info = probes.json_line(output)
    if info is None:
        if output.missing:
            return Verdict(Status.SKIP, "python3 is not installed")
        if output.timed_out:
            return no_answer(
                TENSORFLOW, Status.WARN, "Run `python3 -c 'import tensorflow'` by hand."
            )
        return Verdict(
            Status.WARN,
            f"the tensorflow probe crashed (exit {output.exit_code})",
            output.lines(),
            "Run `python3 -c 'import tensorflow'` to see the error.",
        )
    if info.get("missing"):
        return Verdict(Status.SKIP, f"tensorflow is not installed for {info.get('python')}")
    version = info.get("tensorflow")
    if version is None:
        return Verdict(
            Status.FAIL,
            f"tensorflow does not import: {info.get('error')}",
            (),
            "Reinstall it: `pip install --force-reinstall 'tensorflow[and-cuda]'`.",
        )
    gpus = info.get("gpus") or []
    lines = (
        f"GPUs: {', '.join(gpus) or 'none'}",
        f"built with CUDA: {info.get('built_with_cuda')}",
    )
    if not gpus and probes.driver_answers(evidence):
        return Verdict(
            Status.FAIL,
            f"TensorFlow {version} sees no GPU on a GPU host",
            (*lines, *([info["error"]] if "error" in info else [])),
            "`pip install 'tensorflow[and-cuda]'` installs a GPU build with the CUDA and cuDNN "
            "it was tested with (tensorflow.org/install/source#gpu lists them); a CPU-only or "
            "mismatched build sees no GPU.",
        )
    if not gpus:
        return Verdict(Status.SKIP, f"TensorFlow {version}; no NVIDIA driver answers here", lines)
    if not info.get("mixed_float16"):
        return Verdict(
            Status.WARN,
            f"TensorFlow {version} sees {len(gpus)} GPU(s); the mixed_float16 policy cannot be set",
            (*lines, str(info.get("error"))),
            "Install the Keras that matches this TensorFlow (`pip install 'tensorflow[and-cuda]'` "
            "pulls it), then `tf.keras.mixed_precision.set_global_policy('mixed_float16')`.",
        )
    return Verdict(
        Status.PASS,
        f"TensorFlow {version} sees {len(gpus)} GPU(s); mixed_float16 can be set",
        lines,
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "tensorflow",
        "TensorFlow uses the GPU",
        (TENSORFLOW, probes.SMI, probes.DRIVER_VERSION),
        _judge_tensorflow,
    ),
)
