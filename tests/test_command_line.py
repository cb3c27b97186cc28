"""The `:` command line: where a typed line goes, what it completes to, and a line that names
nothing the console has said back in the line, never acted on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_app import tick

from gpuconsole.core.untrusted import UNSAFE
from gpuconsole.fleet.poller import collect
from gpuconsole.fleet.store import FleetStore
from gpuconsole.telemetry.sim import SimSource, demo_rack
from gpuconsole.ui.screens.command_line import (
    CommandError,
    CommandLineScreen,
    completions,
    jobs_of,
    parse_command,
)
from gpuconsole.ui.screens.fleet import FleetScreen
from gpuconsole.ui.screens.gpu import GpuScreen
from gpuconsole.ui.screens.host import HostScreen
from gpuconsole.ui.widgets.keyed_table import KeyedTable


def demo_store() -> FleetStore:
    from conftest import EPOCH, NOW

    from gpuconsole.core.clock import ManualClock

    source = SimSource(demo_rack(hosts=6, seed=7, epoch=EPOCH), ManualClock(NOW))
    store = FleetStore(source.hosts)
    for reading in collect(source):
        if reading.snapshot is not None:
            store.record(reading.snapshot)
    return store


STORE = demo_store()


def test_each_completion_goes_where_it_says() -> None:
    lines = completions(STORE)
    assert {"fleet", "alerts", "triage", "host h100-01", "gpu h100-01 3"} <= set(lines)
    assert any(line.startswith("job ") for line in lines)
    for line in lines:
        destination = parse_command(line, STORE)
        assert destination.screen == line.split()[0]


@settings(max_examples=300)
@given(line=st.text(max_size=80))
def test_any_line_goes_somewhere_known_or_says_why_in_one_safe_line(line: str) -> None:
    try:
        destination = parse_command(line, STORE)
    except CommandError as error:
        said = str(error)
        assert "\n" not in said and not UNSAFE.search(said), repr(said)
        return
    assert destination.host is None or destination.host in STORE.hosts
    assert destination.job is None or destination.job in jobs_of(STORE)


async def test_colon_goes_to_a_host_a_gpu_and_a_jobs_hosts(make_app, clock) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        tick(app, clock)
        await pilot.press("colon")
        assert isinstance(app.screen, CommandLineScreen)
        await pilot.press(*"host a100-0", "tab", "enter")  # Tab completes the first match
        assert isinstance(app.screen, HostScreen) and app.screen.host == "a100-01"

        await pilot.press("colon", *"gpu h100-01 3", "enter")
        assert isinstance(app.screen, GpuScreen)
        assert (app.screen.host, app.screen.gpu) == ("h100-01", 3)
        await pilot.press("escape")
        assert isinstance(app.screen, HostScreen) and app.screen.host == "h100-01"

        job = jobs_of(app.fleet.store)[0]
        await pilot.press("colon", *f"job {job}", "enter")
        assert isinstance(app.screen, FleetScreen)
        shown = [row.key.value for row in app.screen.query_one("#fleet", KeyedTable).ordered_rows]
        running = {
            host
            for host in app.fleet.store.hosts
            if any(
                p.job is not None and str(p.job.job_id) == job
                for p in app.fleet.store.latest(host).processes
            )
        }
        assert shown and set(shown) == running

        await pilot.press("colon", *"host nowhere", "enter")
        assert isinstance(app.screen, CommandLineScreen)  # said in the line, not acted on
        said = str(app.screen.query_one("#command-said").render())
        assert said.startswith("no host nowhere (hosts: h100-01")
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
