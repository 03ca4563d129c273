"""The demo training job without Slurm: determinism, resume, signals, atomic checkpoints."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from gpuheal_dev.demo_job import (
    CheckpointMismatch,
    ModelConfig,
    Outcome,
    RunConfig,
    read_records,
    render_sbatch,
    split_runs,
    steps_lost,
    train,
)
from gpuheal_dev.demo_job import checkpoint as ckpt
from gpuheal_dev.demo_job.metrics import MetricsTail, describe, parse_records
from gpuheal_dev.demo_job.model import batch_indices
from gpuheal_dev.demo_job.slurm import parse_job

CFG = ModelConfig(seed=3, n_samples=512, hidden=16)


def fit(cfg: ModelConfig, run: RunConfig, env: dict[str, str] | None = None) -> Outcome:
    """``train`` without output, signal handlers or inherited Slurm variables."""
    return train(cfg, run, env=env or {}, say=lambda _m: None, handle_signals=False)


def run_cfg(workdir: Path, steps: int, ckpt_every: int = 10) -> RunConfig:
    return RunConfig(workdir=workdir, steps=steps, ckpt_every=ckpt_every)


def model(workdir: Path) -> dict[str, np.ndarray]:
    with np.load(workdir / "model.npz", allow_pickle=False) as z:
        return {k: z[k].copy() for k in z.files if k != "meta"}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k, value in a.items():
        assert np.array_equal(value, b[k]), k


@pytest.fixture
def reference(tmp_path: Path) -> dict[str, np.ndarray]:
    out = fit(CFG, run_cfg(tmp_path / "ref", 60))
    assert out.exit_code == 0
    return model(tmp_path / "ref")


def test_it_learns(tmp_path: Path) -> None:
    fit(CFG, run_cfg(tmp_path, 60))
    runs = split_runs(read_records(tmp_path / "metrics.jsonl"))
    [run] = runs
    assert [r["step"] for r in run.steps] == list(range(1, 61))
    assert run.end is not None
    assert run.end["event"] == "done"
    assert run.end["loss"] < run.steps[0]["loss"]


def test_data_order_is_a_function_of_seed_and_step() -> None:
    assert np.array_equal(batch_indices(CFG, 5), batch_indices(CFG, 5))
    assert not np.array_equal(batch_indices(CFG, 5), batch_indices(CFG, 6))
    assert len(set(batch_indices(CFG, 5).tolist())) == CFG.batch_size


def test_resume_is_bit_identical(tmp_path: Path, reference: dict[str, np.ndarray]) -> None:
    work = tmp_path / "w"
    first = fit(CFG, run_cfg(work, 37))
    assert first.step == 37
    (work / "model.npz").unlink()  # as if killed: only checkpoints remain (last one at 37)
    env = {"SLURM_RESTART_COUNT": "1", "SLURMD_NODENAME": "gpu-node-1", "SLURM_JOB_ID": "9"}
    second = fit(CFG, run_cfg(work, 60), env)
    assert (second.resume_step, second.restart, second.exit_code) == (37, 1, 0)
    assert_same(model(work), reference)
    runs = split_runs(read_records(work / "metrics.jsonl"))
    assert [(r.restart, r.host) for r in runs][1] == (1, "gpu-node-1")
    assert runs[1].start["job_id"] == "9"


def test_resume_from_interval_checkpoint_recomputes_lost_steps(
    tmp_path: Path, reference: dict[str, np.ndarray]
) -> None:
    work = tmp_path / "w"
    fit(CFG, run_cfg(work, 37))
    (work / "model.npz").unlink()
    newest = ckpt.list_checkpoints(work)[0][1]
    assert newest.name == "step-00000037.npz"
    newest.unlink()  # a hard kill: the last interval checkpoint (30) is what is left
    out = fit(CFG, run_cfg(work, 60))
    assert out.resume_step == 30
    assert steps_lost(split_runs(read_records(work / "metrics.jsonl"))) == [7]
    assert_same(model(work), reference)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGUSR1, 0)])
def test_signal_checkpoints_at_once(
    tmp_path: Path, reference: dict[str, np.ndarray], sig: signal.Signals, code: int
) -> None:
    work = tmp_path / "w"
    calls = 0

    def clock() -> float:  # sends the signal to ourselves while step 12 is logged
        nonlocal calls
        calls += 1
        if calls == 14:
            os.kill(os.getpid(), sig)
        return 1000.0 + calls

    out = train(CFG, run_cfg(work, 60), env={}, say=lambda _m: None, clock=clock)
    assert out.exit_code == code
    recs = read_records(work / "metrics.jsonl")
    [saved] = [r for r in recs if r["event"] == "checkpoint" and r["reason"] == sig.name]
    [got] = [r for r in recs if r["event"] == "signal"]
    assert saved["step"] == got["step"] == 12  # the step during which it arrived
    if sig == signal.SIGTERM:
        assert out.step == 12
        assert recs[-1]["event"] == "exit"
        assert not (work / "model.npz").exists()
        out = fit(CFG, run_cfg(work, 60))
        assert out.resume_step == 12
    assert_same(model(work), reference)


def test_restart_after_done_trains_nothing(tmp_path: Path) -> None:
    fit(CFG, run_cfg(tmp_path, 20))
    again = fit(CFG, run_cfg(tmp_path, 20))
    assert (again.reason, again.step) == ("already done", 20)


def test_other_config_refuses_to_resume(tmp_path: Path) -> None:
    fit(CFG, run_cfg(tmp_path, 10, ckpt_every=5))
    (tmp_path / "model.npz").unlink()
    with pytest.raises(CheckpointMismatch):
        fit(ModelConfig(seed=4, n_samples=512, hidden=16), run_cfg(tmp_path, 20))


def test_damaged_newest_checkpoint_falls_back(tmp_path: Path) -> None:
    fit(CFG, run_cfg(tmp_path, 20))
    (step20, p20), (step10, _) = ckpt.list_checkpoints(tmp_path)
    assert (step20, step10) == (20, 10)
    p20.write_bytes(p20.read_bytes()[:100])
    found = ckpt.load_latest(tmp_path, CFG)
    assert found is not None
    assert found[0].step == 10


def test_failed_write_leaves_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit(CFG, run_cfg(tmp_path, 10))
    state, _ = ckpt.load_latest(tmp_path, CFG) or pytest.fail("no checkpoint")
    state.step = 11
    state.losses.append(0.0)

    def boom(*_a: object, **_k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, state)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000010.npz"]
    found = ckpt.load_latest(tmp_path, CFG)
    assert found is not None
    assert found[0].step == 10


def test_keeps_only_newest_checkpoints(tmp_path: Path) -> None:
    fit(CFG, RunConfig(workdir=tmp_path, steps=50, ckpt_every=5, keep=3))
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [50, 45, 40]


def test_metrics_reader_skips_torn_lines_and_counts_lost_steps() -> None:
    lines = [
        '{"event":"start","time":1,"restart":0,"host":"a","resume_step":0}',
        '{"event":"step","time":2,"step":1,"loss":2.0}',
        '{"event":"checkpoint","time":3,"step":1,"reason":"interval"}',
        '{"event":"step","time":4,"step":2,"loss":1.5}',
        '{"event":"step","time":5,"step":3,"lo',  # SIGKILL mid-write
        '{"event":"start","time":9,"restart":1,"host":"b","resume_step":1}',
        '{"event":"step","time":10,"step":2,"loss":1.5}',
    ]
    runs = split_runs(parse_records(lines))
    assert [(r.host, r.resume_step, r.last_step) for r in runs] == [("a", 0, 2), ("b", 1, 2)]
    assert steps_lost(runs) == [1]


def test_tail_returns_whole_new_records_only(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() == []
    path.write_text('{"event":"start","time":1,"host":"a","restart":1,"resume_step":40}\n{"ev')
    [start] = tail.poll()
    assert describe(start) == "started from step 40 on a (restart 1)"
    with path.open("a") as f:
        f.write('ent":"step","time":2,"step":41,"loss":0.51234,"host":"a","restart":1}\n')
    [step] = tail.poll()
    assert describe(step) == "step 41 loss 0.512 on a (restart 1)"
    assert tail.poll() == []


def test_sbatch_script_execs_the_job(tmp_path: Path) -> None:
    run = RunConfig(workdir=tmp_path, steps=300, ckpt_every=20, step_seconds=0.15)
    text = render_sbatch(ModelConfig(seed=5), run, python="/venv/bin/python")
    for directive in ("--requeue", "--open-mode=append", "--gres=gpu:1"):
        assert f"#SBATCH {directive}\n" in text
    assert f"#SBATCH --output={tmp_path}/slurm-%j.out" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("exec /venv/bin/python -m gpuheal_dev.demo_job --workdir ")
    assert "--step-seconds 0.15" in last
    assert "--seed 5" in last
    assert "--lr" not in last  # defaults are left out


def test_parse_scontrol_job_line() -> None:
    line = (
        "JobId=12 JobName=gpuheal-demo UserId=root(0) JobState=PENDING Reason=BeginTime "
        "Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 NodeList=(null) "
        "BatchHost=gpu-node-0 ExcNodeList=gpu-node-0 Command=/tmp/x y/job.sh"
    )
    job = parse_job(12, line)
    assert (job.state, job.reason, job.restarts) == ("PENDING", "BeginTime", 1)
    assert (job.batch_host, job.excluded, job.nodes) == ("gpu-node-0", "gpu-node-0", "(null)")
