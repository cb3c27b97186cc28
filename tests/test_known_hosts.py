"""known_hosts lookups decided as OpenSSH decides them, with `ssh-keygen -F` as the judge."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import asyncssh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuconsole.hosts import known_hosts
from gpuconsole.hosts.known_hosts import (
    HostKeys,
    KnownKey,
    append_known_host,
    host_keys,
    known_hosts_line,
    lookup_name,
)

SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
needs_keygen = pytest.mark.skipif(not Path(SSH_KEYGEN).exists(), reason="no ssh-keygen")

ED = asyncssh.generate_private_key("ssh-ed25519")
ED2 = asyncssh.generate_private_key("ssh-ed25519")
EC = asyncssh.generate_private_key("ecdsa-sha2-nistp256")
KEYS = (ED, ED2, EC)


def public(key: asyncssh.SSHKey) -> str:
    """ "TYPE BASE64", as a line carries it."""
    return key.export_public_key().decode().strip()


def write(tmp_path: Path, *lines: str, name: str = "known_hosts") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def lookup(path: Path, name: str) -> HostKeys:
    return host_keys([path], name)


def lines_of(found: tuple[KnownKey, ...]) -> list[int]:
    return [known.line for known in found]


def same(a: asyncssh.SSHKey, b: asyncssh.SSHKey) -> bool:
    return a.public_data == b.public_data


def keygen_find(path: Path, name: str) -> dict[int, str]:
    """The lines `ssh-keygen -F NAME -f FILE` prints as found, with "", "CA" or "REVOKED"."""
    run = subprocess.run(
        [SSH_KEYGEN, "-F", name, "-f", str(path)], capture_output=True, text=True, check=False
    )
    found = re.findall(r"^# Host .* found: line (\d+) ?(\S*)$", run.stdout, re.MULTILINE)
    assert run.returncode == (0 if found else 1), run
    return {int(line): tag for line, tag in found}


# Host name patterns


def test_a_plain_name_matches_only_itself(tmp_path: Path) -> None:
    path = write(
        tmp_path, "# a comment", "", f"gpu07 {public(ED)} root@gpu07", f"gpu08 {public(EC)}"
    )
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [3]
    assert same(keys.keys[0].key, ED)
    assert keys.keys[0].place == f"{path}:3"
    assert keys.keys[0].marker is None
    assert lookup(path, "gpu0").keys == () and lookup(path, "gpu077").keys == ()
    assert keys.skipped == ()


def test_a_port_is_part_of_the_name(tmp_path: Path) -> None:
    path = write(tmp_path, f"[127.0.0.1]:2222 {public(ED)}", f"127.0.0.1 {public(EC)}")
    with_port = lookup(path, lookup_name("127.0.0.1", 2222, None))
    assert with_port.name == "[127.0.0.1]:2222"
    assert lines_of(with_port.keys) == [1]
    assert lines_of(lookup(path, lookup_name("127.0.0.1", 22, None)).keys) == [2]
    assert lookup(path, "[127.0.0.1]:2223").keys == ()


@pytest.mark.parametrize(
    ("pattern", "name", "applies"),
    [
        ("*.lab", "gpu07.lab", True),
        ("*.lab", "gpu07.lab.x", False),
        ("gpu?", "gpu7", True),
        ("gpu?", "gpu07", False),
        ("gpu??", "gpu07", True),
        ("*", "anything", True),
        ("[10.0.0.*]:2222", "[10.0.0.7]:2222", True),
        ("[10.0.0.*]:2222", "[10.0.0.7]:22", False),
        ("[10.0.0.7]:*", "[10.0.0.7]:2200", True),
        ("g*u*7", "gpu07", True),
        ("a,b,gpu07", "gpu07", True),
        ("gpu07,", "gpu07", True),
        (",gpu07", "gpu07", True),
    ],
)
def test_wildcards(tmp_path: Path, pattern: str, name: str, applies: bool) -> None:
    path = write(tmp_path, f"{pattern} {public(ED)}")
    assert bool(lookup(path, name).keys) is applies


@pytest.mark.parametrize("patterns", ["gpu*,!gpu13", "!gpu13,gpu*", "gpu13,!gpu1?", "!*,gpu13"])
def test_a_negated_pattern_beats_any_positive_one(tmp_path: Path, patterns: str) -> None:
    path = write(tmp_path, f"{patterns} {public(ED)}")
    assert lookup(path, "gpu13").keys == ()


def test_negation_alone_never_matches(tmp_path: Path) -> None:
    path = write(tmp_path, f"!gpu13 {public(ED)}", f"gpu*,!gpu13 {public(EC)}")
    assert lines_of(lookup(path, "gpu12").keys) == [2]


def test_matching_folds_case(tmp_path: Path) -> None:
    path = write(tmp_path, f"GPU07.Lab {public(ED)}", f"*.LAB {public(EC)}")
    assert lines_of(lookup(path, "gpu07.lab").keys) == [1, 2]
    assert lines_of(lookup(path, "GpU07.lAB").keys) == [1, 2]


def test_a_long_run_of_stars_is_fast(tmp_path: Path) -> None:
    path = write(tmp_path, f"{'*a' * 40}b {public(ED)}", f"{'a' * 300} {public(EC)}")
    started = time.monotonic()
    keys = lookup(path, "a" * 300)
    assert time.monotonic() - started < 1.0
    assert lines_of(keys.keys) == [2]


def test_a_pattern_longer_than_openssh_reads_ends_the_list_unmatched(tmp_path: Path) -> None:
    longest = "a" * 1022  # OpenSSH's 1024-byte buffer holds this much of one pattern
    path = write(
        tmp_path,
        f"gpu07,{longest} {public(ED)}",
        f"gpu07,{longest}a {public(ED)}",  # the too-long pattern undoes gpu07's match
        f"!{longest} {public(ED)}",
        f"{longest} {public(ED)}",
        f"{longest}a {public(ED)}",
    )
    assert lines_of(lookup(path, "gpu07").keys) == [1]
    assert lines_of(lookup(path, longest).keys) == [1, 4]
    assert lines_of(lookup(path, longest + "a").keys) == []


# Hashed names


def test_a_hashed_line_matches_its_name_only(tmp_path: Path) -> None:
    line = known_hosts_line("gpu07", ED, hashed=True)
    assert re.fullmatch(r"\|1\|[A-Za-z0-9+/]{27}=\|[A-Za-z0-9+/]{27}= ssh-ed25519 \S+\n", line)
    assert "gpu07" not in line
    assert line != known_hosts_line("gpu07", ED, hashed=True)  # a new salt each time
    path = tmp_path / "known_hosts"
    path.write_text(line)
    assert lines_of(lookup(path, "gpu07").keys) == [1]
    assert lookup(path, "gpu08").keys == ()
    assert same(lookup(path, "gpu07").keys[0].key, ED)


@needs_keygen
def test_openssh_finds_our_lines(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(
        known_hosts_line("[10.0.0.7]:2222", ED, hashed=True)
        + known_hosts_line("gpu07", EC, hashed=False)
    )
    assert keygen_find(path, "[10.0.0.7]:2222") == {1: ""}
    assert keygen_find(path, "gpu07") == {2: ""}
    assert keygen_find(path, "gpu08") == {}


@needs_keygen
def test_lines_hashed_by_ssh_keygen(tmp_path: Path) -> None:
    path = write(tmp_path, f"gpu07,10.0.0.7 {public(ED)}", f"GPU08 {public(EC)}", "# end")
    subprocess.run([SSH_KEYGEN, "-H", "-f", str(path)], capture_output=True, check=True)
    text = path.read_text()
    assert "gpu07" not in text and text.count("|1|") == 3
    for name, key in [("gpu07", ED), ("10.0.0.7", ED), ("gpu08", EC)]:
        keys = lookup(path, name)
        assert len(keys.keys) == 1 and same(keys.keys[0].key, key), name
    assert lookup(path, "gpu09").keys == ()


@pytest.mark.parametrize(
    "field",
    ["|2|abc|def", "|1|", "|1|abc", "|1||def", "|1|c2FsdA==|def", "|1|!!!!|def", "|"],
)
def test_a_malformed_hashed_name_is_a_skipped_line(tmp_path: Path, field: str) -> None:
    path = write(tmp_path, f"{field} {public(ED)}", f"gpu07 {public(EC)}")
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [2]
    assert len(keys.skipped) == 1 and keys.skipped[0].startswith(f"{path}:1: ")


def test_a_hashed_field_followed_by_another_name_never_matches(tmp_path: Path) -> None:
    hashed = known_hosts_line("gpu07", ED, hashed=True).split()[0]
    path = write(tmp_path, f"{hashed},gpu07 {public(ED)}")
    assert lookup(path, "gpu07").keys == ()


# ssh-keygen -F as the judge

NAME_CHARS = "abA1.:[]"
names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=6)
patterns = st.text(alphabet=NAME_CHARS + "*?!", max_size=6)


@st.composite
def known_hosts_files(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """Lines of plain pattern lists, hashed names, markers good and bad; and names to look up,
    some of them those the lines name."""
    wanted = draw(st.lists(names, min_size=1, max_size=3))
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["patterns", "patterns", "hashed", "malformed"]))
        if kind == "hashed":
            name = draw(st.sampled_from(wanted) | names)
            field = known_hosts_line(name, ED, hashed=True).split()[0]
        elif kind == "malformed":
            field = draw(st.sampled_from(["|1|abc|def", "|x", "|1|" + "A" * 28 + "|x"]))
        else:
            field = ",".join(draw(st.lists(st.sampled_from(wanted) | patterns, max_size=3)))
        marker = draw(st.sampled_from(["", "", "@revoked ", "@cert-authority ", "@bogus "]))
        blank = draw(st.sampled_from([" ", "\t", "  "]))
        lines.append(f"{marker}{field}{blank}{public(draw(st.sampled_from(KEYS)))}")
    return lines, wanted


@needs_keygen
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(known_hosts_files())
def test_host_keys_finds_what_ssh_keygen_finds(case: tuple[list[str], list[str]]) -> None:
    lines, wanted = case
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), *lines)
        for name in wanted:
            keys = lookup(path, name)
            ours = {known.line: "" for known in keys.keys}
            ours |= {known.line: "CA" for known in keys.authorities}
            ours |= {known.line: "REVOKED" for known in keys.revoked}
            assert ours == keygen_find(path, name), (name, lines)


def _reference_glob(name: str, pattern: str) -> bool:
    """OpenSSH's `match_pattern`, written as its recursive definition."""
    if not pattern:
        return not name
    if pattern[0] == "*":
        return any(_reference_glob(name[i:], pattern[1:]) for i in range(len(name) + 1))
    if not name:
        return False
    return pattern[0] in ("?", name[0]) and _reference_glob(name[1:], pattern[1:])


