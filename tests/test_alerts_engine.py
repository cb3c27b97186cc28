"""The alert engine on simulated time series: pending → firing → resolved, `for:` honoured."""

from __future__ import annotations

from conftest import EPOCH, NOW

from gpuconsole.core import xid as xids
from gpuconsole.core.model import GpuState, HostSnapshot, Severity, XidEvent
from gpuconsole.fleet.alerts.defaults import BUILT_IN_RULES, DEFAULT_RULES
from gpuconsole.fleet.alerts.engine import FIRING, PENDING, Alert, AlertEngine
from gpuconsole.fleet.alerts.rules import rule_from_dict
from gpuconsole.fleet.poller import collect
from gpuconsole.telemetry.sim import HostUnreachable, SimRack, demo_rack

HOT = rule_from_dict(
    {
        "name": "gpu-hot",
        "expr": "temperature_c >= 85",
        "for": "1m",
        "severity": "warning",
        "message": "{host} GPU {gpu} at {value:.0f} °C",
        "labels": {"team": "infra"},
    },
    "test",
)
BUSY_HOST = rule_from_dict(
    {
        "name": "host-busy",
        "expr": "utilization_pct > 95",
        "scope": "host",
        "for": "0s",
        "severity": "info",
        "message": "{host} at {value:.0f} %",
    },
    "test",
)
XIDS = rule_from_dict({"name": "xids", "findings": ["xid", "gpu-lost"]}, "test")


def snap(t: float, *temps: float | None, host: str = "n1", **extra: object) -> HostSnapshot:
    gpus = tuple(GpuState(index=i, temperature_c=temp) for i, temp in enumerate(temps))
    return HostSnapshot(host=host, time=t, gpus=gpus, **extra)  # type: ignore[arg-type]


def states(engine: AlertEngine) -> dict[tuple[str, str, int | None], str]:
    return {alert.key: alert.state for alert in engine.active()}


def test_pending_then_firing_then_resolved() -> None:
    engine = AlertEngine([HOT])
    key = ("gpu-hot", "n1", 0)
    assert engine.evaluate([snap(0, 80.0)], 0) == []
    alerts = engine.evaluate([snap(10, 86.0)], 10)
    assert [(a.key, a.state, a.since) for a in alerts] == [(key, PENDING, 10)]
    assert alerts[0].message == "n1 GPU 0 at 86 °C"
    assert alerts[0].severity is Severity.WARNING
    assert alerts[0].labels == (("team", "infra"),)
    engine.evaluate([snap(69, 90.0)], 69)
    assert states(engine) == {key: PENDING}  # 59 s of a 1 m `for`
    engine.evaluate([snap(70, 88.0)], 70)
    assert states(engine) == {key: FIRING}
    assert engine.active()[0].since == 10  # since the condition began, not since firing
    assert engine.active()[0].message == "n1 GPU 0 at 88 °C"
    engine.evaluate([snap(80, 84.0)], 80)
    assert engine.active() == []


def test_a_break_restarts_the_for_period() -> None:
    engine = AlertEngine([HOT])
    engine.evaluate([snap(0, 86.0)], 0)
    engine.evaluate([snap(50, 84.0)], 50)  # below the threshold once
    engine.evaluate([snap(60, 86.0)], 60)
    engine.evaluate([snap(110, 86.0)], 110)
    alert = engine.active()[0]
    assert (alert.state, alert.since) == (PENDING, 60)
    engine.evaluate([snap(120, 86.0)], 120)
    assert engine.active()[0].state == FIRING


def test_a_missing_reading_resolves_rather_than_fires() -> None:
    engine = AlertEngine([HOT])
    engine.evaluate([snap(0, 86.0)], 0)
    engine.evaluate([snap(1, None)], 1)
    assert engine.active() == []


