"""`where_set` against the real OpenSSH client: configs written per test, `ssh -G -F CONFIG`.

Each case also asks `ssh -G` for the value it ends up with, so the file and line the module names
is the one ssh took the value from, not only the one the test meant. No sshd: `ssh -G` never
connects.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuconsole.hosts.ssh_origin import where_set

SSH = shutil.which("ssh")
pytestmark = pytest.mark.skipif(SSH is None, reason="needs the OpenSSH client (ssh)")


def write(path: Path, text: str) -> Path:
    """A config file ssh accepts (an included one must not be group- or world-writable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o644)
    return path


def ssh_g(config: Path, *options: str, host: str = "gpu") -> list[str]:
    assert SSH is not None
    return [SSH, "-G", "-F", str(config), *options, "--", host]


def ssh_value(command: list[str], keyword: str) -> str:
    """What `ssh -G` says it uses for `keyword` (the first of its lines)."""
    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True
    )
    values = [
        value
        for name, _, value in (line.partition(" ") for line in done.stdout.splitlines())
        if name == keyword.lower()
    ]
    return values[0]


# --- Host and Match blocks -------------------------------------------------------------------


def test_a_keyword_in_the_global_section(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config", "# before any Host\n\nCompression yes\nHost gpu\n  Port 2\n"
    )
    assert ssh_value(ssh_g(config), "Compression") == "yes"
    assert where_set("Compression", ssh_g(config)) == f"{config} line 3"


def test_a_matching_host_block_after_one_that_does_not_match(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "Host other\n  Port 1\nHost gpu\n  Port 2\n")
    assert ssh_value(ssh_g(config), "Port") == "2"
    assert where_set("Port", ssh_g(config)) == f"{config} line 4"


def test_the_first_of_two_active_settings_wins(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config", "Host gpu*\n  Port 2\n  Port 3\nHost *\n  Port 4\n  Compression yes\n"
    )
    assert ssh_value(ssh_g(config), "Port") == "2"
    assert where_set("Port", ssh_g(config)) == f"{config} line 2"
    assert where_set("Compression", ssh_g(config)) == f"{config} line 6"


def test_a_setting_in_a_block_that_does_not_apply_is_not_the_one(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        "Host other !gpu\n  Ciphers aes128-ctr\nHost !gpu\n  Ciphers aes192-ctr\n"
        "Host *\n  Ciphers aes256-ctr\n",
    )
    assert ssh_value(ssh_g(config), "Ciphers") == "aes256-ctr"
    assert where_set("Ciphers", ssh_g(config)) == f"{config} line 6"


def test_match_host_matched_and_not_matched(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        "Host gpu\n  HostName 127.0.0.1\n"
        "Match host gpu\n  Port 1\n"  # Match host sees the HostName: not matched
        "Match originalhost other\n  Port 2\n"
        "Match host 127.0.0.1 user bob\n  Port 3\n"  # one criterion fails
        "Match host 127.0.0.1\n  Port 4\n",
    )
    command = ssh_g(config, "-l", "alice")
    assert ssh_value(command, "Port") == "4"
    assert where_set("Port", command) == f"{config} line 10"
    assert where_set("Port", ssh_g(config, "-l", "bob")) == f"{config} line 8"


def test_match_final_counts_in_the_second_pass_but_not_for_hostname(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        "Match final\n  Port 5\n  Compression yes\n  HostName final.example\nHost *\n  Port 6\n",
    )
    command = ssh_g(config)
    assert (ssh_value(command, "Port"), ssh_value(command, "Compression")) == ("6", "yes")
    assert ssh_value(command, "HostName") == "gpu"  # ssh fixes it before the second pass
    assert where_set("Port", command) == f"{config} line 6"
    assert where_set("Compression", command) == f"{config} line 3"
    assert where_set("HostName", command) is None


# --- Include ---------------------------------------------------------------------------------


def test_an_included_file(tmp_path: Path) -> None:
    included = write(tmp_path / "inc" / "gpu.conf", "# the GPU hosts\nPort 2\n")
    config = write(tmp_path / "config", f"Host gpu\n  Include {included}\n  Port 3\n")
    assert ssh_value(ssh_g(config), "Port") == "2"
    assert where_set("Port", ssh_g(config)) == f"{included} line 2"