@given(st.text(alphabet="ab", max_size=8), st.text(alphabet="ab*?", max_size=8))
def test_the_linear_glob_is_openssh_s_glob(name: str, pattern: str) -> None:
    assert known_hosts._glob_match(name.encode(), pattern.encode()) is _reference_glob(
        name, pattern
    )


# Markers


def test_a_revoked_key_is_never_trusted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"gpu07 {public(ED)}",
        f"gpu07 {public(EC)}",
        f"@revoked * {public(ED)}",
    )
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [1, 2]
    assert lines_of(keys.trusted()) == [2]
    entry = keys.revoked_entry(ED)
    assert entry is not None and entry.place == f"{path}:3" and entry.marker == "@revoked"
    assert keys.revoked_entry(EC) is None
    assert keys.revoked_entry(ED.convert_to_public()) is entry


def test_a_revoked_line_in_another_file_counts_too(tmp_path: Path) -> None:
    user = write(tmp_path, f"gpu07 {public(ED)}", name="user")
    system = write(tmp_path, f"@revoked gpu0? {public(ED)}", name="system")
    keys = host_keys([user, system], "gpu07")
    assert keys.trusted() == ()
    assert keys.revoked_entry(ED) is not None and keys.revoked_entry(ED).path == system


def test_a_cert_authority_line_is_an_authority_not_a_key(tmp_path: Path) -> None:
    path = write(tmp_path, f"@cert-authority *.lab {public(EC)}", f"gpu07.lab {public(ED)}")
    keys = lookup(path, "gpu07.lab")
    assert lines_of(keys.authorities) == [1] and keys.authorities[0].marker == "@cert-authority"
    assert same(keys.authorities[0].key, EC)
    assert lines_of(keys.keys) == [2]
    assert lookup(path, "gpu07.other").authorities == ()


