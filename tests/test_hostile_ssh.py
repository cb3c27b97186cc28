"""Untrusted configuration stays data: bad ssh config, known_hosts, inventory numbers and key
files each give a host a clear state and a one-line reason naming the file; remote commands
that time out are killed on the host; the agent is never forwarded.

Against a real OpenSSH sshd on 127.0.0.1, with OpenSSH's `ssh` as the judge of each decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pilot_wait import until
from sshd import Sshd, gone, run_gpuconsole, running, sshd_available, wait_for

from gpuconsole.actions.shell import SshShell
from gpuconsole.core.model import HostState
from gpuconsole.hosts import ssh
from gpuconsole.hosts.inventory import HostDefaults, HostEntry, InventoryError, load_inventory
from gpuconsole.hosts.source import FleetSource, SshSource
from gpuconsole.hosts.ssh import ConnectFailure, SshSettings, connect
from gpuconsole.hosts.supervisor import Backoff, Supervisor
from gpuconsole.ui.app import GpuConsoleApp

pytestmark = pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd is not installed")

SSH = shutil.which("ssh") or "/usr/bin/ssh"
LINK_S = 20.0


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads the real ~/.ssh, nor the agent of whoever runs the tests."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPUCONSOLE_SSH_CONFIG", str(home / ".ssh" / "config"))
    (home / ".ssh" / "config").write_text("")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture
def home(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test sshd's home as HOME: its ~/.ssh/config names the server `gpu-test`."""
    config = sshd.ssh_config(["gpu-test"])
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.setenv("GPUCONSOLE_SSH_CONFIG", str(config))
    return sshd.home


def alias(name: str = "gpu-test", **changes: object) -> HostEntry:
    """A host known by its ssh config alias only, as most inventories name hosts."""
    defaults = HostDefaults(connect_timeout=10.0)
    return HostEntry(**{**_fields(defaults.entry(name, name)), **changes})  # type: ignore[arg-type]


def direct(server: Sshd, **changes: object) -> HostEntry:
    defaults = HostDefaults(user=_user(), port=server.port, connect_timeout=10.0)
    return HostEntry(**{**_fields(defaults.entry("gpu-test", "127.0.0.1")), **changes})  # type: ignore[arg-type]


