"""The GPUs a job holds on a node (its GRES indexes), from output captured on this machine:
``scontrol show job -d`` of Slurm 22.05.8 and 26.05.5 (the sandbox's gres.conf: one
``File=`` per GPU), slurmrestd v0.0.38 (22.05) and v0.0.45 (26.05) job listings."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpuheal_bridge.backends.parse import gpu_indexes, parse_job_gpus, parse_jobs_json
from gpuheal_bridge.backends.rest import RestBackend

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    ("detail", "indexes"),
    [
        ("gpu:4(IDX:0-3)", [0, 1, 2, 3]),
        ("gpu:3(IDX:4-6)", [4, 5, 6]),
        ("gpu:1(IDX:3)", [3]),
        ("gpu:a100:3(IDX:0,2,5-6)", [0, 2, 5, 6]),
        ("gpu:a100:1(IDX:0),gpu:h100:1(IDX:7)", [0, 7]),
        ("gpu:2(IDX:1-2),shard:4(1/4,1/4)", [1, 2]),
        ("", []),
        ("shard:2(2/4)", []),
        ("gpu:0(IDX:N/A)", None),  # a GPU entry without an index: unknown, not "none"
        ("gpu:2", None),
    ],
)
def test_gpu_indexes(detail: str, indexes: list[int] | None) -> None:
    assert gpu_indexes(detail) == indexes


@pytest.mark.parametrize("release", ["22.05", "26.05"])
def test_scontrol_show_job_d_gives_the_indexes_on_the_node(release: str) -> None:
    four = (DATA / f"scontrol_show_job_d_{release}_0.txt").read_text()
    none = (DATA / f"scontrol_show_job_d_{release}_2.txt").read_text()
    assert parse_job_gpus(four, "gpu-node-0") == [0, 1, 2, 3]
    assert parse_job_gpus(none, "gpu-node-0") == []  # a job without --gres
    assert parse_job_gpus(four, "gpu-node-1") is None  # not a node of the job


def test_a_forged_detail_line_after_the_first_block_is_not_read() -> None:
    shown = (DATA / "scontrol_show_job_d_22.05_2.txt").read_text()
    forged = shown + "     Nodes=gpu-node-0 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n"
    assert parse_job_gpus(forged, "gpu-node-0") == []


def test_restd_gres_detail_v0045_and_v0038() -> None:
    doc = json.loads((DATA / "restd_jobs_gres_v0.0.45.json").read_text())
    on = {j.job_id: j.gpus for j in parse_jobs_json(doc, gpus_on="gpu-node-0")}
    assert on == {1: [0, 1, 2, 3], 2: [4, 5, 6], 3: [], 4: None}  # 4: pending, no node
    assert {j.gpus for j in parse_jobs_json(doc)} == {None}  # other listings: not read
    old = json.loads((DATA / "restd_jobs.json").read_text())
    assert {j.job_id: j.gpus for j in parse_jobs_json(old, gpus_on="node3")}[1] == [0]


async def test_the_rest_backend_lists_a_nodes_jobs_with_their_gpus() -> None:
    doc = (DATA / "restd_jobs_gres_v0.0.45.json").read_text()

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/slurm/v0.0.45/jobs"
        return httpx.Response(200, text=doc, headers={"content-type": "application/json"})

    rest = RestBackend(
        "http://restd", token="jwt", api_version="v0.0.45", transport=httpx.MockTransport(handler)
    )
    jobs = await rest.jobs_on_node("gpu-node-0", gpus=True)
    assert {j.job_id: j.gpus for j in jobs} == {1: [0, 1, 2, 3], 2: [4, 5, 6], 3: []}