def test_a_glob_nested_twice_in_ssh_order(tmp_path: Path) -> None:
    deepest = write(tmp_path / "deep" / "last.conf", "Compression yes\n")
    write(tmp_path / "deep" / "middle.conf", f"Include {tmp_path}/deep/last*\n")
    write(tmp_path / "conf.d" / "10-a.conf", "Port 10\n")
    first = write(tmp_path / "conf.d" / "20-b.conf", f"Include {tmp_path}/deep/mid*\nUser b\n")
    write(tmp_path / "conf.d" / "30-c.conf", "User c\nPort 30\n")
    config = write(tmp_path / "config", f"Host gpu\n  Include {tmp_path}/conf.d/*.conf\n")
    command = ssh_g(config)
    assert (ssh_value(command, "Port"), ssh_value(command, "User")) == ("10", "b")
    assert where_set("Port", command) == f"{tmp_path}/conf.d/10-a.conf line 1"
    assert where_set("User", command) == f"{first} line 2"
    assert where_set("Compression", command) == f"{deepest} line 1"


def test_a_relative_include_under_dash_f_is_read_from_dot_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # readconf.c anchors a relative Include of a user config (which -F's file is) at ~/.ssh;
    # glob(3) expands that ~ from $HOME.
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    write(tmp_path / "inc.conf", "Port 1\n")  # beside the config: not where ssh looks
    included = write(home / ".ssh" / "inc.conf", "Port 2\n")
    nested = write(home / ".ssh" / "more" / "x.conf", "User nested\n")
    write(home / ".ssh" / "more.conf", "Include more/*.conf\n")
    config = write(tmp_path / "config", "Include inc.conf more.conf\n")
    command = ssh_g(config)
    assert (ssh_value(command, "Port"), ssh_value(command, "User")) == ("2", "nested")
    assert where_set("Port", command) == f"{included} line 1"
    assert where_set("User", command) == f"{nested} line 1"


def test_an_include_starts_in_its_lines_state_and_gives_it_back(tmp_path: Path) -> None:
    included = write(tmp_path / "inc", "User fromglobal\nHost other\n  Port 9\n")
    config = write(
        tmp_path / "config",
        f"Host other\n  Include {included}\nHost gpu\n  Include {included}\n  Port 2\n",
    )
    command = ssh_g(config)
    assert (ssh_value(command, "Port"), ssh_value(command, "User")) == ("2", "fromglobal")
    assert where_set("User", command) == f"{included} line 1"  # the second Include's read
    assert where_set("Port", command) == f"{config} line 5"  # the file's `Host other` ended


def test_an_include_in_an_inactive_block_is_parse_only(tmp_path: Path) -> None:
    # ssh evaluates the included Match, and logs it as matched, but forces the block off
    included = write(tmp_path / "inc", "Port 1\nMatch host gpu\n  Port 5\n")
    config = write(tmp_path / "config", f"Host other\n  Include {included}\nHost *\n  Port 7\n")
    assert ssh_value(ssh_g(config), "Port") == "7"
    assert where_set("Port", ssh_g(config)) == f"{config} line 4"


# --- how a line is written, and the names of a keyword ---------------------------------------


def test_equals_signs_and_mixed_case(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        "hOsT=gpu\n\tpOrT=2\n   CIPHERS = aes128-ctr\nHost *\n  Port 3\n  ciphers aes256-ctr\n",
    )
    command = ssh_g(config)
    assert (ssh_value(command, "Port"), ssh_value(command, "Ciphers")) == ("2", "aes128-ctr")
    assert where_set("Port", command) == f"{config} line 2"
    assert where_set("Ciphers", command) == f"{config} line 3"


def test_an_alias_counts_for_its_keyword(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        "Host gpu\n  PubkeyAcceptedKeyTypes ssh-ed25519\n  PubkeyAcceptedAlgorithms rsa-sha2-256\n"
        "  ChallengeResponseAuthentication no\n",
    )
    command = ssh_g(config)
    assert ssh_value(command, "PubkeyAcceptedAlgorithms") == "ssh-ed25519"
    assert where_set("PubkeyAcceptedAlgorithms", command) == f"{config} line 2"
    assert where_set("PubkeyAcceptedKeyTypes", command) == f"{config} line 2"
    assert ssh_value(command, "KbdInteractiveAuthentication") == "no"
    assert where_set("KbdInteractiveAuthentication", command) == f"{config} line 4"


def test_proxyjump_and_proxycommand_share_one_value(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "Host gpu\n  ProxyJump jump\n  ProxyCommand nc %h %p\n")
    command = ssh_g(config)
    assert ssh_value(command, "ProxyJump") == "jump"
    assert where_set("ProxyJump", command) == f"{config} line 2"
    assert where_set("ProxyCommand", command) is None  # the ProxyJump came first


