"""Pure helpers of the operator benchmarks (bench/opkit.py): parsing and statistics."""

from __future__ import annotations

import math

import pytest
from bench.opkit import (
    abba,
    classify_request,
    collapsed_top,
    first_at_least,
    fit_line,
    metric_sum,
    paired,
    parse_proc_stat_cpu,
    parse_proc_status,
    parse_prometheus,
    pstats,
    sustained_rate,
)

PROM = """\
# HELP gpuheal_breaker_open 1 while open
# TYPE gpuheal_breaker_open gauge
gpuheal_breaker_open{policy="a"} 1.0
gpuheal_breaker_open{policy="b"} 0.0
gpuheal_nodes_watched 1000.0
gpuheal_bench_api_requests_total{resource="nodes",verb="watch"} 2.0
gpuheal_bench_api_requests_total{resource="leases",verb="put"} 5.0
process_cpu_seconds_total 3.5
"""


def test_parse_prometheus_and_sum_by_labels() -> None:
    m = parse_prometheus(PROM, "gpuheal_")
    assert "process_cpu_seconds_total" not in m
    assert m["gpuheal_nodes_watched"] == 1000.0
    assert metric_sum(m, "gpuheal_breaker_open", policy="a") == 1.0
    assert metric_sum(m, "gpuheal_breaker_open") == 1.0
    assert metric_sum(m, "gpuheal_bench_api_requests_total") == 7.0
    assert metric_sum(m, "gpuheal_bench_api_requests_total", verb="put") == 5.0
    assert metric_sum(m, "gpuheal_breaker") == 0.0  # exact names only


def test_proc_status_and_stat() -> None:
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n"
    assert parse_proc_status(status) == {"VmHWM": 204800, "VmRSS": 102400}
    # comm with a space and a parenthesis; utime=7, stime=3 are fields 14 and 15
    stat = "123 (py (x) y) S 1 2 3 4 5 6 7 8 9 10 7 3 0 0 20 0 4 0 100"
    assert parse_proc_stat_cpu(stat) == 10.0


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "https://h/api/v1/nodes?limit=500", ("list", "nodes")),
        ("GET", "https://h/api/v1/nodes?watch=true&resourceVersion=5", ("watch", "nodes")),
        ("GET", "https://h/api/v1/nodes/gpu-node-1", ("get", "nodes")),
        ("PATCH", "https://h/api/v1/nodes/gpu-node-1", ("patch", "nodes")),
        ("POST", "https://h/api/v1/namespaces/bench/pods/p/eviction", ("post", "pods/eviction")),
        ("GET", "https://h/api/v1/namespaces/ns/events?watch=1", ("watch", "events")),
        ("GET", "https://h/api/v1/events?fieldSelector=x", ("list", "events")),
        (
            "PUT",
            "https://h/apis/coordination.k8s.io/v1/namespaces/d/leases/gpuheal-operator",
            ("put", "leases"),
        ),
        (
            "PATCH",
            "https://h/apis/gpuheal.io/v1alpha1/noderemediations/n/status",
            ("patch", "noderemediations/status"),
        ),
        (
            "GET",
            "https://h/apis/gpuheal.io/v1alpha1/remediationpolicies",
            ("list", "remediationpolicies"),
        ),
    ],
)
def test_classify_request(method: str, url: str, expected: tuple[str, str]) -> None:
    assert classify_request(method, url) == expected


def test_sustained_rate_stops_at_first_level_over_the_limit() -> None:
    levels = [
        {"achieved_rate": 100.0, "lag_p99": 0.05},
        {"achieved_rate": 198.0, "lag_p99": 0.4},
        {"achieved_rate": 390.0, "lag_p99": 1.7},
        {"achieved_rate": 700.0, "lag_p99": 0.2},  # after a failure: not counted
    ]
    assert sustained_rate(levels) == 198.0
    assert sustained_rate(levels[2:]) is None
    assert sustained_rate([]) is None


def test_first_at_least_and_pstats() -> None:
    assert first_at_least([(1.0, 0.0), (2.0, 1.0), (3.0, 1.0)], 1.0) == 2.0
    assert first_at_least([(1.0, 0.0)], 1.0) is None
    s = pstats([0.1, 0.2, 0.3, 0.4])
    assert s["n"] == 4
    assert s["max"] == 0.4
    assert s["p50"] is not None
    assert math.isclose(s["p50"], 0.25)
    assert pstats([])["p50"] is None


def test_fit_line_recovers_a_line_and_reports_residuals() -> None:
    fit = fit_line([1000, 5000, 10000], [80.0, 88.0, 98.0])
    # 80 + 0.002x would give 80, 88, 98; least squares through the three points:
    assert fit["b"] == pytest.approx(0.0020, abs=1e-4)
    assert sum(fit["residuals"]) == pytest.approx(0.0, abs=1e-9)
    assert fit["max_abs_residual"] < 0.5
    exact = fit_line([0, 10], [5.0, 25.0])
    assert (exact["a"], exact["b"]) == (pytest.approx(5.0), pytest.approx(2.0))
    with pytest.raises(ValueError, match="two or more distinct x"):
        fit_line([1000, 1000], [1.0, 2.0])


def test_collapsed_top_counts_self_and_inclusive_gpuheal_frames() -> None:
    raw = (
        "run (asyncio/base_events.py:1);_run_once (asyncio/base_events.py:2);"
        "select (selectors.py:3) 50\n"
        "run (asyncio/base_events.py:1);signal (gpuheal/remediation/intake.py:9);"
        "model_validate (pydantic/main.py:5) 30\n"
        "run (asyncio/base_events.py:1);signal (gpuheal/remediation/intake.py:9) 20\n"
        "garbage\n"
    )
    top = collapsed_top(raw, n=2)
    assert top["samples"] == 100
    assert top["self"] == [
        ("select (selectors.py:3)", 50),
        ("model_validate (pydantic/main.py:5)", 30),
    ]
    assert top["gpuheal_inclusive"] == [("signal (gpuheal/remediation/intake.py:9)", 50)]


def test_abba_alternates_who_goes_first() -> None:
    assert abba("base", "new", 3) == ["base", "new", "new", "base", "base", "new"]
    assert abba("base", "new", 0) == []


def test_paired_differences_count_the_pairs_the_second_won() -> None:
    out = paired([1.5, 1.2, 2.0, 1.0], [1.0, 1.4, 1.5, 1.0])
    assert out["pairs"] == 4
    assert out["diffs"] == [-0.5, 0.2, -0.5, 0.0]
    assert out["median_diff"] == -0.25
    assert out["b_lower"] == 2
    assert (out["median_a"], out["median_b"]) == (1.35, 1.2)
    assert paired([], [])["median_diff"] is None
    with pytest.raises(ValueError, match="shorter"):  # a pair without its other half
        paired([1.0], [])