def test_zero_for_fires_at_once_and_host_scope_compares_the_mean() -> None:
    engine = AlertEngine([BUSY_HOST])

    def host(t: float, *utils: float | None) -> HostSnapshot:
        gpus = tuple(GpuState(index=i, utilization_pct=u) for i, u in enumerate(utils))
        return HostSnapshot("n1", t, gpus)

    assert engine.evaluate([host(0, 100.0, 80.0)], 0) == []  # mean 90
    alerts = engine.evaluate([host(1, 100.0, 98.0, None)], 1)  # a GPU without a reading is skipped
    assert [(a.gpu, a.state, a.message) for a in alerts] == [(None, FIRING, "n1 at 99 %")]


def test_host_scope_mean_is_exact() -> None:
    engine = AlertEngine([BUSY_HOST])
    utils = (100.0, 92.0)
    snapshot = HostSnapshot(
        "n1", 0, tuple(GpuState(index=i, utilization_pct=u) for i, u in enumerate(utils))
    )
    assert [a.message for a in engine.evaluate([snapshot], 0)] == ["n1 at 96 %"]


def test_finding_rule_takes_the_worst_finding_per_gpu() -> None:
    engine = AlertEngine([XIDS])
    lost = HostSnapshot(
        "n1",
        5,
        (GpuState(index=0, temperature_c=40.0), GpuState(index=1, lost=True)),
        xid_events=(XidEvent(13, 0, 4.0), XidEvent(79, 1, 4.5)),
    )
    alerts = {a.gpu: a for a in engine.evaluate([lost], 5)}
    assert set(alerts) == {0, 1}
    assert alerts[1].severity is Severity.CRITICAL  # gpu-lost / XID 79
    assert alerts[1].state == FIRING
    assert alerts[0].severity is xids.severity(13)  # an application error: not critical
    assert alerts[0].severity < Severity.CRITICAL
    assert alerts[0].message.startswith("n1: XID 13 on GPU 0")


def test_hosts_are_kept_between_partial_updates_and_go_stale() -> None:
    engine = AlertEngine([HOT], stale_after=300)
    engine.evaluate([snap(0, 90.0, host="a"), snap(0, 90.0, host="b")], 0)
    engine.evaluate([snap(100, 90.0, host="a")], 100)  # b sent nothing new
    assert states(engine) == {("gpu-hot", "a", 0): FIRING, ("gpu-hot", "b", 0): FIRING}
    engine.evaluate([snap(301, 90.0, host="a")], 301)  # b's reading is now 301 s old
    assert states(engine) == {("gpu-hot", "a", 0): FIRING}


def test_acknowledgement_lasts_until_the_alert_resolves() -> None:
    engine = AlertEngine([HOT])
    key = ("gpu-hot", "n1", 0)
    engine.evaluate([snap(0, 90.0)], 0)
    engine.acknowledge(key)
    engine.evaluate([snap(1, 90.0)], 1)
    assert engine.acknowledged(key)
    engine.unacknowledge(key)
    assert not engine.acknowledged(key)
    engine.acknowledge(key)
    engine.evaluate([snap(2, 80.0)], 2)
    engine.evaluate([snap(3, 90.0)], 3)
    assert not engine.acknowledged(key)  # a new occurrence is news again
    engine.acknowledge(("gpu-hot", "n1", 7))  # no such alert: nothing to acknowledge
    assert not engine.acknowledged(("gpu-hot", "n1", 7))


def test_silence_runs_in_readings_time_and_survives_a_resolve() -> None:
    engine = AlertEngine([HOT])
    key = ("gpu-hot", "n1", 0)
    engine.evaluate([snap(0, 90.0)], 0)
    engine.silence(key, 600)
    assert engine.silenced_until(key) == 600
    engine.evaluate([snap(100, 80.0)], 100)
    engine.evaluate([snap(200, 90.0)], 200)
    assert engine.silenced_until(key) == 600
    assert states(engine) == {key: PENDING}  # a silence hides nothing from active()
    engine.evaluate([snap(600, 90.0)], 600)
    assert engine.silenced_until(key) is None
    engine.silence(key, 60)
    engine.unsilence(key)
    assert engine.silenced_until(key) is None