def judge(*args: str) -> subprocess.CompletedProcess[str]:
    """OpenSSH's `ssh`, never prompting."""
    return subprocess.run(
        [SSH, "-o", "BatchMode=yes", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
        check=False,
    )


def watch(entry: HostEntry, host_settings: SshSettings) -> SshSource:
    supervisor = Supervisor(
        [entry], host_settings, interval=0.2, agent_mode="sim", backoff=Backoff(0.2, 1.0)
    )
    return SshSource(supervisor)


def one_line(text: str | None) -> str:
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


# --- 1. ssh config and known_hosts the console cannot read ----------------------------------

# name: what ~/.ssh/config becomes from its good text (ssh -G refuses each: the console says
# what ssh says)
BAD_CONFIGS: dict[str, Callable[[str, Path], bytes]] = {
    "random bytes": lambda good, path: bytes(range(256)) * 4,
    "an Include loop": lambda good, path: f"Include {path}\n{good}".encode(),
    "Port abc": lambda good, path: re.sub(r"Port \d+", "Port abc", good).encode(),
    "Port 0": lambda good, path: re.sub(r"Port \d+", "Port 0", good).encode(),
    "Port 99999": lambda good, path: re.sub(r"Port \d+", "Port 99999", good).encode(),
    "an unclosed quote": lambda good, path: good.replace(
        "HostName 127.0.0.1", 'HostName "127.0.0.1'
    ).encode(),
}


def ssh_says(config: Path, host: str = "gpu-test") -> str:
    """The first line of what `ssh -G` prints when it refuses the config."""
    refused = judge("-G", "-F", str(config), host)
    assert refused.returncode != 0, refused.stdout[-300:]
    return next(
        line.strip()
        for line in refused.stderr.splitlines()
        if line.strip() and not line.startswith("Pseudo-terminal")
    )


def bad_config(sshd: Sshd, case: str) -> Path:
    config = sshd.ssh_config(["gpu-test"])
    make = BAD_CONFIGS[case]
    config.write_bytes(make(config.read_text(), config))
    return config


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_a_bad_ssh_config_makes_the_host_refused_naming_file_and_line(
    sshd: Sshd, home: Path, case: str
) -> None:
    config = bad_config(sshd, case)
    source = watch(alias(), SshSettings())
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(LINK_S)
        assert link.state is HostState.REFUSED
        assert one_line(link.reason) == f"gpu-test: ssh config: {ssh_says(config)}"
        assert link.connects == 0
    finally:
        source.close()


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_ssh_refuses_the_same_configs(sshd: Sshd, case: str) -> None:
    """The judge: `ssh -G` (which connects nowhere) refuses each config the console refuses."""
    config = sshd.ssh_config(["gpu-test"])
    assert judge("-G", "-F", str(config), "gpu-test").returncode == 0
    config = bad_config(sshd, case)
    refused = judge("-G", "-F", str(config), "gpu-test")
    assert refused.returncode != 0, refused.stdout[-300:]


def test_a_latin1_comment_is_read_as_ssh_reads_it(sshd: Sshd, home: Path) -> None:
    """OpenSSH takes config bytes as they are; so does the console, which asks it."""
    config = sshd.ssh_config(["gpu-test"])
    config.write_bytes("# r\xe9seau du labo\n".encode("latin-1") + config.read_bytes())
    assert judge("-G", "-F", str(config), "gpu-test").returncode == 0

    async def attempt() -> None:
        async with await connect(alias(), SshSettings()):
            pass

    asyncio.run(attempt())


KNOWN_HOSTS_DAMAGE = {
    "not UTF-8": b"\xff\xfe\x80 garbage\n",
    "a line without a key": b"# ok\nlonely-host-name\n",
    "a key that is not base64": b"[127.0.0.1]:1 ssh-ed25519 !!!notbase64\n",
}


@pytest.mark.parametrize("case", KNOWN_HOSTS_DAMAGE)
def test_a_damaged_known_hosts_line_is_skipped_as_ssh_skips_it(
    sshd: Sshd, home: Path, case: str
) -> None:
    """OpenSSH skips a line it cannot read and reads the others: the host still connects."""
    sshd.known_hosts.write_bytes(KNOWN_HOSTS_DAMAGE[case] + sshd.known_hosts.read_bytes())
    config = home / ".ssh" / "config"
    assert judge("-F", str(config), "gpu-test", "true").returncode == 0
    source = watch(alias(), SshSettings())
    link = source.supervisor.link("gpu-test")
    try:
        wait_for(lambda: link.state is HostState.LIVE, LINK_S, "the host to be live")
    finally:
        source.close()


def test_hosts_check_says_why_in_text_and_json(sshd: Sshd, home: Path) -> None:
    config = bad_config(sshd, "an Include loop")
    expected = f"gpu-test: ssh config: {ssh_says(config)}"
    done = run_gpuconsole(home, "hosts", "check", "--json", "--hosts", "gpu-test")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout) == [
        {
            "name": "gpu-test",
            "state": "refused",
            "reason": expected,
            "gpus": None,
            "answered_by": "answer",
            "notices": [],
        }
    ]
    done = run_gpuconsole(home, "hosts", "check", "--hosts", "gpu-test")
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines() == [
        f"HOST      {'STATE':<17}  {'ENDED':<7}  {'GPUS':>7}  REASON",
        f"gpu-test  {'refused':<17}  {'answer':<7}  {'-':>7}  {expected}",
    ]


