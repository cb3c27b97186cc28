"""Alerts to Alertmanager: each round's firing alerts posted to its v2 API, sent again while they
fire, resolved when they end; and silences made from the console.

The console does not page: Alertmanager, the ecosystem's router, does. What goes to it, and when,
is what Prometheus sends for an alerting rule, so an Alertmanager set up for Prometheus takes
the console's alerts as it takes Prometheus's:

- Only firing alerts go, never pending ones (Prometheus's ``Alert.needsSending``,
  rules/alerting.go).
- An alert goes as soon as it fires, then again every ``resend`` seconds while it fires
  (Prometheus's ``--rules.alert.resend-delay``, 1m by default), each time with ``endsAt`` four
  times max(round interval, resend) after the last round that saw it firing (``ValidUntil`` in
  ``AlertingRule.sendAlerts``): it outlives two lost sends, and times out in Alertmanager when
  no round sees it any more (the console was closed, or hung).
- An alert that stops firing goes once more with ``endsAt`` = when a round found it ended, which
  Alertmanager takes as resolved (``sendAlerts`` in cmd/prometheus/main.go: ``EndsAt =
  ResolvedAt``). That is also how an alert ends when its host goes stale, or when its label set
  changes (a findings rule's severity follows its worst finding): Alertmanager knows an alert by
  its labels, so the old set resolves and the new one fires, as with Prometheus. A resolution
  that cannot be delivered is tried again for `RESOLVED_RETENTION_SECONDS`, Prometheus's
  ``resolvedRetention``.
- Closing the sender sends nothing: an alert the console no longer watches is not resolved, it
  times out at its ``endsAt`` (Prometheus does the same on shutdown), and a recorder that still
  watches keeps it firing without a resolved-then-firing flap.
- Alertmanager keeps alerts in memory only (``--storage.path`` holds its silences and
  notification log): after a restart it knows an alert again at the next re-send.

Identity. Alertmanager identifies an alert by its label set alone and merges what arrives under
one set into one alert (``Alerts.Put`` in provider/mem/mem.go merges overlapping ones;
``types.Alert.Merge`` keeps the earliest ``startsAt``). The labels here say which problem it is
and nothing about who sent it: ``alertname`` (the rule's Prometheus name, as
``gpuconsole rules export`` names it), ``rule``, ``severity``, ``Hostname``, ``gpu``, the GPU's
``UUID`` where known, and the rule's own labels. A console and a recorder watching the same fleet
therefore make one alert, and one notification, of each problem.

The rest: ``startsAt`` is the alert's ``since`` (when its condition began to hold, as the alerts
screen says) by the readings' clock; ``endsAt`` is by this machine's clock, which is what
Alertmanager compares it with. Annotations are ``summary`` (the alert's message),
``description`` (what to do: the remediation of the finding a findings rule matched) and
``runbook_url`` (a rule's label of that name, the annotation Alertmanager templates
conventionally read). No ``generatorURL``: the console has no page to link to, and the API does
not require one (``alert`` in api/v2/openapi.yaml requires only ``labels``). Every label and
annotation is text made visible and bounded (`clean`), so a hostile host name cannot reach a
pager as an escape sequence, or make Alertmanager refuse a batch.

Delivery never holds up a polling round: `AlertmanagerSender.update` only makes the round's
firing alerts into what is posted (a few microseconds each) and swaps them in under a lock. A
thread for each Alertmanager posts what is due, at most `MAX_BATCH` alerts a request
(Prometheus's ``DefaultMaxBatchSize``), with a timeout; after a failure it waits 1 s, 2 s,
4 s … up to ``resend`` before trying again, whatever rounds come. What waits is bounded:
the latest round's firing alerts, at most `MAX_ALERTS` (Prometheus's default notification queue
capacity), and resolutions not yet delivered, at most as many.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from gpuconsole import __version__
from gpuconsole.core.clock import Clock, wall_clock
from gpuconsole.core.untrusted import visible
from gpuconsole.fleet.alerts.engine import FIRING, Alert
from gpuconsole.fleet.alerts.rules import alert_name
from gpuconsole.telemetry.dcgm import HOST_LABEL

if TYPE_CHECKING:
    from gpuconsole.telemetry.http_answer import Answer

RESEND_SECONDS = 60.0
"""Prometheus's default ``--rules.alert.resend-delay``."""
TIMEOUT_SECONDS = 10.0
"""Prometheus's default ``timeout`` of an ``alertmanager_config``."""
RESEND_RANGE = (1.0, 3600.0)
"""The shortest and longest ``resend``: more than once a second floods Alertmanager for nothing;
after an hour a firing alert lives 4 h in Alertmanager past the last round that saw it, as long
as Alertmanager's default ``repeat_interval``."""
TIMEOUT_RANGE = (0.1, 300.0)
MAX_URLS = 16
"""Alertmanagers sent to at most (a thread each); a cluster has a few."""
VALIDITY_FACTOR = 4
"""A firing alert's ``endsAt`` is this many times max(interval, resend) ahead (Prometheus's)."""
RESOLVED_RETENTION_SECONDS = 15 * 60.0
"""How long a resolution that cannot be delivered is tried again (Prometheus's)."""
MAX_ALERTS = 10_000
"""Firing alerts sent at most; resolutions awaiting delivery, likewise, the oldest dropped."""
MAX_BATCH = 256
"""Alerts a request carries at most."""
RETRY_FIRST_SECONDS = 1.0
"""The wait after a first failure; it doubles with each further one, up to ``resend``."""
MAX_LABEL_CHARS = 256
"""A label value is cut to this: longer than any host name (253), short enough for a pager."""
MAX_ANNOTATION_CHARS = 4096
MAX_RULE_LABELS = 32
"""A rule's own labels sent at most (a real rule has a few), each name at most
`MAX_LABEL_CHARS` long."""
MAX_ANSWER_BYTES = 1 << 16
"""The largest answer read from Alertmanager (a silence's id, or an error's text); a larger one is
refused, as is one not whole within the timeout."""
ALERTS_PATH = "/api/v2/alerts"
SILENCES_PATH = "/api/v2/silences"
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""What Alertmanager 0.25 takes as a label name (``model.LabelName.IsValid``)."""
_UNSAFE_URL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")

LabelSet = tuple[tuple[str, str], ...]
UuidOf = Callable[[str, int], "str | None"]
"""The UUID of a host's GPU (by index), where it is known."""


