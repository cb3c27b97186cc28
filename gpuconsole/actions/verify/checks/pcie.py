"""Are the GPUs' PCIe links at their maximum generation and width, and do host<->device copies
reach the share of the link's theoretical rate a healthy link gives?

The rates are the PCIe specification's; the bandwidth floors are shares of the link's theoretical
rate (`gpuconsole.rules.limits`) and, when several hosts are verified together, of their peers'
median (`peers`). The copies load the host: their probe is `heavy`, run alone after the light
ones; its ``python3`` script uses torch when the host's Python has it."""

from __future__ import annotations

from gpuconsole.actions.output import CommandOutput
from gpuconsole.actions.verify.judging import joined, script_unusable, smi_int, smi_unusable
from gpuconsole.actions.verify.model import Check, Evidence, Figure, Probe, Status, Verdict
from gpuconsole.actions.verify.probes import (
    COPY_PRELUDE,
    SMI_QUERY,
    gpu_rows,
    json_line,
    python_command,
    smi_rows,
)
from gpuconsole.hosts.targets import Context
from gpuconsole.rules.limits import LINK_FAIL_FRACTION, LINK_PASS_FRACTION

_HOST_DEVICE_SCRIPT = (
    COPY_PRELUDE
    + """
SIZE, REPS = 256 << 20, 8

def local_cpus(bus_id):
    # nvidia-smi's 00000000:3B:00.0 is sysfs's 0000:3b:00.0
    try:
        domain, bus, rest = bus_id.lower().split(":")
        with open("/sys/bus/pci/devices/%s:%s:%s/local_cpulist" % (domain[-4:], bus, rest)) as f:
            text = f.read().strip()
        cpus = set()
        for part in text.split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
        return cpus
    except (OSError, ValueError):
        return set()

def timed(copy, device):
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(REPS):
        copy()
    torch.cuda.synchronize(device)
    return gbs(SIZE, REPS, time.perf_counter() - start)

def link_under_load(device, uuid, index, host, gpu):
    # an idle link drops to a lower generation: read it while copies keep it busy
    sample = []
    reader = threading.Thread(target=lambda: sample.extend(
        smi("index,uuid,pcie.link.gen.current,pcie.link.width.current")))
    reader.start()
    while reader.is_alive():
        gpu.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
    for row in sample:
        if len(row) == 4 and (row[1] == uuid if uuid else row[0] == str(index)):
            return {"pcie_gen": int(row[2]) if row[2].isdigit() else None,
                    "pcie_width": int(row[3]) if row[3].isdigit() else None}
    return {}

everything = os.sched_getaffinity(0)
gpus = []
for device, (index, uuid, bus_id) in enumerate(identities()):
    entry = {"index": index, "uuid": uuid, "name": torch.cuda.get_device_name(device)}
    try:
        # pinned memory on the GPU's own NUMA node, as a well-placed data loader has it
        os.sched_setaffinity(0, (local_cpus(bus_id or "") & everything) or everything)
        host = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(SIZE, dtype=torch.uint8, device=device)
        gpu.copy_(host)
        host.copy_(gpu)
        entry.update(link_under_load(device, uuid, index, host, gpu))
        entry["h2d_gbs"] = timed(lambda: gpu.copy_(host, non_blocking=True), device)
        entry["d2h_gbs"] = timed(lambda: host.copy_(gpu, non_blocking=True), device)
        del host, gpu
        torch.cuda.empty_cache()
    except Exception as error:
        entry["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        os.sched_setaffinity(0, everything)
    gpus.append(entry)
finish({"torch": torch.__version__, "gpus": gpus})
"""
)

HOST_DEVICE_BANDWIDTH = Probe(
    "host-device-bandwidth", python_command(_HOST_DEVICE_SCRIPT), timeout=90.0, heavy=True
)
"""Per GPU: 8 timed copies of a 256 MiB pinned buffer each way (the buffer on the GPU's NUMA
node), and the PCIe generation and width nvidia-smi reads while copies run. Prints one JSON line:
{"torch", "gpus": [{"index", "uuid", "name", "h2d_gbs", "d2h_gbs", "pcie_gen", "pcie_width"}]},
or {"skip": why}. About a second per GPU after torch's import and CUDA's start."""


def _loaded_gpus(output: CommandOutput) -> list[dict[str, object]]:
    """The host-device script's per-GPU entries; [] when it did not run or skipped."""
    report = json_line(output) if output.ok else None
    gpus = report.get("gpus") if report else None
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def _matching(row: dict[str, str], loaded: list[dict[str, object]]) -> dict[str, object] | None:
    """The copy script's entry for an nvidia-smi row: same uuid, else same index."""
    for entry in loaded:
        if entry.get("uuid") and entry.get("uuid") == row.get("uuid"):
            return entry
    for entry in loaded:
        if not entry.get("uuid") and str(entry.get("index")) == row.get("index"):
            return entry
    return None


# -- pcie-link -------------------------------------------------------------------------------------


def _link(gen: object, width: object) -> str:
    return f"Gen{gen} x{width}"