async def test_the_fleet_screen_shows_a_host_refused_with_the_config_reason(
    sshd: Sshd, home: Path
) -> None:
    config = bad_config(sshd, "random bytes")
    source = FleetSource(None, watch(alias(), SshSettings()))
    app = GpuConsoleApp(source, label="test rack", refresh=0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(
                pilot,
                lambda: app.fleet.store.status("gpu-test").state is HostState.REFUSED,
                LINK_S,
            )
            assert app.fleet.store.status("gpu-test").reason == (
                f"gpu-test: ssh config: {ssh_says(config)}"
            )
    finally:
        source.close()


def test_a_proxyjump_ssh_refuses_is_refused_naming_it(sshd: Sshd, home: Path) -> None:
    config = home / ".ssh" / "config"
    config.write_text("Host gpu-test\n  ProxyJump bastion:99999\n" + config.read_text())
    with pytest.raises(ConnectFailure) as failed:
        asyncio.run(connect(alias(), SshSettings()))
    assert failed.value.state is HostState.REFUSED
    assert failed.value.reason == f"gpu-test: ssh config: {ssh_says(config)}"


def test_jump_hosts_that_jump_through_each_other_are_a_reason_not_a_loop(home: Path) -> None:
    config = home / ".ssh" / "config"
    config.write_text("Host loop-a\n  ProxyJump loop-b\nHost loop-b\n  ProxyJump loop-a\n")
    with pytest.raises(ConnectFailure) as failed:
        asyncio.run(asyncio.wait_for(connect(alias("loop-a"), SshSettings()), LINK_S))
    assert failed.value.state is HostState.DOWN
    assert one_line(failed.value.reason).startswith("loop-a: jump host loop-b: jump host loop-a")
    assert failed.value.reason.endswith(
        "more than 8 jump hosts on the way (does a ProxyJump lead back to a host before it?)"
    )


def test_an_unforeseen_error_makes_the_host_down_with_it_not_connecting_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug in connecting")

    monkeypatch.setattr("gpuconsole.hosts.supervisor.connect", broken)
    source = watch(alias(), SshSettings())
    link = source.supervisor.link("gpu-test")
    try:
        source.settle(LINK_S)
        assert link.state is HostState.DOWN
        assert link.reason == "gpu-test: stopped watching: RuntimeError: a bug in connecting"
    finally:
        source.close()


# --- 2. numbers in the inventory ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "[defaults]\nconnect_timeout = 1e308\n[hosts.gpu-test]\n",
            2,
            "defaults.connect_timeout: must be a number of seconds in 0.1..3600, got 1e+308",
        ),
        (
            "[hosts.gpu-test]\nport = 22\nconnect_timeout = " + "9" * 400 + "\n",
            3,
            "hosts.gpu-test.connect_timeout: must be a number of seconds in 0.1..3600,"
            " got an integer of 400 digits",
        ),
        (
            "[hosts.gpu-test]\ngpus = -8\n",
            2,
            "hosts.gpu-test.gpus: must be an integer in 1..1024, got -8",
        ),
    ],
)
def test_an_inventory_number_out_of_range_is_one_line_naming_file_key_and_value(
    home: Path, tmp_path: Path, text: str, line: int, message: str
) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(text)
    done = run_gpuconsole(home, "hosts", "check", "--inventory", str(inventory))
    assert done.returncode == 2
    assert done.stderr == f"gpuconsole: {inventory}:{line}: {message}\n"
    assert done.stdout == ""


# --- 3. a remote command that times out is killed on the host -------------------------------


@pytest.fixture
async def shell(sshd: Sshd) -> AsyncIterator[SshShell]:
    settings_ = sshd.settings()
    connection = await connect(direct(sshd), settings_)
    async with connection:
        yield SshShell(connection)


async def test_a_timed_out_run_kills_its_command_and_children_on_the_host(
    shell: SshShell,
) -> None:
    output = await shell.run("sleep 317 & sleep 318", 1.0)
    assert output.exit_code is None and output.stderr == "no answer within 1 s"
    assert await gone("sleep 317") and await gone("sleep 318")


async def test_a_cancelled_run_kills_its_command_on_the_host(shell: SshShell) -> None:
    task = asyncio.create_task(shell.run("sleep 319", 60.0))
    for _ in range(100):
        if running("sleep 319"):
            break
        await asyncio.sleep(0.1)
    assert running("sleep 319")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone("sleep 319")


