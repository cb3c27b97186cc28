"""The host inventory: the TOML file, `--hosts`, and the errors that point at the offending line."""

from __future__ import annotations

import sys
from pathlib import Path
from textwrap import dedent

import pytest

from gpuconsole.core import paths
from gpuconsole.hosts import inventory
from gpuconsole.hosts.inventory import (
    HostDefaults,
    HostEntry,
    Inventory,
    InventoryError,
    hosts_from_option,
    load_inventory,
)

FULL = """\
[defaults]
user = "ops"
port = 22
jump = "bastion.example"
connect_timeout = 5

[groups.rack-a]
user = "root"
gpus = 8
hosts = ["gpu-a01", "gpu-a02"]

[groups.rack-b]
port = 2022
connect_timeout = 2.5
hosts = ["gpu-b02"]

[hosts.gpu-b01]
address = "10.0.0.21"
user = "admin"
port = 2222
gpus = 4
group = "rack-b"

[hosts.gpu-a02]
port = 2200
jump = "none"

[hosts.login-01]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(dedent(text), encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return str(caught.value)


# --- the file ----------------------------------------------------------------------------------


def test_full_file_resolves_every_field_by_precedence(tmp_path: Path) -> None:
    loaded = load_inventory(write(tmp_path, FULL))

    assert loaded.source == str(tmp_path / "hosts.toml")
    assert loaded.hosts == (
        # group user over [defaults] user; [defaults] port, jump and timeout; group gpus
        HostEntry("gpu-a01", "gpu-a01", "root", 22, "bastion.example", "rack-a", 8, 5.0),
        # host port over [defaults]; host jump "none" over [defaults] jump
        HostEntry("gpu-a02", "gpu-a02", "root", 2200, None, "rack-a", 8, 5.0),
        # listed by the group: group port and timeout over [defaults]
        HostEntry("gpu-b02", "gpu-b02", "ops", 2022, "bastion.example", "rack-b", None, 2.5),
        # joined with `group`, after the listed hosts: host address, user, port, gpus over all
        HostEntry("gpu-b01", "10.0.0.21", "admin", 2222, "bastion.example", "rack-b", 4, 2.5),
        # in no group, last: [defaults] only
        HostEntry("login-01", "login-01", "ops", 22, "bastion.example", None, None, 5.0),
    )


def test_groups_keep_file_order(tmp_path: Path) -> None:
    loaded = load_inventory(write(tmp_path, FULL))

    assert loaded.groups() == {"rack-a": ("gpu-a01", "gpu-a02"), "rack-b": ("gpu-b02", "gpu-b01")}
    assert list(loaded.groups()) == ["rack-a", "rack-b"]


def test_get_finds_a_host_by_name(tmp_path: Path) -> None:
    loaded = load_inventory(write(tmp_path, FULL))

    assert loaded.get("gpu-b01").address == "10.0.0.21"
    with pytest.raises(KeyError, match="gpu-zz"):
        loaded.get("gpu-zz")


def test_built_in_settings_leave_user_and_port_to_ssh_config(tmp_path: Path) -> None:
    loaded = load_inventory(write(tmp_path, "[hosts.gpu-01]\n"))

    assert loaded.hosts == (HostEntry("gpu-01", "gpu-01", None, None, None, None, None, 10.0),)
    assert loaded.groups() == {}


def test_a_declared_group_without_hosts_is_not_in_groups(tmp_path: Path) -> None:
    loaded = load_inventory(write(tmp_path, "[groups.empty]\ngpus = 8\n[hosts.gpu-01]\n"))

    assert loaded.groups() == {}
    assert loaded.get("gpu-01").expected_gpus is None


def test_the_module_docstring_example_is_a_valid_inventory(tmp_path: Path) -> None:
    assert inventory.__doc__ is not None
    example = inventory.__doc__.split("```toml\n")[1].split("```")[0]

    loaded = load_inventory(write(tmp_path, example))

    assert [host.name for host in loaded.hosts] == ["gpu-a01", "gpu-a02", "gpu-b01", "dgx-01"]
    assert loaded.get("gpu-b01").expected_gpus == 4
    assert loaded.get("dgx-01").jump is None


# --- errors: FILE:LINE: key: what is wrong -----------------------------------------------------

ERRORS = {
    "toml syntax": (
        'user = "ops"\n[hosts.a]\nport = = 1\n',
        3,
        "invalid TOML: Invalid value (column 8)",
    ),
    "toml unclosed at end": (
        '[groups.r]\nhosts = ["a",\n',
        2,
        "invalid TOML: Invalid value (at end of file)",
    ),
    "unknown top-level table": (
        "[hosts.a]\n\n[servers]\nx = 1\n",
        3,
        "servers: unknown top-level table or key (allowed: defaults, groups, hosts)",
    ),
    "unknown top-level key": (
        'colour = "red"\n[hosts.a]\n',
        1,
        "colour: unknown top-level table or key (allowed: defaults, groups, hosts)",
    ),
    "unknown key in defaults": (
        '[defaults]\nuser = "ops"\nusr = "x"\n[hosts.a]\n',
        3,
        "defaults.usr: unknown key (allowed: user, port, jump, connect_timeout, gpus, python)",
    ),
    "unknown key in a group": (
        '[groups.r]\nhosts = ["a"]\naddress = "x"\n',
        3,
        "groups.r.address: unknown key"
        " (allowed: hosts, user, port, jump, connect_timeout, gpus, python)",
    ),
    "unknown key in a host": (
        "[hosts.a]\nport = 22\nhosts = []\n",
        3,
        "hosts.a.hosts: unknown key"
        " (allowed: address, group, user, port, jump, connect_timeout, gpus, python)",
    ),
    "port a string": (
        '[hosts.a]\nport = "22"\n',
        2,
        'hosts.a.port: must be an integer in 1..65535, got "22"',
    ),
    "port out of range": (
        "[defaults]\nport = 70000\n[hosts.a]\n",
        2,
        "defaults.port: must be an integer in 1..65535, got 70000",
    ),
    "port a bool": (
        '[groups.r]\nhosts = ["a"]\nport = true\n',
        3,
        "groups.r.port: must be an integer in 1..65535, got true",
    ),
    "gpus zero": ("[hosts.a]\ngpus = 0\n", 2, "hosts.a.gpus: must be an integer in 1..1024, got 0"),
    "gpus a float": (
        "[hosts.a]\ngpus = 2.5\n",
        2,
        "hosts.a.gpus: must be an integer in 1..1024, got 2.5",
    ),
    "gpus too many": (
        "[groups.r]\ngpus = 100000\n[hosts.a]\ngroup = 'r'\n",
        2,
        "groups.r.gpus: must be an integer in 1..1024, got 100000",
    ),
    "gpus a 400-digit integer": (
        "[hosts.a]\ngpus = " + "9" * 400 + "\n",
        2,
        "hosts.a.gpus: must be an integer in 1..1024, got an integer of 400 digits",
    ),
    "port a negative 400-digit integer": (
        "[defaults]\nport = -" + "1" * 400 + "\n[hosts.a]\n",
        2,
        "defaults.port: must be an integer in 1..65535, got an integer of 400 digits",
    ),
    "timeout negative": (
        "[hosts.a]\nconnect_timeout = -1\n",
        2,
        "hosts.a.connect_timeout: must be a number of seconds in 0.1..3600, got -1",
    ),
    "timeout zero": (
        "[hosts.a]\nconnect_timeout = 0\n",
        2,
        "hosts.a.connect_timeout: must be a number of seconds in 0.1..3600, got 0",
    ),
    "timeout nan": (
        "[hosts.a]\nconnect_timeout = nan\n",
        2,
        "hosts.a.connect_timeout: must be a number of seconds in 0.1..3600, got NaN",
    ),
    "timeout inf": (
        "[hosts.a]\nconnect_timeout = -inf\n",
        2,
        "hosts.a.connect_timeout: must be a number of seconds in 0.1..3600, got -Infinity",
    ),
    "timeout 1e308 in defaults": (
        "[defaults]\nconnect_timeout = 1e308\n[hosts.a]\n",
        2,
        "defaults.connect_timeout: must be a number of seconds in 0.1..3600, got 1e+308",
    ),
    "timeout over an hour in a group": (
        '[groups.r]\nhosts = ["a"]\nconnect_timeout = 3601\n',
        3,
        "groups.r.connect_timeout: must be a number of seconds in 0.1..3600, got 3601",
    ),
    "timeout a 400-digit integer": (
        "[hosts.a]\nconnect_timeout = " + "1" * 400 + "\n",
        2,
        "hosts.a.connect_timeout: must be a number of seconds in 0.1..3600,"
        " got an integer of 400 digits",
    ),
    "a long value is cut": (
        '[hosts.a]\nport = "' + "x" * 500 + '"\n',
        2,
        'hosts.a.port: must be an integer in 1..65535, got "' + "x" * 58 + "…",
    ),
    "an escape sequence in a host name": (
        '[hosts."gpu\\u001b[2J"]\n',
        1,
        'hosts."gpu\\u001b[2J": host name must not contain control characters, got "gpu\\u001b[2J"',
    ),
    "a bidi override in a user": (
        '[hosts.a]\nuser = "ops\\u202e"\n',
        2,
        'hosts.a.user: must not contain control characters, got "ops\\u202e"',
    ),
    "a jump hop with a bad port": (
        '[hosts.a]\njump = "ops@bastion:22,inner:ssh"\n',
        2,
        'hosts.a.jump: hop "inner:ssh": port must be an integer in 1..65535, got "ssh"',
    ),
    "an empty jump hop": (
        '[defaults]\njump = "bastion,"\n[hosts.a]\n',
        2,
        'defaults.jump: hop "": host must not be empty',
    ),
    "user not a string": ("[hosts.a]\nuser = 5\n", 2, "hosts.a.user: must be a string, got 5"),
    "user with an @": (
        '[hosts.a]\nuser = "ops@b"\n',
        2,
        "hosts.a.user: must not contain '@', got \"ops@b\"",
    ),
    "address read as an ssh option": (
        '[hosts.a]\naddress = "-oProxyCommand=sh"\n',
        2,
        "hosts.a.address: must not start with '-' (ssh would take it for an option):"
        ' "-oProxyCommand=sh"',
    ),
    "jump with whitespace": (
        '[hosts.a]\njump = "bastion example"\n',
        2,
        'hosts.a.jump: must not contain whitespace, got "bastion example"',
    ),
    "host name read as an ssh option": (
        '[hosts."-a"]\nport = 22\n',
        1,
        "hosts.-a: host name must not start with '-' (ssh would take it for an option): \"-a\"",
    ),
    "group hosts not a list": (
        '[groups.r]\nhosts = "a"\n',
        2,
        'groups.r.hosts: must be a list of host names, got "a"',
    ),
    "group hosts with a number": (
        '[groups.r]\nhosts = [\n  "a",\n  7,\n]\n',
        2,
        "groups.r.hosts: item 2 must be a string, got 7",
    ),
    "hosts not a table": ('hosts = ["a"]\n', 1, 'hosts: must be a table, got ["a"]'),
    "a host not a table": ("[hosts]\na = 5\n", 2, "hosts.a: must be a table, got 5"),
    "a host in two groups": (
        '[groups.r1]\nhosts = ["a", "b"]\n\n[groups.r2]\nhosts = ["c", "b"]\n',
        5,
        "groups.r2.hosts: b is listed in groups.r1 too (a host is in one group at most)",
    ),
    "a host twice in one group": (
        '[groups.r]\nhosts = ["a", "a"]\n',
        2,
        "groups.r.hosts: a is listed twice (a host is in one group at most)",
    ),
    "a host naming an unknown group": (
        '[groups.rack-a]\nhosts = ["a"]\n[hosts.b]\ngroup = "rack-aa"\n',
        4,
        'hosts.b.group: unknown group "rack-aa" (declared: rack-a); declare it as [groups.rack-aa]',
    ),
    "a host naming another group than its list": (
        '[groups.r1]\nhosts = ["a"]\n[groups.r2]\n[hosts.a]\nport = 22\ngroup = "r2"\n',
        6,
        'hosts.a.group: is "r2", but groups.r1 lists a',
    ),
    "a host naming an earlier group than its list": (
        '[groups.r2]\n[groups.r1]\nhosts = ["a"]\n[hosts.a]\ngroup = "r2"\n',
        5,
        'hosts.a.group: is "r2", but groups.r1 lists a',
    ),
    "quoted dotted host name": (
        '[hosts."gpu.b01"]\nuser = "x"\nport = 0\n',
        3,
        'hosts."gpu.b01".port: must be an integer in 1..65535, got 0',
    ),
    "inline table falls back to its line": (
        "[hosts]\ngpu-a = { user = 'x' }\ngpu-b = { port = 0 }\n",
        3,
        "hosts.gpu-b.port: must be an integer in 1..65535, got 0",
    ),
}


@pytest.mark.parametrize(("text", "line", "message"), ERRORS.values(), ids=list(ERRORS))
def test_error_names_file_line_and_key(tmp_path: Path, text: str, line: int, message: str) -> None:
    assert error_of(tmp_path, text) == f"{tmp_path / 'hosts.toml'}:{line}: {message}"


@pytest.mark.parametrize("text", ["", "# nothing yet\n", '[defaults]\nuser = "ops"\n'])
def test_no_hosts_is_an_error_without_a_line(tmp_path: Path, text: str) -> None:
    assert error_of(tmp_path, text) == (
        f"{tmp_path / 'hosts.toml'}: no hosts: list some in a [groups.NAME] or add [hosts.NAME]"
    )


def test_unreadable_path_names_the_os_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"

    with pytest.raises(InventoryError) as caught:
        load_inventory(missing)

    assert str(caught.value) == f"{missing}: cannot read: No such file or directory"


def test_a_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path)

    assert str(caught.value) == f"{tmp_path}: cannot read: Is a directory"


def test_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_bytes(b'[hosts.a]\nuser = "\xff"\n')

    with pytest.raises(InventoryError) as caught:
        load_inventory(path)

    assert str(caught.value) == f"{path}: not UTF-8 text (byte 18)"


def test_inventory_refuses_duplicate_names() -> None:
    host = HostDefaults().entry("a", "a")

    with pytest.raises(ValueError, match="unique"):
        Inventory((host, host), "test")


# --- where the file is -------------------------------------------------------------------------


def test_env_var_points_at_the_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.INVENTORY.variable, str(tmp_path / "elsewhere.toml"))

    assert paths.INVENTORY.path() == tmp_path / "elsewhere.toml"


@pytest.mark.skipif(sys.platform != "linux", reason="XDG paths are the Linux layout")
def test_default_path_is_in_the_xdg_config_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv(paths.INVENTORY.variable, "")

    assert paths.INVENTORY.path() == tmp_path / "config" / "gpuconsole" / "hosts.toml"


# --- --hosts -----------------------------------------------------------------------------------


def test_hosts_option_parses_user_host_and_port() -> None:
    parsed = hosts_from_option("gpu-01, ops@gpu-02:2222,[fe80::1]:22,fe80::2,root@gpu-03")

    assert parsed.source == "--hosts"
    assert parsed.hosts == (
        HostEntry("gpu-01", "gpu-01", None, None, None, None, None, 10.0),
        HostEntry("gpu-02:2222", "gpu-02", "ops", 2222, None, None, None, 10.0),
        HostEntry("[fe80::1]:22", "fe80::1", None, 22, None, None, None, 10.0),
        HostEntry("fe80::2", "fe80::2", None, None, None, None, None, 10.0),
        HostEntry("gpu-03", "gpu-03", "root", None, None, None, None, 10.0),
    )


def test_hosts_option_entries_override_defaults() -> None:
    defaults = HostDefaults(user="ops", port=2200, jump="bastion", connect_timeout=3.0)

    parsed = hosts_from_option("a,root@b:22", defaults)

    assert parsed.hosts == (
        HostEntry("a", "a", "ops", 2200, "bastion", None, None, 3.0),
        HostEntry("b:22", "b", "root", 22, "bastion", None, None, 3.0),
    )


def test_same_host_on_two_ports_stays_two_hosts() -> None:
    parsed = hosts_from_option("127.0.0.1:2222,127.0.0.1:2223")

    assert [host.name for host in parsed.hosts] == ["127.0.0.1:2222", "127.0.0.1:2223"]
    assert {host.address for host in parsed.hosts} == {"127.0.0.1"}


BAD_OPTIONS = {
    "": "--hosts: no hosts",
    "a,,b": '--hosts: empty entry in "a,,b"',
    "a,b,": '--hosts: empty entry in "a,b,"',
    "ops@": '--hosts: "ops@": host must not be empty',
    "@gpu": '--hosts: "@gpu": user must not be empty',
    "a@b@gpu": '--hosts: "a@b@gpu": user must not contain \'@\', got "a@b"',
    "gpu:": '--hosts: "gpu:": port must be an integer in 1..65535, got ""',
    "gpu:ssh": '--hosts: "gpu:ssh": port must be an integer in 1..65535, got "ssh"',
    "gpu:0": '--hosts: "gpu:0": port must be an integer in 1..65535, got 0',
    "gpu:65536": '--hosts: "gpu:65536": port must be an integer in 1..65535, got 65536',
    "[::1": "--hosts: \"[::1\": '[' without ']'",
    "[::1]22": "--hosts: \"[::1]22\": expected ':PORT' after ']', got \"22\"",
    "-oProxyCommand=sh": (
        "--hosts: \"-oProxyCommand=sh\": host must not start with '-'"
        ' (ssh would take it for an option): "-oProxyCommand=sh"'
    ),
    "a,b,a": '--hosts: "a": listed twice',
}


@pytest.mark.parametrize(("text", "message"), BAD_OPTIONS.items(), ids=list(BAD_OPTIONS))
def test_bad_hosts_option_names_the_entry(text: str, message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        hosts_from_option(text)

    assert str(caught.value) == message


def test_a_port_of_5000_digits_is_refused_in_one_short_line() -> None:
    with pytest.raises(InventoryError) as caught:
        hosts_from_option("gpu:" + "9" * 5000)

    message = str(caught.value)
    assert "port must be an integer in 1..65535" in message
    assert len(message) < 200 and "\n" not in message


def test_a_port_with_leading_zeros_is_the_port() -> None:
    assert hosts_from_option("gpu:000022").hosts[0].port == 22


def test_jump_hosts_are_the_hops_in_order() -> None:
    hops = inventory.jump_hosts("ops@bastion:2222,[fe80::1]:22,inner", connect_timeout=3.0)

    assert [(h.address, h.user, h.port, h.connect_timeout) for h in hops] == [
        ("bastion", "ops", 2222, 3.0),
        ("fe80::1", None, 22, 3.0),
        ("inner", None, None, 3.0),
    ]
    with pytest.raises(InventoryError, match='ProxyJump "a,b:0": hop "b:0": port'):
        inventory.jump_hosts("a,b:0")


def test_python_is_a_program_a_remote_shell_runs_as_it_is(tmp_path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[defaults]\npython = "/opt/conda/envs/train/bin/python"\n[hosts.gpu01]\n')
    assert load_inventory(path).get("gpu01").python == "/opt/conda/envs/train/bin/python"
    path.write_text('[hosts.gpu01]\npython = "python3; reboot"\n')
    with pytest.raises(InventoryError, match="python"):
        load_inventory(path)