def _judge_pcie_link(evidence: Evidence, context: Context) -> Verdict:
    query = evidence[SMI_QUERY.name]
    if trouble := smi_unusable(query, "GPU query"):
        return trouble
    rows = smi_rows(query)
    if not rows:
        return Verdict(Status.SKIP, "nvidia-smi listed no GPU")
    loaded = _loaded_gpus(evidence[HOST_DEVICE_BANDWIDTH.name])
    lines, failures, idle = [], [], []
    for row in rows:
        index = row.get("index", "?")
        gen, gen_max = (
            smi_int(row.get("pcie.link.gen.current")),
            smi_int(row.get("pcie.link.gen.max")),
        )
        width = smi_int(row.get("pcie.link.width.current"))
        width_max = smi_int(row.get("pcie.link.width.max"))
        if None in (gen, gen_max, width, width_max):
            lines.append(f"GPU {index}: link not reported ({_link(gen, width)})")
            continue
        sample = _matching(row, loaded) or {}
        load_gen, load_width = sample.get("pcie_gen"), sample.get("pcie_width")
        line = f"GPU {index}: {_link(gen, width)} at rest of {_link(gen_max, width_max)}"
        if load_gen is not None:
            line += f"; {_link(load_gen, load_width)} under load"
        lines.append(line)
        seen_width = load_width if isinstance(load_width, int) else width
        if seen_width < width_max:
            failures.append(f"GPU {index} runs x{seen_width} of x{width_max}")
        if isinstance(load_gen, int):
            if load_gen < gen_max:
                failures.append(f"GPU {index} runs Gen{load_gen} of Gen{gen_max} under load")
        elif gen < gen_max:
            idle.append(f"GPU {index} Gen{gen} of Gen{gen_max}")
    if failures:
        return Verdict(
            Status.FAIL,
            f"PCIe link degraded: {joined(failures)}",
            tuple(lines),
            "power down, reseat the GPU (and its riser or cable), try another slot; check the "
            "BIOS's PCIe speed setting; `lspci -vv -s <bus>` shows LnkCap against LnkSta; "
            "a link that trains low again points at the slot, riser or GPU",
        )
    if idle:
        return Verdict(
            Status.PASS,
            f"link widths at their maximum; {joined(idle)} at rest, a normal power-saving "
            "downshift: its generation is re-read under load by the host-device-bandwidth test",
            tuple(lines),
        )
    return Verdict(Status.PASS, f"all {len(rows)} GPU link(s) at their maximum", tuple(lines))


# -- host-device-bandwidth -------------------------------------------------------------------------

PCIE_LANE_RATES: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 236 / 256),
}
"""Per PCIe generation: the transfers per second of one lane (GT/s) and the share of the bits
sent that carry data. Generations 1 and 2 code 8 bits in 10 (8b/10b); 3 to 5 code 128 in 130
(128b/130b), each doubling the rate: 8, 16, 32 GT/s (the PCI Express Base Specification's rates,
as PCI-SIG publishes them). Generation 6 sends 64 GT/s in 256-byte flits, of which 236 bytes are
packet data (6 link-layer, 8 CRC, 6 FEC): 92.2 %, ~118 GB/s per direction at x16 (Glenn K.
Lockwood, "PCIe Gen6", glennklockwood.com/garden/PCIe-Gen6). shared/reference/gpu-facts.md
has no PCIe rates."""


def pcie_theoretical_gbs(gen: int | None, width: int | None) -> float | None:
    """GB/s one direction of a link carries at most: GT/s x lanes x encoding / 8 bits. Gen5 x16:
    32 x 16 x 128/130 / 8 = 63.0 GB/s; Gen4 x16 31.5; Gen5 x8 31.5. Packet headers and flow
    control take a further ~10 %, so healthy copies measure ~85-88 % of it. None for a
    generation or width not known."""
    if gen not in PCIE_LANE_RATES or width is None or width <= 0:
        return None
    transfers, encoding = PCIE_LANE_RATES[gen]
    return transfers * width * encoding / 8


def link_status(measured: float, theoretical: float) -> Status:
    """A copy's GB/s against its link's theoretical rate (`limits` says why these shares)."""
    share = measured / theoretical
    if share >= LINK_PASS_FRACTION:
        return Status.PASS
    if share >= LINK_FAIL_FRACTION:
        return Status.WARN
    return Status.FAIL


def _judged_link(
    row: dict[str, str] | None, entry: dict[str, object]
) -> tuple[int | None, int | None]:
    """The generation and width to judge a GPU's copies by: the most its link can train to with
    this GPU and system (nvidia-smi's ``.max``), so a link that trained at half its rate does not
    lower its own bar; the link seen under load where nvidia-smi gives no maximum."""
    gen = smi_int((row or {}).get("pcie.link.gen.max"))
    width = smi_int((row or {}).get("pcie.link.width.max"))
    if gen is None or width is None:
        load_gen, load_width = entry.get("pcie_gen"), entry.get("pcie_width")
        gen = load_gen if isinstance(load_gen, int) else None
        width = load_width if isinstance(load_width, int) else None
    return gen, width