async def test_a_cancel_that_wait_for_swallowed_still_stops_and_kills(
    shell: SshShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's asyncio.wait_for returns what finished just as the task was cancelled,
    the cancellation consumed: as when the group line and the cancel arrive together."""
    from gpuconsole.actions import shell as module

    told = module._told

    async def swallowed(*args: object) -> object:
        started = await told(*args)  # type: ignore[arg-type]
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # delivered, and caught, as wait_for catches it
        return started

    monkeypatch.setattr(module, "_told", swallowed)
    with pytest.raises(asyncio.CancelledError):
        await shell.run("sleep 329", 60.0)
    assert await gone("sleep 329")


async def test_a_run_cancelled_before_its_group_is_read_still_kills_its_command(
    shell: SshShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command may be running before the console has read the line that names its
    process group: a stop then reads that line first, and kills the group."""
    from gpuconsole.actions import shell as module

    told = module._told
    calls: list[int] = []

    async def not_yet(*args: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()  # the first reading never gets there
        return await told(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "_told", not_yet)
    task = asyncio.create_task(shell.run("sleep 323", 60.0))
    for _ in range(100):
        if running("sleep 323"):
            break
        await asyncio.sleep(0.1)
    assert running("sleep 323") and len(calls) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 2
    assert await gone("sleep 323")


async def test_a_run_cancelled_while_its_channel_opens_still_kills_its_command(
    shell: SshShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshd starts the command before its answer to the channel request arrives here: a stop
    in that moment waits for the answer, then kills the group."""
    connection = shell._connection
    opened = connection.create_process

    async def slow_answer(*args: object, **kwargs: object) -> object:
        process = await opened(*args, **kwargs)  # type: ignore[arg-type]
        await asyncio.sleep(1.0)  # the command runs; the answer is still on its way
        return process

    monkeypatch.setattr(connection, "create_process", slow_answer)
    task = asyncio.create_task(shell.run("sleep 324", 60.0))
    for _ in range(100):
        if running("sleep 324"):
            break
        await asyncio.sleep(0.05)
    assert running("sleep 324") and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone("sleep 324")


async def test_a_finished_run_reads_as_before(shell: SshShell) -> None:
    output = await shell.run("echo out; echo err >&2; cat; exit 4", 20.0)  # cat: stdin is empty
    assert (output.exit_code, output.stdout, output.stderr) == (4, "out\n", "err\n")


async def test_a_run_that_floods_its_output_keeps_the_first_mebibyte(shell: SshShell) -> None:
    output = await shell.run("head -c 3000000 /dev/zero | tr '\\0' x", 30.0)
    assert output.exit_code == 0
    assert output.stdout == "x" * (1 << 20)


async def test_what_a_login_shell_prints_first_stays_output(tmp_path: Path) -> None:
    """A shell that prints before the command (an rc file, a ForceCommand banner) prints
    before the process-group mark: that is output like any other, and the group is still
    found and killed."""
    server = Sshd(tmp_path / "noisy-sshd")
    with server.config.open("a") as config:
        config.write('ForceCommand echo welcome-from-rc; eval "$SSH_ORIGINAL_COMMAND"\n')
    server.start()
    settings_ = server.settings()
    try:
        async with await connect(direct(server), settings_) as connection:
            noisy = SshShell(connection)
            output = await noisy.run("echo out", 20.0)
            assert (output.exit_code, output.stdout) == (0, "welcome-from-rc\nout\n")
            lines: list[str] = []
            streamed = await noisy.stream("echo out", 20.0, lines.append)
            assert lines == ["welcome-from-rc", "out"] and streamed.exit_code == 0
            timed_out = await noisy.run("sleep 321", 1.0)
            assert timed_out.exit_code is None
            assert await gone("sleep 321")
    finally:
        server.kill()


# --- 4. the agent is never forwarded ----------------------------------------------------------


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: Sshd) -> Iterator[Path]:
    """An ssh-agent holding the test sshd's client key, as SSH_AUTH_SOCK."""
    socket_path = tmp_path / "agent.sock"
    process = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL
    )
    try:
        wait_for(socket_path.exists, LINK_S, "the agent's socket")
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        yield socket_path
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("jump", [None, "gpu-test"])
async def test_forward_agent_yes_in_ssh_config_forwards_nothing(
    sshd: Sshd, home: Path, agent: Path, jump: str | None
) -> None:
    config = home / ".ssh" / "config"
    config.write_text("Host *\n  ForwardAgent yes\n" + config.read_text())
    probe = 'echo "agent=[$SSH_AUTH_SOCK]"'
    # the judge: ssh with this config forwards the agent (so this sshd would take it)
    forwarded = judge(
        "-F", str(config), "-o", f"UserKnownHostsFile={sshd.known_hosts}", "gpu-test", probe
    )
    assert forwarded.returncode == 0, forwarded.stderr
    assert forwarded.stdout.startswith("agent=[/"), forwarded.stdout
    entry = alias(jump=jump) if jump is None else direct(sshd, jump=jump)
    async with await connect(entry, SshSettings()) as connection:
        output = await SshShell(connection).run(probe, 20.0)
    assert output.stdout == "agent=[]\n", output


# --- 5. private keys that others may read -------------------------------------------------


@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o604, 0o600, 0o400])
async def test_a_key_file_others_may_read_is_refused_as_ssh_refuses_it(
    sshd: Sshd, mode: int
) -> None:
    sshd.client_key.chmod(mode)
    ssh_says = judge(
        "-F",
        "none",
        "-o",
        f"UserKnownHostsFile={sshd.known_hosts}",
        "-o",
        "IdentitiesOnly=yes",
        "-i",
        str(sshd.client_key),
        "-p",
        str(sshd.port),
        f"{_user()}@127.0.0.1",
        "true",
    )
    settings_ = sshd.settings()
    try:
        connection = await connect(direct(sshd), settings_)
    except ConnectFailure as failure:
        assert ssh_says.returncode != 0, "ssh logged in with the key the console refused"
        assert "UNPROTECTED PRIVATE KEY FILE" in ssh_says.stderr
        assert failure.state is HostState.AUTH_FAILED
        assert (
            f"UNPROTECTED PRIVATE KEY FILE ignored: permissions 0{mode:o} for "
            f"'{sshd.client_key}' are too open (chmod 600 it)"
        ) in one_line(failure.reason)
    else:
        connection.close()
        assert ssh_says.returncode == 0, ssh_says.stderr


