"""The hardware checks of `gpuconsole verify`, judged on recorded outputs and run for real here.

Where a real output exists it comes from the H200 host of tests/fixtures (driver 580.159.04, one
GPU, Gen5 x16, persistence and ECC on, no NVLink, no systemctl). Every failing case is written
from the tool's documented output format and says so; none of those was captured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from standin import write_standin_smi

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.shell import LocalShell
from gpuconsole.actions.verify import runner
from gpuconsole.actions.verify.checks import HARDWARE, checks_of
from gpuconsole.actions.verify.checks.disk_free import DISK_FREE
from gpuconsole.actions.verify.checks.disk_read import DISK_READ
from gpuconsole.actions.verify.checks.ecc import ECC_COUNTS
from gpuconsole.actions.verify.checks.fabric_manager import FABRIC_MANAGER
from gpuconsole.actions.verify.checks.nvlink import NVLINK_STATUS
from gpuconsole.actions.verify.checks.nvme import NVME
from gpuconsole.actions.verify.checks.p2p_bandwidth import P2P_BANDWIDTH
from gpuconsole.actions.verify.checks.pcie import HOST_DEVICE_BANDWIDTH
from gpuconsole.actions.verify.checks.row_remap import REMAPPED_ROWS
from gpuconsole.actions.verify.checks.xid_log import KERNEL_XIDS
from gpuconsole.actions.verify.model import CheckResult, Probe, Status
from gpuconsole.actions.verify.probes import NVSWITCHES, SMI_DETAILS, SMI_QUERY
from gpuconsole.hosts.targets import Context

FIXTURES = Path(__file__).parent / "fixtures"
CONTEXT = Context("gpu01")
HARDWARE_CHECKS = checks_of(HARDWARE)
PROBES = {
    "SMI_QUERY": SMI_QUERY,
    "ECC_COUNTS": ECC_COUNTS,
    "REMAPPED_ROWS": REMAPPED_ROWS,
    "HOST_DEVICE_BANDWIDTH": HOST_DEVICE_BANDWIDTH,
    "NVLINK_STATUS": NVLINK_STATUS,
    "SMI_DETAILS": SMI_DETAILS,
    "NVSWITCHES": NVSWITCHES,
    "P2P_BANDWIDTH": P2P_BANDWIDTH,
    "FABRIC_MANAGER": FABRIC_MANAGER,
    "KERNEL_XIDS": KERNEL_XIDS,
    "NVME": NVME,
    "DISK_FREE": DISK_FREE,
    "DISK_READ": DISK_READ,
}
"""The probes `h200`'s changes name, by their constants' names."""

# --- outputs of the real H200 host ----------------------------------------------------------------

# The SMI_QUERY row assembled from the values the H200 reported in h200-query-gpu.csv (index,
# name, uuid, bus id, driver, PCIe) and h200-q.xml (persistence, ECC mode); compute capability 9.0
# is Hopper's. The query with exactly these fields was not captured.
H200_QUERY = (
    "index, name, uuid, pci.bus_id, driver_version, compute_cap, persistence_mode, "
    "ecc.mode.current, pcie.link.gen.current, pcie.link.gen.max, pcie.link.width.current, "
    "pcie.link.width.max\n"
    "0, NVIDIA H200, GPU-a143f776-ddc0-785d-0c25-421b038c7406, 00000000:00:06.0, 580.159.04, "
    "9.0, Enabled, Enabled, 5, 5, 16, 16\n"
)
H200_UUID = "GPU-a143f776-ddc0-785d-0c25-421b038c7406"
# h200-q.xml's ecc_errors (all 0) and remapped_rows (0, 0, No, No) in these queries' CSV forms.
H200_ECC = "0, 0, 0, 0\n"
H200_REMAP = "00000000:00:06.0, 0, 0, No, No\n"
# h200 environment.txt: `df -h /tmp` said "/dev/vda 252G 17G 64G 21% /"; the same in -P -k form.
H200_DF = (
    "Filesystem     1024-blocks     Used Available Capacity Mounted on\n"
    "/dev/vda         264241152 17825792  67108864      21% /\n"
    "/dev/vda         264241152 17825792  67108864      21% /\n"
)
# The host-device script's JSON as it prints it; the figures are those a Gen5 x16 link gives
# (written, not measured: the script has not been run on the H200 yet).
H200_COPIES = json.dumps(
    {
        "torch": "2.11.0+cu130",
        "gpus": [
            {
                "index": 0,
                "uuid": H200_UUID,
                "name": "NVIDIA H200",
                "pcie_gen": 5,
                "pcie_width": 16,
                "h2d_gbs": 55.6,
                "d2h_gbs": 56.1,
            }
        ],
    }
)


def out(stdout: str = "", code: int | None = 0, stderr: str = "") -> CommandOutput:
    return CommandOutput("(recorded)", code, stdout, stderr)


NOT_FOUND = out("", 127, "sh: 1: systemctl: not found")


def evidence(outputs: dict[Probe, CommandOutput]) -> dict[str, CommandOutput]:
    """Every hardware probe's output: those given; the rest as if their program were missing."""
    found = {p.name: out("", 127, "not found") for p in runner.distinct_probes(HARDWARE_CHECKS)}
    found.update({probe.name: output for probe, output in outputs.items()})
    return found