class DeliveryError(Exception):
    """Alertmanager could not be reached, or refused what was sent: one line saying why."""


@dataclass(frozen=True, slots=True)
class AlertmanagerSettings:
    """Where alerts go, how often a firing one is sent again, how long a request may take."""

    urls: tuple[str, ...] = ()
    resend: float = RESEND_SECONDS
    timeout: float = TIMEOUT_SECONDS


def alertmanager_url(text: str) -> str:
    """An Alertmanager's base URL as given (``http://am:9093``, or with the path prefix it is
    served under), without a trailing slash; ValueError saying why it is not one."""
    shown = visible(repr(text), 80)
    if _UNSAFE_URL.search(text):
        raise ValueError(f"{shown}: a URL holds no space or control character")
    try:
        parsed = urllib.parse.urlsplit(text)
        parsed.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as error:
        raise ValueError(f"{shown} is not a URL: {error}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{shown} is not an http:// or https:// URL of an Alertmanager")
    if parsed.username is not None or parsed.password is not None:
        raise ValueError(
            f"{shown}: a URL with credentials would show them in every status line; "
            "reach the Alertmanager without them (a local proxy, or a network that allows it)"
        )
    if parsed.query or parsed.fragment:
        raise ValueError(f"{shown}: give the Alertmanager's base URL only, like http://am:9093")
    return text.rstrip("/")


def clean(text: str, limit: int) -> str:
    """Text as Alertmanager gets it: UTF-8 it can hold (a lone surrogate, which JSON can carry,
    written as ``\\ud800``), control characters made visible, at most ``limit`` characters."""
    utf8 = text[: limit + 1].encode("utf-8", "backslashreplace").decode("utf-8")
    return visible(utf8, limit)


def identity(alert: Alert) -> LabelSet:
    """The labels that say which alert this is, as silences match them: its rule's alert name,
    its host and, for a GPU's alert, the GPU's index."""
    labels = [
        ("alertname", clean(alert_name(alert.rule), MAX_LABEL_CHARS)),
        (HOST_LABEL, clean(alert.host, MAX_LABEL_CHARS)),
    ]
    if alert.gpu is not None:
        labels.append(("gpu", str(alert.gpu)))
    return tuple(labels)