async def test_an_ignored_key_leaves_the_agent_to_log_in_as_ssh_does(
    sshd: Sshd, home: Path, agent: Path
) -> None:
    """The default key file is open to others; the agent holds the same key: ssh ignores the
    file and logs in with the agent, and so does the console."""
    key = home / ".ssh" / "id_ed25519"
    assert key == sshd.client_key
    key.chmod(0o644)
    ssh_says = judge(
        "-F",
        "none",
        "-o",
        f"UserKnownHostsFile={sshd.known_hosts}",
        "-i",
        str(key),
        "-p",
        str(sshd.port),
        f"{_user()}@127.0.0.1",
        "true",
    )
    assert ssh_says.returncode == 0, ssh_says.stderr
    entry = direct(sshd)
    async with await connect(entry, sshd.settings(options=sshd.options()[:2])):
        pass
    os.environ.pop("SSH_AUTH_SOCK")  # no agent: nothing else to log in with
    with pytest.raises(ConnectFailure) as failed:
        await connect(entry, sshd.settings(options=sshd.options()[:2]))
    assert failed.value.state is HostState.AUTH_FAILED
    assert f"permissions 0644 for '{key}' are too open" in failed.value.reason


async def test_an_identity_file_that_is_no_file_is_skipped_as_ssh_skips_it(
    sshd: Sshd, home: Path
) -> None:
    """`IdentityFile` naming a directory: ssh cannot load it and goes on to the next key;
    asyncssh would fail the connection. (A device, /dev/zero, it would read for ever.)"""
    config = home / ".ssh" / "config"
    text = config.read_text().replace("  IdentityFile", f"  IdentityFile {home}\n  IdentityFile")
    config.write_text(text)
    ssh_says = judge(
        "-F", str(config), "-o", f"UserKnownHostsFile={sshd.known_hosts}", "gpu-test", "true"
    )
    assert ssh_says.returncode == 0, ssh_says.stderr
    settings_ = SshSettings()
    connection = await asyncio.wait_for(connect(alias(), settings_), LINK_S)
    connection.close()


# --- 6. any inventory, any ssh config: loaded, or refused in one line -----------------------

