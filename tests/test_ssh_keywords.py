"""The allow list of ssh_config keywords, held to the installed OpenSSH and to the README."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuconsole.hosts.ssh_config import SshConfigRefused, read_ssh_config
from gpuconsole.hosts.ssh_keywords import BY_PRINTED, KEYWORDS, Rule, readme_table, refusals

SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(SSH is None, reason="the OpenSSH client is not installed")
README = Path(__file__).resolve().parents[1] / "README.md"

# Every keyword that ssh -G prints only when set, set, so that the installed ssh prints them all.
EVERY_OPTIONAL = """\
Host gpu
  HostName 127.0.0.1
  BindAddress 127.0.0.1
  BindInterface lo
  CertificateFile /nonexistent/cert
  HostKeyAlias gpu-alias
  IdentityAgent none
  KnownHostsCommand /bin/false
  LocalCommand true
  LocalForward 1 127.0.0.1:2
  RemoteForward 3 127.0.0.1:4
  DynamicForward 5
  PKCS11Provider /nonexistent.so
  PreferredAuthentications publickey
  RemoteCommand true
  RevokedHostKeys /nonexistent/krl
  SendEnv LANG
  SetEnv A=b
  ControlPath /tmp/cp-%C
  KbdInteractiveDevices pam
  ProxyJump jump
"""


@needs_ssh
def test_every_keyword_the_installed_ssh_prints_is_in_the_table(tmp_path: Path) -> None:
    """With every optional keyword set, the installed ssh prints nothing the table lacks."""
    config = tmp_path / "config"
    config.write_text(EVERY_OPTIONAL)
    done = subprocess.run(
        [SSH or "ssh", "-G", "-F", str(config), "gpu"], capture_output=True, text=True, check=True
    )
    printed = {line.split(" ", 1)[0].lower() for line in done.stdout.splitlines() if line}
    assert len(printed) > 90  # the set-only keywords were printed too
    assert printed <= set(BY_PRINTED), printed - set(BY_PRINTED)


def test_each_keyword_is_in_the_table_once_with_its_rule_complete() -> None:
    names = [keyword.name.lower() for keyword in KEYWORDS]
    assert len(names) == len(set(names))
    for keyword in KEYWORDS:
        assert keyword.how and "\n" not in keyword.how
        assert bool(keyword.off) is (keyword.rule is Rule.OFF_ONLY), keyword


def test_a_keyword_the_table_lacks_is_refused_by_name() -> None:
    """A keyword a later OpenSSH adds is refused, never ignored."""
    found = refusals({"port": ("22",), "quantumresistance": ("yes",)}, {})
    assert [(r.keyword, r.value) for r in found] == [("quantumresistance", "yes")]


@pytest.mark.parametrize(
    ("printed", "value", "refused"),
    [
        ("proxycommand", "nc %h %p", True),
        ("proxycommand", "none", False),
        ("checkhostip", "yes", True),
        ("checkhostip", "no", False),
        ("sessiontype", "none", True),
        ("sessiontype", "default", False),
        ("forwardx11", "yes", False),  # no effect: never refused
        ("ciphers", "aes128-ctr", False),  # honoured
    ],
)
def test_off_only_keywords_are_refused_unless_off(printed: str, value: str, refused: bool) -> None:
    assert bool(refusals({printed: (value,)}, {})) is refused


def test_a_default_only_keyword_is_refused_where_it_differs_from_the_default() -> None:
    defaults = {"casignaturealgorithms": ("ssh-ed25519,rsa-sha2-512",)}
    assert not refusals(defaults, defaults)
    assert refusals({"casignaturealgorithms": ("ssh-ed25519",)}, defaults)


@given(st.dictionaries(st.sampled_from(sorted(BY_PRINTED)), st.text(min_size=1), max_size=20))
def test_only_off_only_and_default_only_keywords_are_ever_refused(words: dict[str, str]) -> None:
    """Whatever the values, an honoured or no-effect keyword never refuses a host."""
    found = refusals({k: (v,) for k, v in words.items()}, {})
    for refusal in found:
        rule = BY_PRINTED[refusal.keyword.lower()].rule
        assert rule in (Rule.OFF_ONLY, Rule.DEFAULT_ONLY)


def test_the_readme_shows_the_table() -> None:
    """The README's SSH section holds the table as the code has it, row for row."""
    text = README.read_text()
    block = re.search(r"\| Keyword \| The console \|\n(?:\|.*\|\n)+", text)
    assert block is not None, "the README has no keyword table"
    assert block.group(0).rstrip("\n") == readme_table()


@needs_ssh
def test_a_refused_keyword_names_its_value_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host gpu\n  HostName 127.0.0.1\n  ProxyCommand nc %h %p\n")
    with pytest.raises(SshConfigRefused) as refused:
        read_ssh_config("gpu", config_file=config)
    words = str(refused.value)
    assert "ProxyCommand nc" in words and f"{config} line 3" in words


@needs_ssh
@pytest.mark.parametrize("token", ["%k", "%C", "%h-%p-%r", "${GPUCONSOLE_TEST_KEYS}"])
def test_identity_file_tokens_expand_as_ssh_expands_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    """ssh expands IdentityFile only when it connects; the console asks ssh to expand it the
    same way (through ControlPath, which ssh -G prints expanded)."""
    monkeypatch.setenv("GPUCONSOLE_TEST_KEYS", str(tmp_path))
    config = tmp_path / "config"
    config.write_text(
        f"Host gpu\n  HostName 10.1.2.3\n  Port 2222\n  User alice\n"
        f"  IdentityFile {tmp_path}/keys/{token}\n  ControlPath {tmp_path}/keys/{token}\n"
    )
    done = subprocess.run(
        [SSH or "ssh", "-G", "-F", str(config), "gpu"], capture_output=True, text=True, check=True
    )
    expected = next(
        line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("controlpath")
    )
    settings = read_ssh_config("gpu", config_file=config)
    assert settings.identity_files == (Path(expected),)
    assert "%" not in expected and "$" not in expected
