"""Alerts to Alertmanager, without one: what an alert becomes (hostile texts bounded, never a
raise), the `[alertmanager]` table and `--alertmanager` checked in one line, and delivery that
never holds a polling round up, whether the other end is down, refuses or never answers.

The Alertmanager itself judges the payload in `test_alertmanager.py`.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import gpuconsole
from hypothesis import given, settings
from hypothesis import strategies as st
from promserver import free_port

from gpuconsole.core.model import Severity
from gpuconsole.core.untrusted import UNSAFE
from gpuconsole.fleet.alerts.alertmanager import (
    MAX_ALERTS,
    MAX_ANNOTATION_CHARS,
    MAX_LABEL_CHARS,
    AlertmanagerSender,
    AlertmanagerSettings,
    alertmanager_url,
    identity,
    posted,
)
from gpuconsole.fleet.alerts.config import load_config, load_rules
from gpuconsole.fleet.alerts.engine import FIRING, PENDING, Alert
from gpuconsole.fleet.alerts.rules import RuleError

fuzz = settings(max_examples=200, deadline=None, database=None)
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"


def alert(
    rule: str = "gpu-ecc",
    host: str = "gpu01",
    gpu: int | None = 3,
    state: str = FIRING,
    since: float = 1_767_225_600.0,
    message: str = "gpu01: GPU 3: 1 uncorrectable ECC error",
    labels: tuple[tuple[str, str], ...] = (),
    remedy: str = "reset the GPU",
    severity: Severity = Severity.CRITICAL,
) -> Alert:
    return Alert(rule, host, gpu, severity, state, since, message, labels, remedy)


# --- what an alert becomes ---------------------------------------------------------------------


def test_an_alert_carries_its_identity_its_texts_and_its_start() -> None:
    sent = posted(
        alert(labels=(("team", "ml-infra"), ("runbook_url", "https://wiki/gpu-ecc"))),
        "GPU-d69fa630",
    )
    assert dict(sent.labels) == {
        "alertname": "GpuEcc",
        "rule": "gpu-ecc",
        "severity": "critical",
        "Hostname": "gpu01",
        "gpu": "3",
        "UUID": "GPU-d69fa630",
        "team": "ml-infra",
        "runbook_url": "https://wiki/gpu-ecc",
    }
    assert dict(sent.annotations) == {
        "summary": "gpu01: GPU 3: 1 uncorrectable ECC error",
        "description": "reset the GPU",
        "runbook_url": "https://wiki/gpu-ecc",
    }
    body = sent.body(ends_at=1_767_226_000.0, now=1_767_225_700.0)
    assert body["startsAt"] == "2026-01-01T00:00:00.000Z"
    assert body["endsAt"] == "2026-01-01T00:06:40.000Z"
    assert "generatorURL" not in body


def test_a_host_wide_alert_has_no_gpu_and_empty_texts_are_left_out() -> None:
    sent = posted(alert(rule="gpu-utilization-high", gpu=None, remedy=""), "GPU-x")
    labels = dict(sent.labels)
    assert "gpu" not in labels
    assert "UUID" in labels  # given, it is taken; the session asks only for a GPU's
    assert dict(sent.annotations) == {"summary": "gpu01: GPU 3: 1 uncorrectable ECC error"}
    assert identity(alert(gpu=None)) == (("alertname", "GpuEcc"), ("Hostname", "gpu01"))


def test_a_rule_label_cannot_take_the_place_of_the_alerts_identity() -> None:
    """The loader refuses these names; an alert built in code cannot pass them either."""
    sent = dict(posted(alert(labels=(("Hostname", "x"), ("alertname", "y"), ("0bad", "z")))).labels)
    assert sent["Hostname"] == "gpu01"
    assert sent["alertname"] == "GpuEcc"
    assert "0bad" not in sent


def test_a_start_ahead_of_this_clock_is_sent_as_now_and_never_after_the_end() -> None:
    ahead = posted(alert(since=2_000_000_000.0))
    assert ahead.body(1_800_000_100.0, 1_800_000_000.0)["startsAt"] == "2027-01-15T08:00:00.000Z"
    resolved = ahead.body(1_800_000_000.0, 1_800_000_100.0)
    assert resolved["startsAt"] == resolved["endsAt"]


HOSTILE_TEXT = st.one_of(
    st.text(max_size=50),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=50),  # lone surrogates
    st.sampled_from(
        [
            "\x1b]52;c;cm0gLXJmIH4=\x07",
            "\x1b[2J\x1b[H",
            "gpu\u202eevil",
            "\ud800",
            "a\x00b\x85c\u2028",
            "x" * 100_000,
            "é" * 5000,
            "",
        ]
    ),
)
LABELS = st.lists(
    st.tuples(st.one_of(st.from_regex(LABEL_NAME, fullmatch=True), HOSTILE_TEXT), HOSTILE_TEXT),
    max_size=5,
).map(tuple)
ALERTS = st.builds(
    alert,
    rule=HOSTILE_TEXT,
    host=HOSTILE_TEXT,
    gpu=st.one_of(st.none(), st.integers(-(2**70), 2**70)),
    state=st.sampled_from([FIRING, PENDING]),
    since=st.floats(allow_nan=True, allow_infinity=True),
    message=HOSTILE_TEXT,
    labels=LABELS,
    remedy=HOSTILE_TEXT,
    severity=st.sampled_from(list(Severity)),
)


@fuzz
@given(ALERTS, st.one_of(st.none(), HOSTILE_TEXT))
def test_any_alert_becomes_bounded_visible_utf8_that_alertmanager_can_take(
    hostile: Alert, uuid: str | None
) -> None:
    sent = posted(hostile, uuid)
    now = 1_800_000_000.0
    body = sent.body(now + 240.0, now)
    encoded = json.dumps(body).encode("ascii")
    assert len(encoded) < 64 * 1024
    labels = body["labels"]
    assert isinstance(labels, dict) and labels["severity"] == hostile.severity.label
    for name, value in labels.items():
        assert json.loads(json.dumps(name)) == name
        assert value and len(value) <= MAX_LABEL_CHARS and not UNSAFE.search(value)
        value.encode("utf-8")  # no lone surrogate: Alertmanager wants valid UTF-8
    assert all(re.fullmatch(LABEL_NAME, name) for name in labels)
    for value in body["annotations"].values():
        assert len(value) <= MAX_ANNOTATION_CHARS and not UNSAFE.search(value)
        value.encode("utf-8")
    assert body["startsAt"] <= body["endsAt"]
    for name, value in identity(hostile):
        assert labels.get(name, "") == value  # a silence matches what is sent


# --- the [alertmanager] table and --alertmanager --------------------------------------------------


def alerts_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "alerts.toml"
    path.write_text(text)
    return path


def test_the_table_gives_urls_resend_and_timeout(tmp_path: Path) -> None:
    path = alerts_file(
        tmp_path,
        '[alertmanager]\nurls = ["http://am1:9093/", "https://am2.example/alertmanager"]\n'
        'resend = "30s"\ntimeout = "5s"\n',
    )
    config = load_config(path)
    assert config.alertmanager == AlertmanagerSettings(
        ("http://am1:9093", "https://am2.example/alertmanager"), 30.0, 5.0
    )
    assert load_rules(path) == config.rules
    assert load_config(alerts_file(tmp_path, "")).alertmanager == AlertmanagerSettings()


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('alertmanager = "http://am:9093"', "[alertmanager] must be a table"),
        ("[alertmanager]\nurl = []", "[alertmanager]: unknown key 'url' (keys: resend, timeout, "),
        ('[alertmanager]\nurls = "http://am:9093"', "[alertmanager] urls must be a list of URLs"),
        ('[alertmanager]\nurls = ["ftp://am"]', "[alertmanager] urls: 'ftp://am' is not an http"),
        ('[alertmanager]\nurls = ["http://:9093"]', "is not an http:// or https:// URL"),
        ('[alertmanager]\nurls = ["http://am:port"]', "'http://am:port' is not a URL: "),
        ('[alertmanager]\nurls = ["http://u:pw@am"]', "a URL with credentials would show them"),
        ('[alertmanager]\nurls = ["http://am/?x=1"]', "give the Alertmanager's base URL only"),
        ('[alertmanager]\nurls = ["http://am\\u001b[2J"]', "holds no space or control char"),
        ('[alertmanager]\nurls = ["http://am:9093 "]', "holds no space or control char"),
        ('[alertmanager]\nurls = ["http://a", "http://a/"]', "'http://a' is given twice"),
        ("[alertmanager]\nresend = 60", 'resend must be a duration like "1m", not 60'),
        ('[alertmanager]\nresend = "1 minute"', "resend: '1 minute' is not a duration"),
        ('[alertmanager]\nresend = "0s"', "resend: '0s' is not between 1s and 3600s"),
        ('[alertmanager]\nresend = "999ms"', "resend: '999ms' is not between 1s and 3600s"),
        ('[alertmanager]\nresend = "2h"', "resend: '2h' is not between 1s and 3600s"),
        ('[alertmanager]\ntimeout = "10m"', "timeout: '10m' is not between 0.1s and 300s"),
        ("[alertmanagers]", "unknown key 'alertmanagers' (keys: disable, enable, [[rule]], [alert"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_file_and_key(
    tmp_path: Path, table: str, says: str
) -> None:
    path = alerts_file(tmp_path, table + "\n")
    with pytest.raises(RuleError) as refused:
        load_config(path)
    message = str(refused.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith(f"{path}: ")
    assert says in message


@pytest.mark.parametrize("name", ["Hostname", "UUID"])
def test_a_rule_may_not_label_itself_as_a_host_or_a_gpu(tmp_path: Path, name: str) -> None:
    """Every host's alert would be one alert in Alertmanager (and in Prometheus)."""
    path = alerts_file(
        tmp_path, f'[[rule]]\nname = "r"\nfindings = ["xid"]\nlabels = {{ {name} = "x" }}\n'
    )
    with pytest.raises(RuleError, match=f"label '{name}' is not a usable label name"):
        load_config(path)