def h200(**changes: CommandOutput) -> dict[Probe, CommandOutput]:
    """The real H200 host's outputs; ``changes`` replace some, keyed by probe constant name."""
    outputs = {
        SMI_QUERY: out(H200_QUERY),
        ECC_COUNTS: out(H200_ECC),
        REMAPPED_ROWS: out(H200_REMAP),
        NVLINK_STATUS: out(""),  # environment.txt: `nvidia-smi nvlink -s` printed nothing
        SMI_DETAILS: out((FIXTURES / "nvidia-smi" / "h200-q-loaded.txt").read_text()),
        NVSWITCHES: out(""),
        FABRIC_MANAGER: NOT_FOUND,  # environment.txt: "systemctl: command not found"
        KERNEL_XIDS: out("source: journalctl -k -b\n"),
        DISK_FREE: out(H200_DF),
        HOST_DEVICE_BANDWIDTH: out(H200_COPIES + "\n"),
    }
    outputs.update({PROBES[name]: output for name, output in changes.items()})
    return outputs


def judge(
    check_id: str, outputs: dict[Probe, CommandOutput], context: Context = CONTEXT
) -> CheckResult:
    (check,) = [c for c in HARDWARE_CHECKS if c.id == check_id]
    (result,) = runner.judge_all([check], evidence(outputs), context)
    return result


def test_the_load_tests_are_the_heavy_probes() -> None:
    heavy = {p.name for c in HARDWARE_CHECKS for p in c.probes if p.heavy}
    assert heavy == {"host-device-bandwidth", "p2p-bandwidth", "disk-read"}


def test_the_healthy_h200_fails_nothing() -> None:
    results = {r.id: r for r in runner.judge_all(HARDWARE_CHECKS, evidence(h200()), CONTEXT)}
    assert {i: r.status for i, r in results.items()} == {
        "persistence-mode": Status.PASS,
        "ecc": Status.PASS,
        "row-remap": Status.PASS,
        "pcie-link": Status.PASS,
        "host-device-bandwidth": Status.PASS,
        "nvlink": Status.SKIP,
        "p2p-bandwidth": Status.SKIP,
        "fabric-manager": Status.SKIP,
        "xid-log": Status.PASS,
        "nvme": Status.SKIP,
        "disk-free": Status.PASS,
        "disk-read": Status.SKIP,
    }
    assert all(r.remediation is None for r in results.values())
    assert "Gen5 x16 under load" in results["pcie-link"].evidence[0]
    assert results["host-device-bandwidth"].evidence[0] == (
        "GPU 0 (NVIDIA H200): H2D 55.6 GB/s (88.2%), D2H 56.1 GB/s (89.0%) of the 63.0 GB/s per "
        "direction a Gen5 x16 link carries in theory (pass >= 70%, fail < 55%); Gen5 x16 under load"
    )


# --- persistence-mode, ecc ------------------------------------------------------------------------


def test_persistence_off_warns_and_points_at_the_daemon() -> None:
    query = H200_QUERY.replace("9.0, Enabled", "9.0, Disabled")  # written: a GPU with it off
    result = judge("persistence-mode", h200(SMI_QUERY=out(query)))
    assert result.status is Status.WARN
    assert "GPU 0" in result.summary
    assert result.remediation is not None and "nvidia-persistenced" in result.remediation
    assert "deprecated" in result.remediation