# --- the command line ------------------------------------------------------------------------


def test_the_command_line_comes_before_every_file(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "Host gpu\n  Port 2\n  User alice\n  Ciphers aes128-ctr\n")
    dash_o = ssh_g(config, "-o", "Port=2222", "-o", "Ciphers aes256-ctr")
    assert (ssh_value(dash_o, "Port"), ssh_value(dash_o, "Ciphers")) == ("2222", "aes256-ctr")
    assert where_set("Port", dash_o) == "the command line (-o)"
    assert where_set("Ciphers", dash_o) == "the command line (-o)"
    assert where_set("User", dash_o) == f"{config} line 3"  # an -o of another keyword
    flags = ssh_g(config, "-l", "bob", "-p2200")
    assert (ssh_value(flags, "User"), ssh_value(flags, "Port")) == ("bob", "2200")
    assert where_set("User", flags) == "the command line (-l)"
    assert where_set("Port", flags) == "the command line (-p)"
    first = ssh_g(config, "-o", "Port=2201", "-p", "2202")  # both set Port only where unset
    assert ssh_value(first, "Port") == "2201"
    assert where_set("Port", first) == "the command line (-o)"
    at = ssh_g(config, host="carol@gpu")
    assert ssh_value(at, "User") == "carol"
    assert where_set("User", at) == "the command line (user@host)"


# --- nothing to name -------------------------------------------------------------------------


def test_a_keyword_nobody_sets_is_none(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "Host other\n  Ciphers aes128-ctr\nHost gpu\n  Port 2\n")
    assert where_set("Ciphers", ssh_g(config)) is None
    assert where_set("ProxyCommand", ssh_g(config)) is None


def test_ssh_failing_is_none(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "Port 2\nNoSuchKeyword yes\n")
    done = subprocess.run(ssh_g(config), stdin=subprocess.DEVNULL, capture_output=True)
    assert done.returncode != 0
    assert where_set("Port", ssh_g(config)) is None
    assert where_set("Port", ["/nonexistent/ssh", "-G", "gpu"]) is None


# --- hostile configs -------------------------------------------------------------------------


def test_a_line_of_100_kb(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        f"# {'x' * 100_000}\nSendEnv {'A' * 100_000}\nHost gpu\n  Port 2\n",
    )
    assert where_set("SendEnv", ssh_g(config)) == f"{config} line 2"
    assert where_set("Port", ssh_g(config)) == f"{config} line 4"


def test_control_characters_in_a_file_name_come_back_printable(tmp_path: Path) -> None:
    write(tmp_path / "e\x1b[31mvil\a\tx\\y.conf", "Port 2\n")
    config = write(tmp_path / "config", f"Host gpu\n  Include {tmp_path}/e*\n")
    assert ssh_value(ssh_g(config), "Port") == "2"
    where = where_set("Port", ssh_g(config))
    # ssh prints ESC as \033 and a backslash as \\, leaves BEL and TAB raw: those become ?
    assert where == f"{tmp_path}/e\\033[31mvil??x\\\\y.conf line 1"
    assert where.isprintable()


def test_a_newline_in_a_file_name_cannot_be_told(tmp_path: Path) -> None:
    write(tmp_path / "nl\ndebug1: x line 1: Applying options for gpu", "Port 2\n")
    config = write(tmp_path / "config", f"Host gpu\n  Include {tmp_path}/nl*\n")
    assert ssh_value(ssh_g(config), "Port") == "2"
    assert where_set("Port", ssh_g(config)) is None


def test_an_included_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    config = write(tmp_path / "config", f"Include {tmp_path}/fifo\nPort 2\n")
    started = time.monotonic()
    assert where_set("Port", ssh_g(config), timeout=1.0) is None  # ssh blocks opening it
    assert time.monotonic() - started < 5


def test_a_fifo_ssh_read_is_not_opened_again(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    feeder = threading.Thread(target=fifo.write_text, args=("Port 5\n",), daemon=True)
    feeder.start()  # feeds ssh once; a second reader would wait forever
    config = write(tmp_path / "config", f"Include {fifo}\nPort 2\n")
    started = time.monotonic()
    assert where_set("Port", ssh_g(config), timeout=5.0) is None
    assert time.monotonic() - started < 5
    feeder.join(timeout=1)
    assert not feeder.is_alive()