def test_seventeen_urls_are_too_many(tmp_path: Path) -> None:
    urls = ", ".join(f'"http://am{i}:9093"' for i in range(17))
    with pytest.raises(RuleError, match="17 URLs, more than the 16 allowed"):
        load_config(alerts_file(tmp_path, f"[alertmanager]\nurls = [{urls}]\n"))


URLISH = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["http://am:9093", "http://am:9093/", "https://x/y", "http://[::1]:9093"]),
)
TABLE_VALUES = st.one_of(
    st.from_type(object),
    st.lists(URLISH, max_size=20),
    st.sampled_from(["1m", "0s", "2h", "10s", "500ms", "99999999999999999999y"]),
)


@fuzz
@given(st.dictionaries(st.sampled_from(["urls", "resend", "timeout", "x"]), TABLE_VALUES))
def test_any_table_is_taken_or_refused_in_one_line(table: dict[str, object]) -> None:
    from gpuconsole.fleet.alerts.config import alertmanager_settings

    try:
        taken = alertmanager_settings({"alertmanager": table}, "fuzz.toml")
    except RuleError as error:
        assert str(error).startswith("fuzz.toml: [alertmanager]")
        assert "\n" not in str(error)
        return
    assert all(url == alertmanager_url(url) for url in taken.urls)
    assert 1 <= taken.resend <= 3600 and 0.1 <= taken.timeout <= 300