def test_a_hung_nvidia_smi_fails() -> None:
    result = judge("persistence-mode", h200(SMI_QUERY=out("", None, "no answer within 15 s")))
    assert result.status is Status.FAIL
    assert "did not answer" in result.summary and result.remediation


def test_uncorrectable_ecc_errors_fail() -> None:
    # written from the query's documented CSV: index, unc. volatile, unc. aggregate, corr. volatile
    result = judge("ecc", h200(ECC_COUNTS=out("0, 3, 3, 120\n")))
    assert result.status is Status.FAIL
    assert "GPU 0: 3 uncorrectable" in result.summary
    assert result.remediation is not None and "nvidia-smi -r" in result.remediation


def test_ecc_disabled_warns_and_a_gpu_without_ecc_passes() -> None:
    disabled = H200_QUERY.replace("Enabled, Enabled", "Enabled, Disabled")
    result = judge("ecc", h200(SMI_QUERY=out(disabled)))
    assert result.status is Status.WARN
    assert result.remediation is not None and "-e 1" in result.remediation
    # a GPU model without ECC prints [N/A] for the mode and the counts
    no_ecc = H200_QUERY.replace("Enabled, Enabled", "Enabled, [N/A]")
    result = judge("ecc", h200(SMI_QUERY=out(no_ecc), ECC_COUNTS=out("0, [N/A], [N/A], [N/A]\n")))
    assert result.status is Status.PASS
    assert "has no ECC" in result.summary


# --- row-remap ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "words"),
    [
        # written from the documented --query-remapped-rows CSV (bus, corr, unc, pending, failure)
        ("00000000:00:06.0, 0, 2, Yes, No", "remap is pending"),
        ("00000000:00:06.0, 0, 9, No, Yes", "remap failed"),
        ("00000000:00:06.0, 0, 513, No, No", "513 rows remapped"),
    ],
)
def test_row_remap_pending_failed_or_worn_out_fails(row: str, words: str) -> None:
    result = judge("row-remap", h200(REMAPPED_ROWS=out(row + "\n")))
    assert result.status is Status.FAIL
    assert words in result.summary and "GPU 0" in result.summary
    assert result.remediation is not None
    assert "nvidia-smi -r" in result.remediation or "RMA" in result.remediation


def test_row_remap_at_the_limit_passes_and_old_gpus_skip() -> None:
    at_limit = judge("row-remap", h200(REMAPPED_ROWS=out("00000000:00:06.0, 4, 512, No, No\n")))
    assert at_limit.status is Status.PASS
    assert "512 row(s)" in at_limit.summary
    # written: pre-Ampere GPUs answer the query with "[N/A]" values
    old = judge(
        "row-remap", h200(REMAPPED_ROWS=out("00000000:00:06.0, [N/A], [N/A], [N/A], [N/A]\n"))
    )
    assert old.status is Status.SKIP


# --- pcie-link, host-device-bandwidth -------------------------------------------------------------


def _query_with_link(gen: int, width: int) -> str:
    return H200_QUERY.replace("5, 5, 16, 16", f"{gen}, 5, {width}, 16")


def _copies(**entry: object) -> CommandOutput:
    gpu = {"index": 0, "uuid": H200_UUID, "name": "NVIDIA H200", "h2d_gbs": 55.6, "d2h_gbs": 56.1}
    return out(json.dumps({"torch": "2.11.0", "gpus": [{**gpu, **entry}]}) + "\n")


def test_a_link_at_half_width_fails() -> None:
    # written: the H200 row with its link trained at x8
    result = judge(
        "pcie-link", h200(SMI_QUERY=out(_query_with_link(5, 8)), HOST_DEVICE_BANDWIDTH=NOT_FOUND)
    )
    assert result.status is Status.FAIL
    assert "x8 of x16" in result.summary
    assert result.remediation is not None and "reseat" in result.remediation


