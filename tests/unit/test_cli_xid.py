"""`gpuheal xid parse` over files as they are found on nodes: rotated (.gz), cut by a crash
(NULs, half characters, a truncated .gz), missing; and `xid explain`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuheal.cli import main

XID_79 = "[ 99.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
XID_94 = (
    "Nov 23 10:00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:86:00): 94, pid=12345, name=python, "
    "Contained: CE User Channel (0x9). RST: No, D-RST: No\n"
)


def _records(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_files_in_order_rotated_ones_decompressed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = tmp_path / "kern.log.2.gz"
    older.write_bytes(gzip.compress(XID_94.encode()))
    current = tmp_path / "kern.log"
    current.write_bytes(b"\x00\x00\x00" + b"name=\xff\xfe\n" + XID_79.encode())
    assert main(["xid", "parse", str(older), str(current)]) == 0
    found = _records(capsys.readouterr().out)
    assert [(r["xid"], r["pci"], r["pid"]) for r in found] == [
        (94, "0000:86:00", 12345),
        (79, "0000:3b:00", 1234),
    ]
    assert found[0]["process"] == "python"


def test_a_missing_file_or_a_truncated_gz_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["xid", "parse", str(tmp_path / "nope.log")]) == 1
    assert capsys.readouterr().err == (
        f"error: cannot read {tmp_path / 'nope.log'}: No such file or directory\n"
    )
    cut = tmp_path / "kern.log.1.gz"
    cut.write_bytes(gzip.compress((XID_79 * 2000).encode())[:400])
    assert main(["xid", "parse", str(cut)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: cannot read {cut}: ")
    assert all(r["xid"] == 79 for r in _records(captured.out))  # what came before it stands


def test_explain_names_the_class_and_the_first_sight(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "explain", "79"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("XID 79: ")
    assert "gpuheal class:" in text
    assert "first sight:" in text


def test_stdin_is_read_as_bytes_whatever_the_locale(tmp_path: Path) -> None:
    import subprocess
    import sys

    data = b"name=\xff\xfe\n" + XID_79.encode()
    probe = (
        "import io, sys; "
        "sys.stdin = io.TextIOWrapper(sys.stdin.buffer, encoding='utf-8', errors='strict'); "
        "from gpuheal.cli import main; sys.exit(main(['xid', 'parse']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], input=data, capture_output=True, timeout=60, check=True
    )
    assert [r["xid"] for r in _records(out.stdout.decode())] == [79]
