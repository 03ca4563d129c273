from __future__ import annotations

import hostlist as reference
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal_bridge.api.names import (
    InvalidName,
    node_name_problem,
    validate_job_id,
    validate_node_name,
)
from gpuheal_bridge.hostlist import MAX_EXPANSION, HostlistError, expand


@pytest.mark.parametrize(
    ("expr", "nodes"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,5],gpu7", ["node1", "node2", "node5", "gpu7"]),
        ("gpu-a[08-10]", ["gpu-a08", "gpu-a09", "gpu-a10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[1-2]b[3-4]c", ["a1b3c", "a1b4c", "a2b3c", "a2b4c"]),
        ("n[8-11],m[007]", ["n8", "n9", "n10", "n11", "m007"]),
        ("", []),
        (None, []),
        ("(null)", []),
    ],
)
def test_expand(expr: str | None, nodes: list[str]) -> None:
    assert expand(expr) == nodes


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[a-b]", "node[3-1]"])
def test_expand_rejects(bad: str) -> None:
    with pytest.raises((HostlistError, ValueError)):
        expand(bad)


def test_expand_refuses_a_huge_range() -> None:
    with pytest.raises(HostlistError, match="bad range"):
        expand(f"node[1-{MAX_EXPANSION + 2}]")


_number = st.integers(0, 120)
_range = st.one_of(
    _number.map(str),
    st.tuples(_number, st.integers(0, 30), st.sampled_from([0, 2, 3])).map(
        lambda t: f"{t[0]:0{t[2]}d}-{t[0] + t[1]:0{t[2]}d}"
    ),
)
_group = st.lists(_range, min_size=1, max_size=3).map(lambda rs: "[" + ",".join(rs) + "]")
_prefix = st.from_regex(r"[a-z][a-z0-9-]{0,5}[a-z-]", fullmatch=True)
_term = st.tuples(
    _prefix, _group, st.sampled_from(["", "-", "gpu"]), st.one_of(st.just(""), _group)
)
_expr = st.lists(_term.map("".join), min_size=1, max_size=3).map(",".join)


@given(_expr)
def test_expand_agrees_with_python_hostlist(expr: str) -> None:
    """The LLNL/NSC reference implementation as an oracle: nested-in-order groups, zero
    padding, several groups per name, several names per list."""
    assert expand(expr) == reference.expand_hostlist(expr, allow_duplicates=True)


@given(st.lists(st.integers(0, 500), min_size=1, max_size=30, unique=True))
def test_expand_ranges_roundtrip(numbers: list[int]) -> None:
    numbers.sort()
    ranges: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        ranges.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    assert expand(f"gpu[{','.join(ranges)}]") == [f"gpu{n}" for n in numbers]


@pytest.mark.parametrize(
    "name", ["node1", "gpu-7.example.com", "a", "ip-10-0-0-1.ec2.internal", "n_1", "X" * 253]
)
def test_valid_node_names(name: str) -> None:
    assert validate_node_name(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("node1;reboot", "';'"),
        ("node[1-100]", "hostlist"),
        ("node1,node2", "hostlist"),
        ("node 1", "whitespace"),
        ("-rf", "start with"),
        ("NodeName=x", "'='"),
        ("", "empty"),
        ("n" * 254, "longer"),
        ("nöde", "'ö'"),
        ("node1$(id)", "'$'"),
    ],
)
def test_invalid_node_names_say_why(name: str, why: str) -> None:
    problem = node_name_problem(name)
    assert problem is not None
    assert why in problem
    with pytest.raises(InvalidName):
        validate_node_name(name)


@given(st.text(max_size=80))
def test_accepted_names_are_safe_for_a_slurm_command_line(name: str) -> None:
    if node_name_problem(name) is None:
        assert name[0].isalnum()
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    else:
        with pytest.raises(InvalidName):
            validate_node_name(name)


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,60}", fullmatch=True))
def test_grammar_names_accepted(name: str) -> None:
    assert validate_node_name(name) == name


@pytest.mark.parametrize(("text", "value"), [("1", 1), ("4294967293", 4294967293), (7, 7)])
def test_job_ids(text: str | int, value: int) -> None:
    assert validate_job_id(text) == value


@pytest.mark.parametrize(
    "bad", ["0", "-1", "abc", "12_3", "1 2", "4294967294", "99999999999", "01", ""]
)
def test_bad_job_ids(bad: str) -> None:
    with pytest.raises(InvalidName):
        validate_job_id(bad)