@dataclass(frozen=True, slots=True)
class Posted:
    """An alert as Alertmanager gets it, less its ``endsAt`` (set at each send)."""

    labels: LabelSet
    """Sorted by name: the alert's identity, here as in Alertmanager."""
    annotations: LabelSet
    starts_at: float

    def body(self, ends_at: float, now: float) -> dict[str, object]:
        """The alert for ``POST /api/v2/alerts``, sent ``now`` and ending at ``ends_at``. A start
        past ``now`` (a host's clock ahead of this one's) is sent as ``now``, and never after
        the end, which Alertmanager refuses ("start time must be before end time")."""
        starts_at = min(self.starts_at if 0 <= self.starts_at <= now else now, ends_at)
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(starts_at),
            "endsAt": rfc3339(ends_at),
        }


def posted(alert: Alert, uuid: str | None = None) -> Posted:
    """``alert`` as Alertmanager gets it (see the module's docstring); ``uuid``: its GPU's."""
    labels = {
        name: clean(value, MAX_LABEL_CHARS)
        for name, value in alert.labels[:MAX_RULE_LABELS]
        if len(name) <= MAX_LABEL_CHARS
        and _LABEL_NAME.fullmatch(name)
        and not name.startswith("__")
    }
    labels.update(identity(alert))
    labels["rule"] = clean(alert.rule, MAX_LABEL_CHARS)
    labels["severity"] = alert.severity.label
    if uuid:
        labels["UUID"] = clean(uuid, MAX_LABEL_CHARS)
    annotations = {"summary": alert.message, "description": alert.remedy}
    annotations["runbook_url"] = dict(alert.labels).get("runbook_url", "")
    return Posted(
        tuple(sorted((k, v) for k, v in labels.items() if v)),
        tuple((k, clean(v, MAX_ANNOTATION_CHARS)) for k, v in annotations.items() if v),
        alert.since,
    )


def rfc3339(seconds: float) -> str:
    """Epoch seconds as the API's date-time, in UTC to the millisecond."""
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Silenced:
    """A silence Alertmanager took."""

    url: str
    silence_id: str
    until: float


@dataclass(slots=True)
class _Resolution:
    posted: Posted
    ends_at: float


@dataclass(slots=True)
class _Send:
    posted: Posted
    ends_at: float
    resolution: _Resolution | None = None


@dataclass(slots=True)
class _Target:
    """One Alertmanager: what it holds of the alerts, and how delivery to it goes."""

    url: str
    sent: dict[LabelSet, tuple[float, float]] = field(default_factory=dict)
    """Firing alerts delivered: labels -> (the ``startsAt`` delivered, when)."""
    resolved: dict[LabelSet, _Resolution] = field(default_factory=dict)
    """Resolutions not yet delivered, oldest first."""
    wake: threading.Event = field(default_factory=threading.Event)
    failures: int = 0
    failing_since: float | None = None
    problem: str = ""


