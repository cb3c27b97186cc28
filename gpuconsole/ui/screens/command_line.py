"""The `:` command line, as k9s has it: type where to go (`host gpu07`, `gpu h100-01 3`,
`job 4242`, `alerts`, `triage`, `fleet`), with the rest of a word completed from the screens, the
hosts and the jobs the console sees (Tab or → takes the completion).

The line is parsed here (`parse_command`) into a `Destination`; the screen that asked goes
there. Nothing typed here is run: it names a screen, a host, a GPU or a job, and a name the
console does not know is said back, in the line, not acted on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Static

from gpuconsole.core.untrusted import visible
from gpuconsole.fleet.store import FleetStore

WORDS = ("fleet", "alerts", "triage", "host", "gpu", "job")
USAGE = "fleet · alerts · triage · host NAME · gpu HOST N · job ID"


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a command line goes: a ``screen`` (fleet, alerts, triage, host, gpu, job) and what
    it names (the host, the GPU's index, the job's id)."""

    screen: str
    host: str | None = None
    gpu: int | None = None
    job: str | None = None


class CommandError(ValueError):
    """A line that names nothing the console has: one line saying what, for the line itself."""


def parse_command(line: str, store: FleetStore) -> Destination:
    """The destination of ``line``; CommandError for a word, host, GPU or job not known."""
    words = line.split()
    if not words:
        raise CommandError(USAGE)
    verb, rest = words[0].lower(), words[1:]
    if verb in ("fleet", "alerts", "triage") and not rest:
        return Destination(verb)
    if verb == "host" and len(rest) == 1:
        return Destination("host", host=_host(rest[0], store))
    if verb == "gpu" and len(rest) == 2:
        host = _host(rest[0], store)
        snapshot = store.latest(host)
        indexes = [] if snapshot is None else [g.index for g in snapshot.gpus]
        if not rest[1].isdigit() or int(rest[1]) not in indexes:
            raise CommandError(f"{host} has no GPU {visible(rest[1])} (GPUs: {_listed(indexes)})")
        return Destination("gpu", host=host, gpu=int(rest[1]))
    if verb == "job" and len(rest) == 1:
        if rest[0] not in jobs_of(store):
            raise CommandError(f"no job {visible(rest[0])} runs on a GPU the console sees")
        return Destination("job", job=rest[0])
    raise CommandError(f"{visible(line.strip())}: not a command ({USAGE})")


def _host(name: str, store: FleetStore) -> str:
    if name not in store.hosts:
        raise CommandError(f"no host {visible(name)} (hosts: {_listed(store.hosts)})")
    return name


def _listed(items: Iterable[object]) -> str:
    """The first six, and how many more."""
    names = [str(item) for item in items]
    shown = ", ".join(names[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def jobs_of(store: FleetStore) -> list[str]:
    """The ids of the Slurm jobs whose processes the console sees, in order of first sight."""
    found: dict[str, None] = {}
    for host in store.hosts:
        snapshot = store.latest(host)
        for process in () if snapshot is None else snapshot.processes:
            if process.job is not None:
                found[str(process.job.job_id)] = None
    return list(found)


def completions(store: FleetStore) -> list[str]:
    """Every line the command line completes to: the screens, each host, each host's GPUs, each
    job."""
    lines = ["fleet", "alerts", "triage"]
    for host in store.hosts:
        lines.append(f"host {host}")
        snapshot = store.latest(host)
        gpus = () if snapshot is None else snapshot.gpus
        lines += [f"gpu {host} {g.index}" for g in gpus]
    lines += [f"job {job}" for job in jobs_of(store)]
    return lines


class CommandLineScreen(ModalScreen[Destination | None]):
    """The line at the bottom of the screen; Enter goes, Esc leaves."""

    BINDINGS = [
        Binding("escape", "dismiss_none", "Cancel", id="command.cancel"),
        Binding("tab", "complete", "Complete", id="command.complete", show=False),
    ]
    CSS = """
    CommandLineScreen { align: left bottom; }
    CommandLineScreen #command-body {
        width: 100%;
        height: auto;
        background: $surface;
        border-top: solid $primary;
    }
    CommandLineScreen #command-said { height: auto; padding: 0 1; }
    CommandLineScreen #command-line { border: none; height: 1; padding: 0 1; }
    """

    def __init__(self, store: FleetStore) -> None:
        super().__init__()
        self._store = store

    def compose(self) -> ComposeResult:
        with Vertical(id="command-body"):
            yield Static(Text(USAGE, style="dim"), id="command-said")
            suggester = SuggestFromList(completions(self._store), case_sensitive=False)
            yield Input(placeholder=":", suggester=suggester, id="command-line")

    def on_mount(self) -> None:
        self.query_one("#command-line", Input).focus()

    def action_complete(self) -> None:
        """Tab takes the completion shown, as → at the end of the line does."""
        box = self.query_one("#command-line", Input)
        box.cursor_position = len(box.value)
        box.action_cursor_right()

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#command-line")
    def _go(self, event: Input.Submitted) -> None:
        try:
            destination = parse_command(event.value, self._store)
        except CommandError as error:
            said = self.query_one("#command-said", Static)
            said.update(Text(str(error), style="bold"))
            return
        self.dismiss(destination)