@pytest.mark.parametrize("command", [(), ("record",), ("exporter",)])
def test_a_bad_alertmanager_option_exits_2_with_one_line(command: tuple[str, ...]) -> None:
    result = gpuconsole(*command, "--alertmanager", "am:9093", "--demo")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith(
        "argument --alertmanager: 'am:9093' is not an http:// or https:// URL of an Alertmanager"
    )


def test_the_exporter_refuses_alert_rules_it_would_not_send(tmp_path: Path) -> None:
    result = gpuconsole("--alerts", str(alerts_file(tmp_path, "")), "exporter", "--demo")
    assert result.returncode == 2
    assert result.stderr.startswith("gpuconsole: --alerts: the exporter evaluates alert rules only")


# --- delivery never holds a round up --------------------------------------------------------------


def firing(count: int) -> list[Alert]:
    return [alert(host=f"gpu{i:05d}") for i in range(count)]


@pytest.fixture
def closed_port() -> str:
    """A loopback port nothing listens on: every connection is refused at once."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that takes connections and never answers: every request times out."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


class ClosingServer:
    """A server that takes each connection and closes it unanswered, noting when."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.accepted: list[float] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            connection.close()


def wait_until(what: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_alertmanager_that_is_down_holds_no_round_up_and_says_so(closed_port: str) -> None:
    told: list[str] = []
    sender = AlertmanagerSender(AlertmanagerSettings((closed_port,)), log=told.append)
    try:
        started = time.monotonic()
        for _ in range(20):
            sender.update(firing(50))
        assert (time.monotonic() - started) / 20 < 0.05
        wait_until(sender.problems)
        (line,) = sender.problems()
        assert line.startswith(f"alerts are not being delivered to {closed_port}: ")
        assert "connection refused (since " in line and line.endswith(" UTC)")
        assert told == [line.split(" (since")[0]]  # said once, not at every retry
    finally:
        sender.close()


def test_an_alertmanager_that_never_answers_times_out_and_holds_no_round_up(
    silent_server: str,
) -> None:
    settings_ = AlertmanagerSettings((silent_server,), timeout=0.3)
    sender = AlertmanagerSender(settings_)
    try:
        sender.update(firing(1))
        time.sleep(0.05)  # the sender is now stuck in its request
        started = time.monotonic()
        sender.update(firing(2))
        assert time.monotonic() - started < 0.05
        wait_until(sender.problems)
        assert "no answer within 0.3 s" in sender.problems()[0]
    finally:
        sender.close()


def test_retries_back_off_doubling_up_to_resend_whatever_the_rounds_do() -> None:
    server = ClosingServer()
    settings_ = AlertmanagerSettings((server.url,), resend=0.8)
    sender = AlertmanagerSender(settings_, retry_first=0.1)
    try:
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:  # a round every 10 ms: none cuts a wait short
            sender.update(firing(1))
            time.sleep(0.01)
    finally:
        sender.close()
    gaps = [b - a for a, b in zip(server.accepted, server.accepted[1:], strict=False)]
    assert len(gaps) >= 4, gaps
    # 0.1, 0.2, 0.4, then the cap, 0.8 (each a little more: the attempt itself takes time)
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39, gaps
    assert all(gap < 0.8 + 0.5 for gap in gaps), gaps
    assert gaps[3] >= 0.79, gaps
    assert sender.problems()[0].startswith(f"alerts are not being delivered to {server.url}: ")


def test_more_alerts_than_the_bound_are_not_sent_and_that_is_said(closed_port: str) -> None:
    sender = AlertmanagerSender(AlertmanagerSettings((closed_port,)))
    try:
        many = firing(MAX_ALERTS + 7)
        started = time.monotonic()
        sender.update(many)
        took = time.monotonic() - started
        assert took < 2.0, took
        wait_until(lambda: len(sender.problems()) == 2)
        assert sender.problems()[1] == (
            f"7 firing alerts are not sent to Alertmanager: more than {MAX_ALERTS} fire at once"
        )
        sender.update(firing(3))
        assert len(sender.problems()) == 1  # the bound is about the latest round
    finally:
        sender.close()


def test_pending_alerts_are_not_sent(closed_port: str) -> None:
    sender = AlertmanagerSender(AlertmanagerSettings((closed_port,)))
    try:
        sender.update([alert(state=PENDING)])
        time.sleep(0.3)
        assert sender.problems() == []  # nothing was due, so nothing failed
    finally:
        sender.close()


def test_closing_returns_promptly_while_a_request_hangs(silent_server: str) -> None:
    sender = AlertmanagerSender(AlertmanagerSettings((silent_server,), timeout=30.0))
    sender.update(firing(1))
    time.sleep(0.1)
    started = time.monotonic()
    sender.close(timeout=0.5)
    assert time.monotonic() - started < 1.0


def test_the_silence_of_an_unreachable_alertmanager_is_one_line(closed_port: str) -> None:
    from gpuconsole.fleet.alerts.alertmanager import DeliveryError

    sender = AlertmanagerSender(AlertmanagerSettings((closed_port,)))
    try:
        with pytest.raises(DeliveryError) as refused:
            sender.silence(alert(), 900.0, comment="x")
        assert str(refused.value) == f"{closed_port}: connection refused"
    finally:
        sender.close()


def test_validity_is_four_times_the_longer_of_interval_and_resend() -> None:
    sender = AlertmanagerSender(AlertmanagerSettings((), resend=60.0), interval=120.0)
    assert sender.validity == 480.0
    assert AlertmanagerSender(AlertmanagerSettings(())).validity == 240.0
    assert math.isclose(
        AlertmanagerSender(AlertmanagerSettings((), resend=1.0), interval=0.5).validity, 4.0
    )