_KEYS = st.sampled_from(
    ["user", "port", "jump", "connect_timeout", "gpus", "python", "address", "group", "hosts"]
) | st.text(max_size=8)
_SCALARS = (
    st.integers(min_value=-(10**500), max_value=10**500)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.text(max_size=40)
    | st.sampled_from(["gpu-01", "ops@bastion:22", "none", "rack-a", "127.0.0.1", "-oX=y"])
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)
_TABLE = st.dictionaries(_KEYS, _VALUES, max_size=6)
_DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "defaults": _TABLE,
        "groups": st.dictionaries(st.text(max_size=8), _TABLE, max_size=3),
        "hosts": st.dictionaries(st.text(max_size=12), _TABLE, max_size=4),
    },
)


def _toml(value: object) -> str:
    """A value as TOML: JSON's strings are TOML's basic strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value) if abs(value) < 10**4000 else "1" + "0" * 5000  # past int() too
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _document(document: dict[str, dict[str, object]]) -> str:
    lines = []
    for kind, tables in document.items():
        if kind == "defaults":
            tables = {None: tables}  # type: ignore[dict-item]
        for name, table in tables.items():
            header = kind if name is None else f"{kind}.{json.dumps(name)}"
            lines.append(f"[{header}]")
            lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in table.items()]  # type: ignore[union-attr]
    return "\n".join(lines) + "\n"


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _loads_or_refuses_in_one_line(path: Path) -> None:
    try:
        load_inventory(path)
    except InventoryError as error:
        message = str(error)
        assert message.startswith(f"{path}:") and not _CONTROL.search(message), message
        assert len(message) < 1000, message


_FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_FUZZ
@given(document=_DOCUMENTS)
def test_any_toml_inventory_loads_or_is_refused_in_one_line(
    tmp_path: Path, document: dict[str, dict[str, object]]
) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(_document(document), encoding="utf-8")
    _loads_or_refuses_in_one_line(path)


@_FUZZ
@given(
    data=st.binary(max_size=400)
    | st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_as_inventory_load_or_are_refused_in_one_line(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "hosts.toml"
    path.write_bytes(b"[hosts.a]\n" + data)
    _loads_or_refuses_in_one_line(path)


_CONFIG_WORDS = st.sampled_from(
    [
        "Host",
        "Match host",
        "Match all",
        "HostName",
        "Port",
        "User",
        "Include",
        "Include=",
        "IdentityFile",
        "ProxyJump",
        "ConnectTimeout",
        "ForwardAgent",
        "ServerAliveInterval",
        "IdentitiesOnly",
        "AddressFamily",
        "=",
        "#",
    ]
)
_CONFIG_VALUES = (
    st.text(alphabet=st.characters(blacklist_characters="*"), max_size=20)
    | st.sampled_from(
        ["0", "-1", "99999", "abc", "yes", "no", "none", "gpu-test", '"', "%h", "self", "a:b"]
    )
    | st.integers(min_value=-(10**30), max_value=10**30).map(str)
)
_CONFIG_LINES = st.tuples(_CONFIG_WORDS, _CONFIG_VALUES).map(" ".join) | st.text(max_size=30)


@_FUZZ
@given(
    lines=st.lists(_CONFIG_LINES, max_size=8),
    noise=st.binary(max_size=16),
)
def test_any_ssh_config_is_planned_or_refused_in_one_line(
    _home: Path, tmp_path: Path, lines: list[str], noise: bytes
) -> None:
    """Whatever ~/.ssh/config holds, connecting either has a plan or a one-line reason; no
    other exception. (No line may run a command: `Match exec` is left out.)"""
    (_home / ".ssh" / "self").write_text("Include self\n")  # `Include self` loops
    text = "\n".join(line for line in lines if "exec" not in line.lower())
    config = tmp_path / "config"
    config.write_bytes(text.encode("utf-8", "surrogatepass") + b"\n" + noise)
    host_settings = SshSettings(
        config_file=config, options=(f"UserKnownHostsFile={tmp_path / 'none'}",)
    )
    try:
        ssh._plan(alias(), host_settings, tunnelled=False)
    except ConnectFailure as failure:
        assert failure.reason.startswith("gpu-test: ") and one_line(failure.reason)


# --- helpers ----------------------------------------------------------------------------------


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _fields(host: HostEntry) -> dict[str, object]:
    return {name: getattr(host, name) for name in HostEntry.__slots__}  # type: ignore[attr-defined]