class AlertmanagerSender:
    """Delivers a fleet session's firing alerts to each Alertmanager of ``settings`` (a thread
    each), and makes silences there. ``interval`` is the seconds between polling rounds;
    ``log`` is told, from a sender's thread, when delivery to one fails and when it works again.
    """

    def __init__(
        self,
        settings: AlertmanagerSettings,
        *,
        interval: float = 1.0,
        clock: Clock = wall_clock,
        log: Callable[[str], None] | None = None,
        retry_first: float = RETRY_FIRST_SECONDS,
    ) -> None:
        self.settings = settings
        self.validity = VALIDITY_FACTOR * max(interval, settings.resend)
        self._clock = clock
        self._log = log
        self._retry_first = retry_first
        self._lock = threading.Lock()
        self._firing: dict[LabelSet, Posted] = {}
        self._made: dict[tuple[Alert, str | None], Posted] = {}
        """Last round's alerts as posted: an alert unchanged since is not made again."""
        self._updated_at: float | None = None
        self._dropped = 0
        self._closed = threading.Event()
        self._targets = [_Target(url) for url in settings.urls]
        self._threads = [
            threading.Thread(target=self._run, args=(t,), name=f"alertmanager {t.url}", daemon=True)
            for t in self._targets
        ]
        for thread in self._threads:
            thread.start()

    @property
    def urls(self) -> tuple[str, ...]:
        return self.settings.urls

    # --- a polling round's side ------------------------------------------------------------------

    def update(self, alerts: Iterable[Alert], uuid_of: UuidOf | None = None) -> None:
        """A round's active alerts (pending ones are passed over): those firing are sent, those
        no longer firing resolved. Returns at once; the sending is the threads'. One thread
        calls it at a time (a fleet session's)."""
        now = self._clock()
        firing: dict[LabelSet, Posted] = {}
        made: dict[tuple[Alert, str | None], Posted] = {}
        dropped = 0
        for alert in alerts:
            if alert.state != FIRING:
                continue
            if len(firing) == MAX_ALERTS:
                dropped += 1
                continue
            uuid = None if alert.gpu is None or uuid_of is None else uuid_of(alert.host, alert.gpu)
            sent = self._made.get((alert, uuid)) or posted(alert, uuid)
            made[(alert, uuid)] = sent
            firing[sent.labels] = sent
        self._made = made
        with self._lock:
            ended = [p for labels, p in self._firing.items() if labels not in firing]
            self._firing = firing
            self._updated_at = now
            self._dropped = dropped
            for target in self._targets:
                self._note_ended(target, ended, firing, now)
        for target in self._targets:
            target.wake.set()

    @staticmethod
    def _note_ended(
        target: _Target, ended: Sequence[Posted], firing: dict[LabelSet, Posted], now: float
    ) -> None:
        """Resolutions for ``target``: the ``ended`` alerts it was sent join those it awaits;
        one that fires again, or is older than the retention, or past the bound, is dropped."""
        for alert in ended:
            if target.sent.pop(alert.labels, None) is not None:
                target.resolved.pop(alert.labels, None)  # its newest resolution goes last
                target.resolved[alert.labels] = _Resolution(alert, now)
        for labels in [
            labels
            for labels, r in target.resolved.items()
            if labels in firing or r.ends_at < now - RESOLVED_RETENTION_SECONDS
        ]:
            del target.resolved[labels]
        while len(target.resolved) > MAX_ALERTS:
            del target.resolved[next(iter(target.resolved))]

    # --- what the UI shows ---------------------------------------------------------------------

    def problems(self) -> list[str]:
        """One line for each Alertmanager that alerts are not reaching, and one when more
        alerts fire than are sent; none while all is well."""
        with self._lock:
            lines = [
                f"alerts are not being delivered to {t.url}: {t.problem} "
                f"(since {_utc(t.failing_since)})"
                for t in self._targets
                if t.failing_since is not None
            ]
            if self._dropped:
                lines.append(
                    f"{self._dropped} firing alerts are not sent to Alertmanager: more than "
                    f"{MAX_ALERTS} fire at once"
                )
        return lines

    # --- silences --------------------------------------------------------------------------------

    def silence(self, alert: Alert, seconds: float, comment: str) -> Silenced:
        """Silence ``alert`` (its alert name, host and GPU) for ``seconds`` from now.

        Several Alertmanagers are taken to be one cluster, which shares its silences: the first
        that takes the silence has it. Blocks for up to the timeout for each; DeliveryError,
        one line, when none takes it.
        """
        now = self._clock()
        body = {
            "matchers": [
                {"name": name, "value": value, "isRegex": False, "isEqual": True}
                for name, value in identity(alert)
            ],
            "startsAt": rfc3339(now),
            "endsAt": rfc3339(now + seconds),
            "createdBy": _created_by(),
            "comment": clean(comment, MAX_ANNOTATION_CHARS),
        }
        failures = []
        for url in self.urls:
            try:
                answer = json.loads(_post(url + SILENCES_PATH, body, self.settings.timeout))
                return Silenced(url, clean(str(answer["silenceID"]), 64), now + seconds)
            except DeliveryError as error:
                failures.append(f"{url}: {error}")
            except (ValueError, TypeError, KeyError, RecursionError):
                failures.append(f"{url}: not an Alertmanager's answer (no silenceID)")
        raise DeliveryError("; ".join(failures) or "no Alertmanager is configured")

    # --- the sending threads -------------------------------------------------------------------

    def close(self, timeout: float = 1.0) -> None:
        """Stop sending (nothing more is sent: see the module's docstring)."""
        self._closed.set()
        for target in self._targets:
            target.wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, target: _Target) -> None:
        while not self._closed.is_set():
            target.wake.clear()
            pause = self._attempt(target)
            if target.failing_since is not None:
                self._closed.wait(pause)  # backing off: a new round does not cut the wait short
            else:
                target.wake.wait(pause)

    def _attempt(self, target: _Target) -> float | None:
        """Post what is due to ``target``; the seconds until it should try again (None: not
        until a round brings news)."""
        now = self._clock()
        with self._lock:
            batch = self._due(target, now)
            if not batch:
                return self._next_due(target, now)
        try:
            alerts = [send.posted.body(send.ends_at, now) for send in batch]
            _post(target.url + ALERTS_PATH, alerts, self.settings.timeout)
        except DeliveryError as error:
            return self._failed(target, now, str(error))
        with self._lock:
            for send in batch:
                labels = send.posted.labels
                if send.resolution is None:
                    if labels in self._firing:
                        target.sent[labels] = (send.posted.starts_at, now)
                elif target.resolved.get(labels) is send.resolution:
                    del target.resolved[labels]
            recovered = target.failing_since is not None
            target.failures, target.failing_since, target.problem = 0, None, ""
        if recovered and self._log is not None:
            self._log(f"alerts are delivered to {target.url} again")
        return 0.0

    def _due(self, target: _Target, now: float) -> list[_Send]:
        """What ``target`` should be sent now, at most `MAX_BATCH`: resolutions first, then
        alerts it has not been sent since they began firing, or not for ``resend`` seconds."""
        batch = [_Send(r.posted, r.ends_at, r) for r in target.resolved.values()][:MAX_BATCH]
        ends_at = self._ends_at(now)
        if ends_at is None:
            return batch
        for labels, alert in self._firing.items():
            if len(batch) == MAX_BATCH:
                break
            sent = target.sent.get(labels)
            if sent is None or sent[0] != alert.starts_at or now - sent[1] >= self.settings.resend:
                batch.append(_Send(alert, ends_at))
        return batch

    def _ends_at(self, now: float) -> float | None:
        """The ``endsAt`` of firing alerts sent now; None when the last round is so old that
        they have timed out (no round runs: nothing is sent to keep them alive)."""
        if self._updated_at is None or self._updated_at + self.validity <= now:
            return None
        return self._updated_at + self.validity

    def _next_due(self, target: _Target, now: float) -> float | None:
        if self._ends_at(now) is None or not self._firing:
            return None
        last = min(target.sent.get(labels, (0.0, 0.0))[1] for labels in self._firing)
        return max(0.0, last + self.settings.resend - now)

    def _failed(self, target: _Target, now: float, reason: str) -> float:
        """Note a failed delivery; the seconds to wait before the next try."""
        with self._lock:
            first = target.failing_since is None
            target.failures += 1
            target.problem = reason
            if first:
                target.failing_since = now
            line = f"alerts are not being delivered to {target.url}: {reason}"
        if first and self._log is not None:
            self._log(line)
        doubled = self._retry_first * 2 ** min(target.failures - 1, 30)
        return min(self.settings.resend, doubled)