def test_gen3_under_load_fails_but_an_idle_downshift_passes() -> None:
    idle = out(_query_with_link(1, 16))
    loaded = judge(
        "pcie-link", h200(SMI_QUERY=idle, HOST_DEVICE_BANDWIDTH=_copies(pcie_gen=3, pcie_width=16))
    )
    assert loaded.status is Status.FAIL
    assert "Gen3 of Gen5 under load" in loaded.summary
    recovered = judge(
        "pcie-link", h200(SMI_QUERY=idle, HOST_DEVICE_BANDWIDTH=_copies(pcie_gen=5, pcie_width=16))
    )
    assert recovered.status is Status.PASS
    no_load = judge(
        "pcie-link", h200(SMI_QUERY=idle, HOST_DEVICE_BANDWIDTH=out('{"skip": "no torch"}\n'))
    )
    assert no_load.status is Status.PASS
    assert "Gen1 of Gen5 at rest" in no_load.summary and "under load" in no_load.summary


def test_20_gbs_on_an_h200_fails_with_the_likely_causes() -> None:
    result = judge("host-device-bandwidth", h200(HOST_DEVICE_BANDWIDTH=_copies(h2d_gbs=20.0)))
    assert result.status is Status.FAIL
    assert result.summary == (
        "host<->device bandwidth low for the link's theoretical rate, "
        "under 55%: GPU 0 H2D 20 GB/s = 31.7% of Gen5 x16's 63.0 GB/s"
    )
    assert result.remediation is not None
    assert all(word in result.remediation for word in ("pcie-link", "NUMA", "iommu=pt"))


def test_any_gpu_is_held_to_its_own_links_theoretical_rate() -> None:
    # written: an L40S on Gen4 x16 (31.5 GB/s per direction in theory): no per-model figure needed
    query = H200_QUERY.replace("NVIDIA H200", "NVIDIA L40S").replace("5, 5, 16, 16", "4, 4, 16, 16")
    copies = _copies(name="NVIDIA L40S", h2d_gbs=19.0, d2h_gbs=25.0, pcie_gen=4, pcie_width=16)
    result = judge(
        "host-device-bandwidth", h200(SMI_QUERY=out(query), HOST_DEVICE_BANDWIDTH=copies)
    )
    assert result.status is Status.WARN
    assert "under 70%: GPU 0 H2D 19 GB/s = 60.3% of Gen4 x16's 31.5 GB/s" in result.summary
    assert result.evidence[0].startswith(
        "GPU 0 (NVIDIA L40S): H2D 19 GB/s (60.3%), D2H 25 GB/s (79.3%) of the 31.5 GB/s"
    )
    assert result.remediation is not None and "NUMA" in result.remediation


def test_bandwidth_without_torch_skips_saying_why() -> None:
    skip = out('{"skip": "torch is not importable by /usr/bin/python3"}\n')
    result = judge("host-device-bandwidth", h200(HOST_DEVICE_BANDWIDTH=skip))
    assert result.status is Status.SKIP and "torch is not importable" in result.summary
    crashed = out("", 1, "Traceback ...\nRuntimeError: CUDA error: unknown error")
    result = judge("host-device-bandwidth", h200(HOST_DEVICE_BANDWIDTH=crashed))
    assert result.status is Status.WARN and "CUDA error" in " ".join(result.evidence)


# --- nvlink, fabric-manager -----------------------------------------------------------------------


def _nvlink_status(speeds: dict[tuple[int, int], str], gpus: int = 8, links: int = 18) -> str:
    """`nvidia-smi nvlink -s` in its documented form (a header per GPU, a line per link);
    written, not captured: ``speeds`` overrides "26.562 GB/s" for some (gpu, link)."""
    lines = []
    for gpu in range(gpus):
        lines.append(f"GPU {gpu}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{gpu}-0000-0000-0000-0)")
        lines += [f"\t Link {n}: {speeds.get((gpu, n), '26.562 GB/s')}" for n in range(links)]
    return "\n".join(lines) + "\n"


def _hgx_details(state: str, status: str, gpus: int = 8) -> str:
    """`nvidia-smi -q`'s Fabric section per GPU as the H200 capture prints it, with the states
    an NVSwitch system reports (written from NVML's fabric states, not captured)."""
    blocks = [
        f"GPU 00000000:{0x18 + 0x10 * gpu:02X}:00.0\n"
        "    Product Name                          : NVIDIA H100 80GB HBM3\n"
        "    Fabric\n"
        f"        State                             : {state}\n"
        f"        Status                            : {status}\n"
        "        CliqueId                          : 0\n"
        for gpu in range(gpus)
    ]
    return "\n==============NVSMI LOG==============\n\n" + "".join(blocks)


