"""The README's status reference ("**Status reference.**", three tables marked
``<!-- status-reference: KIND -->``) names every reason each condition can carry, with its
status, and nothing else: the reasons are collected from the code (its ``ast``, not by
running it) and compared with the tables both ways.

Collected, for the NodeRemediation:

- every ``StepResult.done/skipped/wait/failed(condition, reason, ...)`` in
  ``gpuheal.remediation``: done is True, skipped/failed False, wait False (Unknown for
  ``Verified``: the driver records a check that waits as Unknown); a failed step other than a
  reset, reboot or check also sets ``Failed=True`` with its reason, and a wait of the return
  ``Blocked=True``. A condition that is a function's parameter is looked up in
  ``PARAM_CONDITIONS`` (a new such function fails here until it is added);
- every ``.condition(condition, status, reason, ...)`` call and every ``(condition, status,
  reason, ...)`` tuple with literal reasons (``extra_conditions``, ``rec.condition``), the
  condition also ``CONDITION_OF[...]`` (the dry run's ``DryRun`` on each step's condition);
- the reasons computed by helpers: ``drain_outcome`` (SlurmDrained), ``victims._condition``
  (JobsRequeued), ``policy.idle``'s ``Busy`` (a reset's or reboot's wait);
- the driver's ``_complete`` (Completed), ``_block`` and ``_BLOCKING_WAITS`` (Blocked), and
  ``_RETURN_OUTCOME`` (Returned's done reasons and Completed's);
- the engine's ``Blocked`` and the safety gate's reasons (Blocked, but ``DryRun``: the
  driver records that on the step's condition), the ``Wait`` reasons after the ladder
  (Returned), and the ``Move.CLOSE`` reasons the driver's ``_finish`` does not handle by name
  (Completed with that reason).

For the RemediationPolicy and the ReservePool: every ``conds.set(condition, ..., reason)`` of
``remediation/report.py`` (the reasons in its expression).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from collections.abc import Iterable, Iterator

import pytest

from gpuheal.api.names import NremCondition, PolicyCondition, PoolCondition, Reason

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PKG = ROOT / "operator" / "gpuheal"
STATUSES = ("True", "False", "Unknown")
ANY = frozenset(STATUSES)
C = NremCondition
REPAIRS = frozenset({C.RESET.value, C.REBOOTED.value})

# Functions that take the condition as a parameter: which conditions their results reach, per
# kind of result (none: their caller converts it, e.g. a hook's success is no repair yet).
PARAM_CONDITIONS: dict[str, dict[str, frozenset[str]]] = {
    "work_on_node": dict.fromkeys(("wait", "failed"), REPAIRS),
    "noop_skipped": {"skipped": REPAIRS},
    "hook_skipped": {"skipped": REPAIRS},
    "_job_hook": {
        "wait": REPAIRS | {C.VERIFIED.value},
        "failed": REPAIRS,  # a check's Job that failed is recorded as CheckFailed
        "done": frozenset(),  # a repair is verified after it; a check's is CheckPassed
    },
}
# run_hook's success is no repair either: `repair` verifies it (BootIDChanged, ...).
CONVERTED = {("run_hook", "done")}


@dataclasses.dataclass(frozen=True)
class Said:
    """A reason the code can write: exact, or a pattern (an f-string)."""

    kind: str  # the table: NodeRemediation, RemediationPolicy, ReservePool
    condition: str
    reason: str
    statuses: frozenset[str]
    pattern: bool = False
    where: str = ""

    def matches(self, reason: str) -> bool:
        return bool(re.fullmatch(self.reason, reason)) if self.pattern else reason == self.reason


# ---- the README ---------------------------------------------------------------------------
Row = tuple[str, str, frozenset[str]]  # condition, reason, statuses


def readme_tables(text: str | None = None) -> dict[str, list[Row]]:
    lines = (README.read_text() if text is None else text).splitlines()
    tables: dict[str, list[Row]] = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- status-reference: (\w+) -->", line.strip())
        if not m:
            continue
        rows: list[Row] = []
        conditions: list[str] = []
        in_table = False
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                if in_table:
                    break
                continue
            in_table = True
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if cells[0] == "Condition" or (cells[0] and set(cells[0]) <= {"-"}):
                continue
            if cells[0]:
                conditions = re.findall(r"`(\w+)`", cells[0])
            statuses = frozenset(s for s in STATUSES if re.search(rf"\b{s}\b", cells[1]))
            for reason in re.findall(r"`(\w+)`", cells[2]):
                rows.extend((c, reason, statuses) for c in conditions)
        tables[m.group(1)] = rows
    return tables


# ---- the code -----------------------------------------------------------------------------
def _tree(rel: str) -> ast.Module:
    return ast.parse((PKG / rel).read_text(), filename=rel)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _enum(node: ast.AST, names: Iterable[str], enum: type) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in names
    ):
        return str(enum[node.attr].value)
    return None


def _attrs(node: ast.AST | None, names: Iterable[str], enum: type) -> set[str]:
    return {v for n in ast.walk(node) if (v := _enum(n, names, enum))} if node else set()


def _strings(node: ast.AST | None) -> set[str]:
    if node is None:
        return set()
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _assigned(func: ast.AST | None, name: str) -> list[ast.AST]:
    """The values `name` is assigned in `func` (`a, b = x, y`: its own element)."""
    if func is None:
        return []
    out: list[ast.AST] = []
    for node in ast.walk(func):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == name:
                out.append(node.value)
            elif isinstance(target, ast.Tuple):
                for i, t in enumerate(target.elts):
                    if isinstance(t, ast.Name) and t.id == name:
                        value = node.value
                        out.append(value.elts[i] if isinstance(value, ast.Tuple) else value)
    return out


def _params(func: ast.AST | None) -> set[str]:
    if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    a = func.args
    return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


class Module:
    """One source file: module constants and, per node, its enclosing function."""

    def __init__(self, rel: str):
        self.rel = rel
        self.tree = _tree(rel)
        self.owner: dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for func in _functions(self.tree):
            for node in ast.walk(func):
                self.owner.setdefault(node, func)  # outermost first: ast.walk is breadth-first
        for func in _functions(self.tree):  # then the innermost wins
            for node in ast.walk(func):
                if node is not func:
                    self.owner[node] = func
        self.parents = {c: p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}
        self.constants: dict[str, ast.AST] = {}
        for node in self.tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
                self.constants[target.id] = node.value  # type: ignore[attr-defined]

    def func(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        return self.owner.get(node)

    def conditions(self, node: ast.AST, kind: str | None = None) -> set[str] | None:
        """The NodeRemediation conditions `node` names; None: not known here (e.g.
        `result.condition`: the StepResult's, collected where it is made)."""
        if v := _enum(node, ("C", "NremCondition"), NremCondition):
            return {v}
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            table = self.constants.get(node.value.id)
            return _attrs(table, ("C", "NremCondition"), NremCondition) if table else None
        if isinstance(node, ast.Name):
            func = self.func(node)
            values = _assigned(func, node.id)
            if values:
                return set().union(
                    *(_attrs(v, ("C", "NremCondition"), NremCondition) for v in values)
                )
            if node.id in _params(func) and kind is not None:
                assert func is not None
                where = f"{self.rel}:{node.lineno} ({func.name})"
                assert func.name in PARAM_CONDITIONS, (
                    f"{where}: a StepResult whose condition is a parameter: add the function to "
                    "PARAM_CONDITIONS with the conditions its callers pass"
                )
                return set(PARAM_CONDITIONS[func.name].get(kind or "", frozenset()))
        return None

    def reasons(self, node: ast.AST) -> list[tuple[str, bool]]:  # noqa: PLR0911
        """(reason, is a pattern) for a reason expression; [] when it is computed elsewhere."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value, False)]
        if isinstance(node, ast.JoinedStr):
            parts = [
                re.escape(v.value) if isinstance(v, ast.Constant) else "[A-Za-z]+"
                for v in node.values
            ]
            return [("".join(parts), True)]
        if v := _enum(node, ("Reason",), Reason):
            return [(v, False)]
        if isinstance(node, ast.IfExp):
            return self.reasons(node.body) + self.reasons(node.orelse)
        if isinstance(node, ast.Name):
            if node.id in self.constants:
                return self.reasons(self.constants[node.id])
            return [r for v in _assigned(self.func(node), node.id) for r in self.reasons(v)]
        if isinstance(node, ast.Attribute) and node.attr == "reason":
            # `decision.reason` under `if decision.reason in (Reason.X, ...)`: those
            guard = self.parents.get(node)
            while guard is not None and not isinstance(guard, ast.If):
                guard = self.parents.get(guard)
            if guard is not None:
                return [(r, False) for r in sorted(_attrs(guard.test, ("Reason",), Reason))]
        return []

    def statuses(self, node: ast.AST) -> frozenset[str]:
        if isinstance(node, ast.Name):
            values = _assigned(self.func(node), node.id)
            found = set().union(*(_strings(v) for v in values)) if values else set()
        else:
            found = _strings(node)
        return frozenset(found & set(STATUSES)) or ANY


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _named(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _nrem(
    condition: str, reasons: list[tuple[str, bool]], statuses: frozenset[str], where: str
) -> Iterator[Said]:
    for reason, pattern in reasons:
        yield Said("NodeRemediation", condition, reason, statuses, pattern, where)


def step_results(mod: Module) -> Iterator[Said]:
    """StepResult.<kind>(condition, reason, ...): the step's condition, and Failed/Blocked."""
    for call in _calls(mod.tree):
        f = call.func
        if not (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "StepResult"
            and f.attr in ("done", "skipped", "wait", "failed")
        ):
            continue
        kind = f.attr
        func = mod.func(call)
        where = f"{mod.rel}:{call.lineno}"
        if func is not None and (func.name, kind) in CONVERTED:
            continue
        conditions = mod.conditions(call.args[0], kind)
        assert conditions is not None, f"{where}: cannot tell the condition"
        reasons = mod.reasons(call.args[1])
        if not reasons:
            continue  # computed: collected where it is (drain_outcome, idle, a parameter)
        for cond in conditions:
            status = "True" if kind == "done" else "False"
            if kind == "wait" and cond == C.VERIFIED:
                status = "Unknown"
            yield from _nrem(cond, reasons, frozenset({status}), where)
            if kind == "failed" and cond not in REPAIRS | {C.VERIFIED.value}:
                yield from _nrem(C.FAILED, reasons, frozenset({"True"}), where)
            if kind == "wait" and cond == C.RETURNED:
                yield from _nrem(C.BLOCKED, reasons, frozenset({"True"}), where)


def literal_conditions(mod: Module) -> Iterator[Said]:
    """`.condition(cond, status, reason, ...)` and `(cond, status, reason, ...)` tuples."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Call) and _named(node) == "condition" and len(node.args) >= 3:
            args = node.args
        elif isinstance(node, ast.Tuple) and len(node.elts) >= 3:
            args = node.elts
        else:
            continue
        conditions = mod.conditions(args[0])
        if not conditions:
            continue
        where = f"{mod.rel}:{node.lineno}"
        for cond in conditions:
            yield from _nrem(cond, mod.reasons(args[2]), mod.statuses(args[1]), where)


def helper_reasons() -> Iterator[Said]:
    steps = Module("remediation/steps.py")
    (outcome,) = (f for f in _functions(steps.tree) if f.name == "drain_outcome")
    for node in ast.walk(outcome):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            first = node.value.elts[0]
            for reason in sorted(_strings(first)) if isinstance(first, ast.Constant) else []:
                yield Said("NodeRemediation", C.SLURM_DRAINED, reason, frozenset({"True"}))
        if isinstance(node, ast.Dict):
            for reason in sorted(_strings(ast.Tuple(elts=list(node.values)))):
                yield Said("NodeRemediation", C.SLURM_DRAINED, reason, frozenset({"True"}))
    victims = Module("remediation/victims.py")
    (cond,) = (f for f in _functions(victims.tree) if f.name == "_condition")
    for node in ast.walk(cond):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            status, reason = node.value.elts[:2]
            yield from _nrem(
                C.JOBS_REQUEUED, victims.reasons(reason), victims.statuses(status), "victims"
            )
    idle = Module("policy/idle.py")
    for call in _calls(idle.tree):
        if _named(call) == "Busy":
            for c in REPAIRS:
                yield from _nrem(c, idle.reasons(call.args[0]), frozenset({"False"}), "idle")
                yield from _nrem(C.BLOCKED, idle.reasons(call.args[0]), frozenset({"True"}), "idle")


def driver_reasons() -> Iterator[Said]:
    mod = Module("remediation/driver.py")
    true = frozenset({"True"})
    for call in _calls(mod.tree):
        name = _named(call)
        # the reason follows the pass (`this`: the incident, its Recorder and the parts)
        at = [i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == "this"]
        if name in ("_complete", "_block") and at and len(call.args) > at[0] + 1:
            cond = C.COMPLETED if name == "_complete" else C.BLOCKED
            arg = call.args[at[0] + 1]
            if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name):
                table = mod.constants[arg.value.id]
                assert isinstance(table, ast.Dict)
                reasons = [(s, False) for v in table.values for s in sorted(_strings(v))]
            else:
                reasons = mod.reasons(arg)
            yield from _nrem(cond, reasons, true, f"driver:{call.lineno}")
    for reason in sorted(_attrs(mod.constants["_BLOCKING_WAITS"], ("Reason",), Reason)):
        yield Said("NodeRemediation", C.BLOCKED, reason, true)
    for reason in sorted(_dict_keys(mod, "_RETURN_OUTCOME")):
        yield Said("NodeRemediation", C.RETURNED, reason, true)
    # The engine's decisions, as the driver records them.
    engine, safety = Module("policy/engine.py"), Module("policy/safety.py")
    (finish,) = (f for f in _functions(mod.tree) if f.name == "_finish")
    handled = _attrs(
        ast.Module(
            body=[n for n in ast.walk(finish) if isinstance(n, ast.Compare)], type_ignores=[]
        ),
        ("Reason",),
        Reason,
    )
    for call in _calls(engine.tree):
        name = _named(call)
        if name == "Blocked" and call.args:
            for reason, _ in engine.reasons(call.args[0]):
                if reason != Reason.DRY_RUN:  # the step's condition says it (_record_would)
                    yield Said("NodeRemediation", C.BLOCKED, reason, true)
        elif (
            name == "Wait"
            and getattr(engine.func(call), "name", "") == "_after_ladder"
            and len(call.args) >= 2
        ):
            for reason, _ in engine.reasons(call.args[1]):
                yield Said("NodeRemediation", C.RETURNED, reason, ANY)
        elif name == "Act" and len(call.args) >= 2 and _is_close(call.args[0]):
            for reason, _ in engine.reasons(call.args[1]):
                if reason not in handled:
                    yield Said("NodeRemediation", C.COMPLETED, reason, true)
    for node in ast.walk(safety.tree):
        if isinstance(node, ast.Call) and _named(node) == "Admission":
            first = node.args[0]
            if isinstance(first, ast.Tuple):
                for reason, _ in safety.reasons(first.elts[0]):
                    yield Said("NodeRemediation", C.BLOCKED, reason, true)


def _is_close(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Move"
        and node.attr == "CLOSE"
    )


def _dict_keys(mod: Module, name: str) -> set[str]:
    node = mod.constants[name]
    assert isinstance(node, ast.Dict)
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def report_reasons() -> Iterator[Said]:
    mod = Module("remediation/report.py")
    kinds = {
        "policy_status": ("RemediationPolicy",),
        "pool_status": ("ReservePool",),
        "unparsed_status": ("RemediationPolicy", "ReservePool"),
    }
    for call in _calls(mod.tree):
        if _named(call) != "set" or len(call.args) < 3:
            continue
        func = mod.func(call)
        assert func is not None
        assert func.name in kinds, f"report.py:{call.lineno}: which object?"
        cond = _enum(call.args[0], ("PolicyCondition",), PolicyCondition) or _enum(
            call.args[0], ("PoolCondition",), PoolCondition
        )
        assert cond is not None, f"report.py:{call.lineno}: which condition?"
        flag = call.args[1]
        statuses = frozenset({str(flag.value)}) if isinstance(flag, ast.Constant) else ANY
        for kind in kinds[func.name]:
            for reason in sorted(_attrs(call.args[2], ("Reason",), Reason)):
                yield Said(kind, cond, reason, statuses, where=f"report.py:{call.lineno}")


def collected() -> list[Said]:
    out: list[Said] = []
    for path in sorted((PKG / "remediation").glob("*.py")):
        mod = Module(f"remediation/{path.name}")
        out += step_results(mod)
        out += literal_conditions(mod)
    out += helper_reasons()
    out += driver_reasons()
    out += report_reasons()
    return out


# ---- the tests ----------------------------------------------------------------------------
SAID = collected()
KINDS = ("NodeRemediation", "RemediationPolicy", "ReservePool")


def _missing(said: list[Said], tables: dict[str, list[Row]]) -> list[str]:
    out = []
    for s in said:
        rows = [r for r in tables.get(s.kind, []) if r[0] == s.condition and s.matches(r[1])]
        if not rows:
            out.append(f"{s.kind} {s.condition}: {s.reason} ({s.where})")
        elif s.statuses != ANY and not any(s.statuses <= r[2] for r in rows):
            out.append(
                f"{s.kind} {s.condition}: {s.reason} is {'/'.join(sorted(s.statuses))}, "
                f"the README says {'/'.join(sorted(set().union(*(r[2] for r in rows))))}"
            )
    return sorted(set(out))


def test_the_code_is_read() -> None:
    """The collection finds what it should (a change in the code's shape shows here)."""
    found = {(s.kind, s.condition, s.reason) for s in SAID}
    for expected in [
        ("NodeRemediation", "Detected", "SignalMatched"),
        ("NodeRemediation", "SlurmDrained", "DrainedWasDown"),
        ("NodeRemediation", "JobsRequeued", "Requeued"),
        ("NodeRemediation", "Reset", "WaitingForIdle"),
        ("NodeRemediation", "Rebooted", "BootIDChanged"),
        ("NodeRemediation", "Verified", "NoCheck"),
        ("NodeRemediation", "Returned", "HysteresisPending"),
        ("NodeRemediation", "Returned", r"Slurm[A-Za-z]+Refused"),
        ("NodeRemediation", "Blocked", "StormCooldown"),
        ("NodeRemediation", "Completed", "AlertOnly"),
        ("NodeRemediation", "Failed", "DrainTimedOut"),
        ("NodeRemediation", "Cordoned", "DryRun"),
        ("RemediationPolicy", "Ready", "InvalidSpec"),
        ("ReservePool", "Low", "NoSpares"),
    ]:
        assert expected in found, expected
    written = {(s.kind, s.condition) for s in SAID}
    declared = (
        {("NodeRemediation", c.value) for c in NremCondition if c is not NremCondition.REPAIRED}
        | {("RemediationPolicy", c.value) for c in PolicyCondition}
        | {("ReservePool", c.value) for c in PoolCondition}
    )
    assert written == declared  # Repaired: declared in the API, written by nothing


@pytest.mark.parametrize("kind", KINDS)
def test_every_reason_the_code_writes_is_in_the_readme(kind: str) -> None:
    missing = _missing([s for s in SAID if s.kind == kind], readme_tables())
    assert not missing, "README.md's status reference lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("kind", KINDS)
def test_the_readme_names_no_reason_the_code_cannot_write(kind: str) -> None:
    extra = [
        f"{cond}: {reason} ({'/'.join(sorted(statuses))})"
        for cond, reason, statuses in readme_tables()[kind]
        if not any(
            s.kind == kind
            and s.condition == cond
            and s.matches(reason)
            and (s.statuses == ANY or s.statuses & statuses)
            for s in SAID
        )
    ]
    assert not extra, "README.md's status reference names what the code never writes:\n" + (
        "\n".join(extra)
    )


def test_a_row_taken_out_fails() -> None:
    """The check bites: without one row of the README, a reason is reported missing."""
    text = README.read_text()
    row = next(
        line for line in text.splitlines() if "`DrainedWasDown`" in line and line.startswith("|")
    )
    tables = readme_tables(text.replace(row + "\n", ""))
    missing = _missing([s for s in SAID if s.kind == "NodeRemediation"], tables)
    assert any("DrainedWasDown" in m for m in missing)