def test_replay_evaluates_in_time_order() -> None:
    history = [snap(t, 90.0) for t in (30, 0, 60, 10)]
    engine = AlertEngine([HOT])
    alerts = engine.replay(history)
    assert [(a.state, a.since) for a in alerts] == [(FIRING, 0)]
    assert engine.now == 60


def test_replay_traces_an_alert_back_only_to_its_last_break() -> None:
    history = [snap(0, 90.0), snap(10, 70.0), snap(20, 90.0), snap(30, 91.0), snap(90, 92.0)]
    alerts = AlertEngine([HOT]).replay(history)
    assert [(a.key, a.state, a.since) for a in alerts] == [(("gpu-hot", "n1", 0), FIRING, 20)]
    # A gap longer than the staleness limit is a break too.
    alerts = AlertEngine([HOT], stale_after=30).replay(history)
    assert [(a.key, a.state, a.since) for a in alerts] == [(("gpu-hot", "n1", 0), PENDING, 90)]


def test_replay_gives_what_evaluating_at_every_reading_gives() -> None:
    """On a 16-host demo rack read at times that differ by host, with faults starting and hosts
    dropping out: the same alerts, states, starts and messages."""
    rack = demo_rack(hosts=16, seed=3, epoch=EPOCH)
    history = []
    for t in range(int(NOW) - 240, int(NOW) + 1, 3):
        for offset, host in enumerate(rack.hosts):
            try:
                history.append(rack.read(host, t + offset / 20))
            except HostUnreachable:
                continue
    stepwise = AlertEngine(BUILT_IN_RULES)
    for when in sorted({s.time for s in history}):
        stepwise.evaluate([s for s in history if s.time == when], when)
    replayed = AlertEngine(BUILT_IN_RULES).replay(reversed(history))

    def seen(alerts: list[Alert]) -> list[tuple[object, ...]]:
        return [(a.key, a.state, a.since, a.message) for a in alerts]

    assert len(replayed) > 10 and {a.state for a in replayed} == {PENDING, FIRING}
    assert seen(replayed) == seen(stepwise.active())


def test_simulated_rack_faults_raise_the_right_alerts(rack: SimRack) -> None:
    """The demo rack's faults: thermal throttling on a100-01 GPU 2, XID 79 on h100-01 GPU 3."""
    engine = AlertEngine(DEFAULT_RULES)
    for t in range(int(NOW) - 300, int(NOW) + 1, 5):
        snapshots = []
        for host in rack.hosts:
            try:
                snapshots.append(rack.read(host, t))
            except HostUnreachable:
                continue
        engine.evaluate(snapshots, t)
    firing = {a.key: a for a in engine.active() if a.state == FIRING}
    assert ("gpu-throttling", "a100-01", 2) in firing
    assert ("gpu-temperature-high", "a100-01", 2) in firing
    xid = firing[("gpu-xid", "h100-01", 3)]
    assert xid.severity is Severity.CRITICAL
    assert xid.since == NOW - 300  # the fault (at EPOCH + 120) predates the series
    # Every alert is backed by the readings: no alert on a host or GPU that is fine.
    for alert in engine.active():
        assert alert.host in rack.hosts


async def test_the_app_evaluates_at_the_readings_time(make_app, clock) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)):
        assert app.fleet.alerts.now == NOW  # the replayed history ends at the first reading
        before = {a.key: a for a in app.fleet.alerts.active()}
        assert before[("gpu-throttling", "a100-01", 2)].state == FIRING
        clock.advance(30)
        app.apply_readings(collect(app.source))
        assert app.fleet.alerts.now == NOW + 30
        after = {a.key: a for a in app.fleet.alerts.active()}
        assert (
            after[("gpu-throttling", "a100-01", 2)].since
            == before[("gpu-throttling", "a100-01", 2)].since
        )
        assert min(a.since for a in after.values()) > EPOCH