def test_same_type_is_the_trusted_keys_of_the_presented_type(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"gpu07 {public(ED)}",
        f"gpu07 {public(EC)}",
        f"gpu07 {public(ED2)}",
        f"@revoked gpu07 {public(ED2)}",
    )
    keys = lookup(path, "gpu07")
    other = asyncssh.generate_private_key("ssh-ed25519")
    assert lines_of(keys.same_type(other)) == [1]
    assert lines_of(keys.same_type(asyncssh.generate_private_key("ecdsa-sha2-nistp256"))) == [2]
    assert keys.same_type(asyncssh.generate_private_key("ecdsa-sha2-nistp384")) == ()


def test_rsa_signature_algorithm_names_read_as_an_rsa_key(tmp_path: Path) -> None:
    rsa = asyncssh.generate_private_key("ssh-rsa", key_size=1024)
    blob = public(rsa).split()[1]
    path = write(tmp_path, f"gpu07 rsa-sha2-512 {blob}", f"gpu07 rsa-sha2-256 {public(ED)[12:]}")
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [1] and same(keys.keys[0].key, rsa)
    assert len(keys.skipped) == 1  # an ed25519 blob is not an RSA key
    assert lines_of(keys.same_type(rsa)) == [1]


# Lines that cannot be read


def test_bad_lines_are_skipped_and_the_rest_still_counts(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    ed, ec = public(ED).encode(), public(EC).encode()
    path.write_bytes(
        b"\n".join(
            [
                b"complete garbage",  # 1: names no host we look up
                b"gpu07",  # 2: no key
                b"gpu07 ssh-ed25519",  # 3: no blob
                b"gpu07 ssh-ed25519 !!!!notbase64",  # 4
                b"gpu07 ssh-ed25519 " + ec.split()[1],  # 5: type and key differ
                b"gpu07 ssh-nope " + ed.split()[1],  # 6: no such type
                b"gpu07 \xff\xfe " + ed.split()[1],  # 7: not UTF-8
                b"gpu\xff07 " + ed,  # 8: not UTF-8, never matches
                b"gpu07 " + ed + b" \xc3\x28 comment",  # 9: good, bad UTF-8 in the comment
                b"gpu07 " + ed + b" " + b"x" * 100_000,  # 10: too long
                b"@bogus gpu07 " + ed,  # 11: unknown marker
                b"@revoked @revoked gpu07 " + ed,  # 12: two markers
                b"gpu07 #" + ed,  # 13: the key is a comment
                b"   # indented comment",  # 14
                b"gpu07 " + ec,  # 15: good
                b"",
            ]
        )
    )
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [9, 15]
    assert keys.revoked == ()
    assert [reason.split(": ")[0] for reason in keys.skipped] == [
        f"{path}:{n}" for n in (2, 3, 4, 5, 6, 7, 10, 11, 12, 13)
    ]
    assert "unknown marker" in keys.skipped[7]


def test_a_nul_byte_ends_the_line_and_crlf_and_tabs_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    ed, ec = public(ED).encode(), public(EC).encode()
    path.write_bytes(
        b"gpu07 " + ed + b"\0 garbage\n"
        b"gpu07\t" + ec.replace(b" ", b"\t") + b"\r\n"
        b"  \t@revoked\tgpu07\t" + ed.replace(b" ", b"\t") + b"\r\n"
    )
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [1, 2] and lines_of(keys.revoked) == [3]
    assert keys.skipped == ()


@needs_keygen
def test_a_marker_ends_at_the_first_space_of_the_line(tmp_path: Path) -> None:
    # OpenSSH's check_markers looks for a space first, and for a tab only if the line has none
    tabbed = public(ED).replace(" ", "\t")
    path = write(tmp_path, f"@revoked\tgpu07 {public(ED)}", f"@revoked\tgpu07\t{tabbed}")
    keys = lookup(path, "gpu07")
    assert lines_of(keys.revoked) == [2]
    assert [reason.split(": ")[0] for reason in keys.skipped] == [f"{path}:1"]
    assert keygen_find(path, "gpu07") == {2: "REVOKED"}


def test_skipped_reasons_are_bounded(tmp_path: Path) -> None:
    path = write(tmp_path, *(["@bogus gpu07 x y"] * 50), f"gpu07 {public(ED)}")
    keys = lookup(path, "gpu07")
    assert len(keys.skipped) == known_hosts.MAX_SKIPPED
    assert lines_of(keys.keys) == [51]


def test_missing_files_are_no_lines(tmp_path: Path) -> None:
    present = write(tmp_path, f"gpu07 {public(ED)}")
    keys = host_keys([tmp_path / "absent", tmp_path / "no" / "folder", present], "gpu07")
    assert lines_of(keys.keys) == [1] and keys.skipped == ()


def test_what_is_not_a_regular_file_is_skipped_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    keys = host_keys([fifo, tmp_path, Path("/dev/zero")], "gpu07")
    assert keys.keys == ()
    assert [reason.split(": ")[0] for reason in keys.skipped] == [
        str(fifo),
        str(tmp_path),
        "/dev/zero",
    ]
    assert "FIFO" in keys.skipped[0] and "folder" in keys.skipped[1]


def test_a_file_that_fails_to_read_is_skipped_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, f"gpu07 {public(ED)}")
    other = write(tmp_path, f"gpu07 {public(EC)}", name="other")

    def failing_read(fd: int, size: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(known_hosts.os, "read", failing_read)
    keys = host_keys([path, other], "gpu07")
    assert keys.keys == ()
    assert keys.skipped == (
        f"{path}: cannot be read: Input/output error",
        f"{other}: cannot be read: Input/output error",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_skipped_with_a_reason(tmp_path: Path) -> None:
    path = write(tmp_path, f"gpu07 {public(ED)}")
    path.chmod(0)
    keys = lookup(path, "gpu07")
    assert keys.keys == () and keys.skipped[0].startswith(f"{path}: not read")


def test_only_the_first_bytes_of_a_huge_file_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = f"gpu07 {public(ED)}\n"
    second = f"gpu07 {public(EC)}\n"
    path = tmp_path / "known_hosts"
    path.write_text(first + second + f"gpu07 {public(ED2)}\n")
    monkeypatch.setattr(known_hosts, "MAX_KNOWN_HOSTS_BYTES", len(first) + len(second) - 5)
    keys = lookup(path, "gpu07")
    assert lines_of(keys.keys) == [1]  # the cut second line is dropped, not misread
    assert keys.skipped == (
        f"{path}: larger than {len(first) + len(second) - 5} bytes: only the first lines were read",
    )


# Names and lines


@pytest.mark.parametrize(
    ("host", "port", "alias", "name"),
    [
        ("GPU07.Lab", 22, None, "gpu07.lab"),
        ("gpu07", 2222, None, "[gpu07]:2222"),
        ("10.0.0.7", 2222, None, "[10.0.0.7]:2222"),
        ("::1", 2200, None, "[::1]:2200"),
        ("gpu07", 0, None, "gpu07"),
        ("gpu07", 2222, "node-a", "node-a"),
        ("gpu07", 22, "Node-A", "node-a"),  # ssh lowercases HostKeyAlias too
    ],
)
def test_lookup_name(host: str, port: int, alias: str | None, name: str) -> None:
    assert lookup_name(host, port, alias) == name


def test_known_hosts_line_plain() -> None:
    assert known_hosts_line("[gpu07]:2222", ED, hashed=False) == f"[gpu07]:2222 {public(ED)}\n"


@pytest.mark.parametrize("name", ["", "gpu 07", "gpu07\n", "a,b", "gpu*", "!gpu07", "#x", "|1|"])
def test_known_hosts_line_refuses_names_that_would_not_read_back(name: str) -> None:
    with pytest.raises(ValueError):
        known_hosts_line(name, ED, hashed=False)


def test_append_creates_a_private_folder_and_file(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ssh" / "known_hosts"
    old = os.umask(0)
    try:
        append_known_host(path, known_hosts_line("gpu07", ED, hashed=False))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"gpu07 {public(ED)}\n"


def test_append_keeps_what_is_there_and_ends_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"gpu07 {public(ED)}")  # no final newline
    path.chmod(0o644)
    append_known_host(path, known_hosts_line("gpu08", EC, hashed=False))
    append_known_host(path, f"gpu09 {public(ED2)}")  # no newline given
    assert path.read_text() == f"gpu07 {public(ED)}\ngpu08 {public(EC)}\ngpu09 {public(ED2)}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # an existing file keeps its mode
    assert lines_of(lookup(path, "gpu08").keys) == [2]


def test_append_to_an_empty_file_adds_no_blank_line(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.touch()
    append_known_host(path, "gpu07 " + public(ED) + "\n")
    assert path.read_text() == f"gpu07 {public(ED)}\n"


def test_append_refuses_what_is_not_a_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        append_known_host(fifo, "gpu07 " + public(ED))
    with pytest.raises(ValueError):
        append_known_host(tmp_path / "known_hosts", "gpu07 x\ngpu08 y\n")