def _post(url: str, body: object, timeout: float) -> bytes:
    """POST ``body`` as JSON; Alertmanager's answer, whole within ``timeout`` and at most
    `MAX_ANSWER_BYTES`, or DeliveryError saying in one line why there is none."""
    # Loaded with the first alert sent: the HTTP client (urllib.request, http.client, email)
    # is 1.8 MiB of RSS and 5 ms of a start that sends none.
    import urllib.request

    from gpuconsole.telemetry.http_answer import AnswerError, read_answer

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode("ascii"),
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"gpuconsole/{__version__}"},
    )
    try:
        answer = read_answer(request, timeout=timeout, limit=MAX_ANSWER_BYTES)
    except AnswerError as error:
        raise DeliveryError(str(error)) from None
    if not answer.ok:
        raise DeliveryError(_refusal(answer))
    return answer.body


def _refusal(answer: Answer) -> str:
    """An HTTP error with Alertmanager's own text (a JSON string, for a 400 the reason)."""
    raw = answer.body.decode("utf-8", "replace").strip()
    try:
        detail = json.loads(raw) if raw else ""
    except (ValueError, RecursionError):
        detail = raw
    text = detail if isinstance(detail, str) else raw
    return f"HTTP {answer.status}" + (f": {visible(text, 200)}" if text else f" {answer.reason}")


def _utc(seconds: float | None) -> str:
    return "?" if seconds is None else time.strftime("%H:%M:%S UTC", time.gmtime(seconds))


def _created_by() -> str:
    """Who makes a silence: this user on this machine, through the console."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name, no passwd entry
        user = "someone"
    return clean(f"{user}@{socket.gethostname()} (gpuconsole)", MAX_LABEL_CHARS)
