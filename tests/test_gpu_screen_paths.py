"""The GPU screen of an SSH host shows what the same GPU read in-process shows.

tests/fixtures/h100/ holds what `benchmarks/agent_on_gpu.py --save` recorded on one NVIDIA H100
(driver 580.159.04) under a bf16 matmul load: the agent's lines in `nvml` and `smi` mode, run as
the console runs it over SSH, and `NvmlSource`'s reading taken right after each mode's last
(stored as the recording stores readings). Each pair is drawn on the GPU screen at 160×48, and
the details are compared line by line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from static_source import StaticSource

from gpuconsole.core import fields
from gpuconsole.core.model import HostSnapshot
from gpuconsole.fleet.record import codec
from gpuconsole.telemetry.wire import AgentStream, AgentTick
from gpuconsole.ui.app import GpuConsoleApp
from gpuconsole.ui.screens.gpu import GpuScreen

RECORDED = Path(__file__).parent / "fixtures" / "h100"
MOVING = {"PCIe traffic"}
"""Lines whose values move between two readings a moment apart (NVML samples the PCIe traffic
over 20 ms); the other readings of the load were steady enough to match to the digit."""
SMI_CANNOT = {
    "Temp limits": ("slowdown_temperature_c", "shutdown_temperature_c"),
    "PCIe traffic": ("pcie_tx_kib_s", "pcie_rx_kib_s"),
    "Row remaps": ("remap.correctable", "remap.uncorrectable"),
    "Remap state": ("remap.pending", "remap.failure"),
    "Recovery": ("recovery_action",),
}
"""The lines an agent in `smi` mode leaves N/A, with the fields the table says --query-gpu lacks."""


def agent_reading(mode: str) -> HostSnapshot:
    stream = AgentStream("vm")
    readings = [stream.feed(line) for line in (RECORDED / f"agent-{mode}.jsonl").open()]
    assert stream.malformed == 0
    last = [event for event in readings if isinstance(event, AgentTick)][-1]
    return last.snapshot


def local_reading(mode: str) -> HostSnapshot:
    meta = json.loads((RECORDED / f"local-{mode}.json").read_text())
    data = (RECORDED / f"local-{mode}.row").read_bytes()
    return codec.Decoder(meta["schema"]).keyframe(meta["host"], meta["t"], data)


async def details(snapshot: HostSnapshot) -> dict[str, str]:
    """The GPU screen's details of GPU 0, label → value."""
    app = GpuConsoleApp(StaticSource(snapshot), auto_poll=False, background_start=False)
    async with app.run_test(size=(160, 48)) as pilot:
        app.push_screen(GpuScreen(snapshot.host, 0))
        await pilot.pause()
        await pilot.pause()
        text = str(app.screen.query_one("#gpu-details").render())
    pairs = [line.partition("  ")[::2] for line in text.splitlines()]
    lines = {label.strip(): value.strip() for label, value in pairs}
    assert len(lines) == len(pairs) > 25  # every label once
    return lines


async def test_an_ssh_host_read_through_nvml_shows_what_this_host_shows() -> None:
    agent, local = agent_reading("nvml"), local_reading("nvml")
    assert (agent.source, local.source, agent.bad_values) == ("agent-nvml", "nvml", 0)
    over_ssh, here = await details(agent), await details(local)
    assert over_ssh.keys() == here.keys()
    for label, value in here.items():
        if label in MOVING:
            assert "N/A" not in over_ssh[label] and "N/A" not in value, label
        else:
            assert over_ssh[label] == value, label


async def test_an_ssh_host_read_through_nvidia_smi_lacks_only_what_it_cannot_give() -> None:
    for names in SMI_CANNOT.values():
        for name in names:
            assert fields.QUERY_GPU in fields.BY_NAME[name].absent, name
    agent, local = agent_reading("smi"), local_reading("smi")
    assert (agent.source, agent.bad_values) == ("agent-smi", 0)
    over_ssh, here = await details(agent), await details(local)
    assert over_ssh.keys() == here.keys()
    differ = {label for label, value in here.items() if over_ssh[label] != value}
    assert differ == set(SMI_CANNOT)
    for label in SMI_CANNOT:
        assert "N/A" in over_ssh[label] and "N/A" not in here[label], label


@pytest.mark.parametrize("mode", ["nvml", "smi"])
def test_the_recorded_readings_are_of_the_loaded_h100(mode: str) -> None:
    (gpu,) = local_reading(mode).gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.utilization_pct is not None and gpu.utilization_pct >= 90
    assert gpu.power_w is not None and gpu.power_w > 400