HGX = {
    "SMI_DETAILS": out(_hgx_details("Completed", "Success")),
    "NVSWITCHES": out("0000:05:00.0\n0000:06:00.0\nnvidia-nvswitch0\nnvidia-nvswitch1\n"),
}


def test_an_inactive_link_on_an_nvswitch_board_fails() -> None:
    status = out(_nvlink_status({(3, 7): "<inactive>"}))
    result = judge("nvlink", h200(NVLINK_STATUS=status, **HGX))
    assert result.status is Status.FAIL
    assert "GPU 3 link 7" in result.summary
    assert "GPU 3: 17 of 18 links active; inactive: 7" in result.evidence
    healthy = judge("nvlink", h200(NVLINK_STATUS=out(_nvlink_status({})), **HGX))
    assert healthy.status is Status.PASS and "144 NVLink link(s)" in healthy.summary


def test_a_link_slower_than_its_peers_fails() -> None:
    status = out(_nvlink_status({(5, 2): "13.281 GB/s"}))
    result = judge("nvlink", h200(NVLINK_STATUS=status, **HGX))
    assert result.status is Status.FAIL
    assert "GPU 5 link 2 at 13.281 GB/s" in result.summary


def test_bridged_pcie_cards_pass_with_links_unwired_alike() -> None:
    # written: two PCIe cards on NVLink bridges, links 4, 5, 10, 11 unwired on both
    unwired = {(g, n): "<inactive>" for g in range(2) for n in (4, 5, 10, 11)}
    status = out(_nvlink_status(unwired, gpus=2, links=12))
    assert judge("nvlink", h200(NVLINK_STATUS=status)).status is Status.PASS
    # the same link down on one card only is a bridge or link that failed
    status = out(_nvlink_status({**unwired, (1, 0): "<inactive>"}, gpus=2, links=12))
    result = judge("nvlink", h200(NVLINK_STATUS=status))
    assert result.status is Status.FAIL and "GPU 1 link 0" in result.summary


def test_fabric_manager_inactive_on_an_hgx_h100_fails() -> None:
    outputs = h200(
        NVLINK_STATUS=out(_nvlink_status({})),
        SMI_DETAILS=out(_hgx_details("Not Started", "N/A")),
        NVSWITCHES=HGX["NVSWITCHES"],
        FABRIC_MANAGER=out("inactive\n", 3),  # `systemctl is-active` prints the state, exits 3
    )
    result = judge("fabric-manager", outputs)
    assert result.status is Status.FAIL
    assert "nvidia-fabricmanager is inactive" in result.summary and "802" in result.summary
    assert result.remediation is not None
    assert "580.159.04" in result.remediation
    assert "systemctl enable --now nvidia-fabricmanager" in result.remediation


def test_fabric_manager_running_with_the_fabric_up_passes() -> None:
    outputs = h200(FABRIC_MANAGER=out("active\n"), **HGX)
    result = judge("fabric-manager", outputs)
    assert result.status is Status.PASS and "8 GPU(s)" in result.summary


# --- p2p-bandwidth --------------------------------------------------------------------------------


def _pairs(changes: dict[tuple[int, int], dict[str, object]], gpus: int = 4) -> CommandOutput:
    pairs = [
        {"src": s, "dst": d, "peer": True, "gbs": 370.0, **changes.get((s, d), {})}
        for s in range(gpus)
        for d in range(gpus)
        if s != d
    ]
    return out(json.dumps({"torch": "2.11.0", "pairs": pairs}) + "\n")


def test_peer_copies_warn_on_a_pair_without_peer_access_or_far_below() -> None:
    result = judge(
        "p2p-bandwidth", h200(P2P_BANDWIDTH=_pairs({(1, 2): {"peer": False, "gbs": 20.0}}))
    )
    assert result.status is Status.WARN
    assert "no peer access for GPU 1->2" in result.summary
    assert "far below the median 370.0 GB/s" in result.summary
    slow = judge("p2p-bandwidth", h200(P2P_BANDWIDTH=_pairs({(0, 3): {"gbs": 150.0}})))
    assert slow.status is Status.WARN and "GPU 0->3 150.0 GB/s" in slow.summary
    healthy = judge("p2p-bandwidth", h200(P2P_BANDWIDTH=_pairs({})))
    assert healthy.status is Status.PASS and "12 GPU pairs" in healthy.summary