_SLOW_COPIES = (
    "see pcie-link for a degraded link (reseat the GPU); check the GPU's NUMA node "
    "(`nvidia-smi topo -m`) and that jobs bind to it (numactl/CPU affinity); if the kernel runs "
    "the IOMMU in translated mode, boot with `iommu=pt`; make sure no other job was copying at "
    "the same time, then run the check again"
)


def _judge_host_device_bandwidth(evidence: Evidence, context: Context) -> Verdict:
    verdict, report = script_unusable(evidence[HOST_DEVICE_BANDWIDTH.name], "host<->device test")
    if verdict is not None:
        return verdict
    rows = gpu_rows(evidence)
    entries = [g for g in report.get("gpus", []) if isinstance(g, dict)]  # type: ignore[union-attr]
    if not entries:
        return Verdict(Status.SKIP, "the host<->device test found no GPU")
    lines, broken, figures = [], [], []
    shares: list[float] = []
    low: dict[Status, list[str]] = {Status.WARN: [], Status.FAIL: []}
    for entry in entries:
        index, name = entry.get("index"), str(entry.get("name", ""))
        if "error" in entry:
            broken.append(f"GPU {index}: {entry['error']}")
            lines.append(f"GPU {index} ({name}): copy failed: {entry['error']}")
            continue
        row = next((r for r in rows if _matching(r, [entry]) is entry), None)
        gen, width = _judged_link(row, entry)
        link = _link(gen, width) if gen is not None and width is not None else "a link not reported"
        theoretical = pcie_theoretical_gbs(gen, width)
        judged = []
        for direction in ("H2D", "D2H"):
            value = entry.get(f"{direction.lower()}_gbs")
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                judged.append(f"{direction} {value} GB/s")
                continue
            status = None if theoretical is None else link_status(value, theoretical)
            figures.append(
                Figure(
                    f"GPU {index} {direction}",
                    f"{name} {direction} on {link}",
                    float(value),
                    "GB/s",
                    status in (None, Status.PASS),
                )
            )
            if theoretical is None:
                judged.append(f"{direction} {value:g} GB/s")
                continue
            shares.append(value / theoretical)
            judged.append(f"{direction} {value:g} GB/s ({value / theoretical:.1%})")
            if status in low:
                low[status].append(
                    f"GPU {index} {direction} {value:g} GB/s = {value / theoretical:.1%} of "
                    f"{link}'s {theoretical:.1f} GB/s"
                )
        load_gen, load_width = entry.get("pcie_gen"), entry.get("pcie_width")
        under_load = f"; {_link(load_gen, load_width)} under load" if load_gen is not None else ""
        line = f"GPU {index} ({name}): {joined(judged)}"
        if theoretical is None:
            lines.append(f"{line}; link not reported: no theoretical rate to judge by{under_load}")
        else:
            lines.append(
                f"{line} of the {theoretical:.1f} GB/s per direction a {link} link carries in "
                f"theory (pass >= {LINK_PASS_FRACTION:.0%}, fail < {LINK_FAIL_FRACTION:.0%})"
                + under_load
            )
    found = tuple(figures)
    if broken:
        return Verdict(
            Status.FAIL,
            f"host<->device copies failed: {joined(broken)}",
            tuple(lines),
            "read xid-log and the kernel log for this GPU; reset it (`nvidia-smi -r -i <gpu>`) "
            "or reboot, then run the check again",
            found,
        )
    failing, warning = low[Status.FAIL], low[Status.WARN]
    if failing or warning:
        bands = [(LINK_FAIL_FRACTION, failing), (LINK_PASS_FRACTION, warning)]
        problems = [f"under {share:.0%}: {'; '.join(items)}" for share, items in bands if items]
        return Verdict(
            Status.FAIL if failing else Status.WARN,
            "host<->device bandwidth low for the link's theoretical rate, " + "; ".join(problems),
            tuple(lines),
            _SLOW_COPIES,
            found,
        )
    if not shares:
        return Verdict(
            Status.SKIP,
            "copies measured, but nvidia-smi reported no PCIe link to judge them by",
            tuple(lines),
            figures=found,
        )
    least = min(f.value for f in figures)
    return Verdict(
        Status.PASS,
        f"host<->device copies at {least:.1f} GB/s or more on {len(entries)} GPU(s), "
        f"{min(shares):.1%} or more of their links' theoretical rate "
        f"(pass >= {LINK_PASS_FRACTION:.0%})",
        tuple(lines),
        figures=found,
    )


CHECKS: tuple[Check, ...] = (
    Check("pcie-link", "PCIe link", (SMI_QUERY, HOST_DEVICE_BANDWIDTH), _judge_pcie_link),
    Check(
        "host-device-bandwidth",
        "Host<->device copy bandwidth",
        (HOST_DEVICE_BANDWIDTH, SMI_QUERY),
        _judge_host_device_bandwidth,
        peer_remedy="compare this host with its peers: the GPU's NUMA node (`nvidia-smi topo "
        "-m`) and the jobs' CPU binding, the kernel's IOMMU mode (`iommu=pt`), BIOS PCIe "
        "settings and firmware versions; make sure no other job was copying, then run the "
        "check again",
    ),
)