def test_peer_copies_skip_on_one_gpu() -> None:
    one = out('{"skip": "torch sees 1 GPU: peer copies need two"}\n')
    assert judge("p2p-bandwidth", h200(P2P_BANDWIDTH=one)).status is Status.SKIP


# --- xid-log --------------------------------------------------------------------------------------

# Written from the driver's documented kernel log form under journalctl -o short-unix.
XID_79 = (
    "1767225600.123456 gpu01 kernel: NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python, "
    "GPU has fallen off the bus.\n"
)
XID_13 = (
    "1767225500.000001 gpu01 kernel: NVRM: Xid (PCI:0000:00:06): 13, pid=99, name=train, "
    "Graphics Exception: ESR 0x405848=0x3f\n"
)


def test_xid_79_fails_and_xid_13_warns() -> None:
    log = "source: journalctl -k -b\n"
    fatal = judge("xid-log", h200(KERNEL_XIDS=out(log + XID_13 + XID_79)))
    assert fatal.status is Status.FAIL
    assert "XID 13, 79" in fatal.summary
    assert "XID 79 x1 on GPU 0: GPU has fallen off the bus (a fleet check fails the node)" in (
        fatal.evidence
    )
    assert fatal.remediation is not None and "reboot the node" in fatal.remediation
    app = judge("xid-log", h200(KERNEL_XIDS=out(log + XID_13 * 2)))
    assert app.status is Status.WARN
    assert "XID 13 x2 on GPU 0: Graphics engine exception (an application error)" in app.evidence
    assert app.remediation is not None and "restart the application" in app.remediation


def test_an_unreadable_kernel_log_skips_saying_why() -> None:
    denied = out("", 77, "dmesg: read kernel buffer failed: Operation not permitted")
    result = judge("xid-log", h200(KERNEL_XIDS=denied))
    assert result.status is Status.SKIP and "Operation not permitted" in result.summary


# --- nvme, disk-free, disk-read -------------------------------------------------------------------


def test_local_nvme_passes_and_none_skips() -> None:
    # written in the probe's own format: name, transport, bytes, model (read from sysfs)
    listing = "nvme0n1 pcie 3840755982336 SAMSUNG MZQL23T8HCLS-00A07\nnvme1n1 tcp 1000000 Remote\n"
    result = judge("nvme", h200(NVME=out(listing)))
    assert result.status is Status.PASS and "1 local NVMe namespace(s), 3.84 TB" in result.summary
    assert judge("nvme", h200(NVME=out(""))).status is Status.SKIP


def test_a_full_disk_fails_and_a_low_one_warns() -> None:
    # written in df -P -k's POSIX format
    header = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n"
    full = header + "/dev/nvme0n1p1  3750000000 3712500000  37500000      99% /raid\n"
    result = judge("disk-free", h200(DISK_FREE=out(H200_DF + full.split("\n", 1)[1])))
    assert result.status is Status.FAIL and "/raid 1% free" in result.summary
    assert result.remediation is not None and "du -xh" in result.remediation
    low = header + "tmpfs              8388608    7340032   1048576      88% /tmp\n"
    result = judge("disk-free", h200(DISK_FREE=out(low)))
    assert result.status is Status.WARN and "/tmp 1.0 GiB (12%) free" in result.summary


def test_disk_read_below_the_floor_warns_and_a_hang_fails() -> None:
    # written in the probe's format, with GNU dd's summary lines
    slow = (
        "dir: /tmp (ext2/ext3)\n"
        "write: 268435456 bytes (268 MB, 256 MiB) copied, 2.1 s, 128 MB/s\n"
        "method: O_DIRECT\n"
        "read: 268435456 bytes (268 MB, 256 MiB) copied, 1.342 s, 200 MB/s\n"
    )
    result = judge("disk-read", h200(DISK_READ=out(slow)))
    assert result.status is Status.WARN
    assert "sequential read 200 MB/s from /tmp (ext2/ext3)" in result.summary
    assert result.remediation is not None and "NVMe" in result.remediation
    hung = judge("disk-read", h200(DISK_READ=out("", None, "no answer within 60 s")))
    assert hung.status is Status.FAIL and "did not finish" in hung.summary


# --- the probes run for real ----------------------------------------------------------------------


async def test_every_probe_runs_on_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU here: the GPU checks skip or judge what they find; the disk is really measured."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    report = await runner.verify_with(LocalShell(), HARDWARE_CHECKS, Context("localhost"))
    results = {r.id: r for r in report.checks}
    assert list(results) == [c.id for c in HARDWARE_CHECKS]
    assert all(not r.summary.startswith("the check itself failed") for r in results.values())
    assert all(isinstance(r.status, Status) for r in results.values())
    assert results["disk-read"].status in (Status.PASS, Status.WARN)
    assert " MB/s from " + str(tmp_path) in results["disk-read"].summary
    assert results["disk-free"].status is not Status.SKIP
    assert list(tmp_path.glob("gpuconsole-read.*")) == []


_FAKE_TORCH = '''
"""A torch stand-in for the copy scripts: each copy takes a fixed 2 ms, two devices answer.

A copy that did nothing would time only the interpreter's noise, and pairs would differ by
more than the judge's factor of two on a busy machine."""
import time

__version__ = "0.0+standin"
uint8 = "uint8"


class _Tensor:
    def copy_(self, other, non_blocking=False):
        time.sleep(0.002)
        return self


def empty(size, dtype=None, device=None, pin_memory=False):
    return _Tensor()


class _Properties:
    def __init__(self, device):
        self.uuid = "%08x-%04x-4c3e-9d1b-%012x" % (0, device, 0x5EED00 + device)  # the stand-in's


class cuda:
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 2)
    get_device_properties = staticmethod(_Properties)
    get_device_name = staticmethod(lambda device: "NVIDIA H200")
    synchronize = staticmethod(lambda device=None: None)
    can_device_access_peer = staticmethod(lambda src, dst: True)
    empty_cache = staticmethod(lambda: None)
'''


async def test_the_copy_scripts_print_what_the_judges_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scripts' torch path, run against a torch stand-in and the stand-in nvidia-smi (two
    H200s, Gen5 x16): the JSON they print is what the judges read."""
    (tmp_path / "torch.py").write_text(_FAKE_TORCH)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_standin_smi(bin_dir, gpus=2)
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    shell = LocalShell()
    copies = await shell.run(HOST_DEVICE_BANDWIDTH.command, HOST_DEVICE_BANDWIDTH.timeout)
    peers = await shell.run(P2P_BANDWIDTH.command, P2P_BANDWIDTH.timeout)
    assert copies.ok and peers.ok, (copies.stderr, peers.stderr)
    gpus = json.loads(copies.stdout)["gpus"]
    assert [(g["index"], g["pcie_gen"], g["pcie_width"]) for g in gpus] == [(0, 5, 16), (1, 5, 16)]
    assert all(g["uuid"].startswith("GPU-00000000-000") and g["h2d_gbs"] > 0 for g in gpus)
    pairs = json.loads(peers.stdout)["pairs"]
    assert [(p["src"], p["dst"], p["peer"]) for p in pairs] == [(0, 1, True), (1, 0, True)]
    # the stand-in knows no compute_cap: the query's rows as the two H200s would answer it
    rows = [
        H200_QUERY.splitlines()[1].replace(H200_UUID, g["uuid"]).replace("0,", f"{i},", 1)
        for i, g in enumerate(gpus)
    ]
    query = out("\n".join([H200_QUERY.splitlines()[0], *rows]) + "\n")
    outputs = evidence({SMI_QUERY: query, HOST_DEVICE_BANDWIDTH: copies, P2P_BANDWIDTH: peers})
    results = {r.id: r for r in runner.judge_all(HARDWARE_CHECKS, outputs, CONTEXT)}
    assert results["pcie-link"].status is Status.PASS
    assert "Gen5 x16 under load" in results["pcie-link"].evidence[0]
    assert results["host-device-bandwidth"].status is Status.PASS
    assert results["p2p-bandwidth"].status is Status.PASS


def test_nvswitches_without_fabric_state_rely_on_the_service() -> None:
    # written: an HGX A100 whose GPUs report no fabric state ("N/A"); only the service can tell
    switches = {"NVSWITCHES": HGX["NVSWITCHES"]}
    unknown = judge("fabric-manager", h200(**switches))
    assert unknown.status is Status.WARN and unknown.remediation is not None
    running = judge("fabric-manager", h200(FABRIC_MANAGER=out("active\n"), **switches))
    assert running.status is Status.PASS
    assert running.summary == "NVSwitch system: nvidia-fabricmanager active"
