"""The decision engine: `decide(policy, node, history, counts, now) -> Decision`.

Pure and total over its inputs: no clock (`now` is an argument), no I/O, no Kubernetes. The
operator turns a `Decision` into API calls and status; `gpuheal explain` prints it; tests
feed plain values. Nothing else in gpuheal decides.

The rules, in the order they are applied:
1. Opt-out label: hands off, whatever else is true (saying what would have happened).
2. Open incident: escalate to a higher rung when repeats of its rule cross
   `escalation.occurrences` within the window, else the rung's next step not done yet
   (approval, dry run, and for the incident's first disruptive step the safety gate:
   breaker at `maxUnhealthy`, storm cooldown, rate limit); once every step is done, close
   or return the node to service after `returnToService.healthyFor` of health (only what
   gpuheal itself cordoned/drained). Before that return, the policy's check must pass
   (`returnToService.check`: a Job such as a DCGM diagnostic, a webhook, a node condition
   or label), after the last signal; a failed check, or a reset/reboot that could not be
   verified, climbs the ladder (on the last rung the incident fails and the node stays out).
   A replaced node is handed to repair: it closes as Replaced, unless its rung repairs it
   after the replacement (a reset/reboot after `replace`), then, once verified, it goes back
   to its ReservePool when the pool is below minAvailable, else to service. `retire` keeps
   a node out for good. Nothing holds back a return to service but pause and blindness:
   blocking the healthy path is how clusters end up with nodes cordoned forever.
3. No incident: a new signal (or, with none named, every signal since the node's last
   incident) is matched against the rules in policy order; repeats of the matching rule in
   its window pick the rung; a watched condition must have held its `for`. The result is
   "open an incident" (recorded even when paused or when the breaker will hold its steps,
   so every unhealthy node is on record and nothing is lost), or "alert" for an alert-only
   rung.
Catalogue guards hold whatever the policy says: an XID whose entry is `AlertOnly` on first
sight (13/31/43...) only alerts until it repeats on the same GPU; `NoReplace` (94) never
replaces (nor retires) on first sight. Repeats are counted in the node's history, which the
operator reads back from the API (FaultHistory, NodeRemediations), so a restart forgets none.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence

from gpuheal.api.meta import format_duration, parse_duration
from gpuheal.api.names import Reason
from gpuheal.api.remediationpolicy import (
    DISRUPTIVE_ACTIONS,
    Action,
    CheckType,
    EscalationScope,
    RemediationPolicySpec,
    Rule,
    Step,
)
from gpuheal.policy.domains import (
    DomainStanding,
    domain_breaker,
    held_message,
    place_settling,
    replacement_held,
)
from gpuheal.policy.safety import admit
from gpuheal.policy.select import held_for, rule_matches, unhealthy_reasons, watched_conditions
from gpuheal.policy.types import (
    Act,
    Blocked,
    ClusterCounts,
    Decision,
    History,
    Idle,
    IncidentView,
    Move,
    NodeView,
    Observation,
    PoolCounts,
    Trigger,
    Wait,
)
from gpuheal.xid.catalogue import lookup
from gpuheal.xid.types import FirstSight

REPAIR_ACTIONS = frozenset({Action.RESET, Action.REBOOT})
"""Steps that repair the node (and are repeated on a later rung that names them again)."""


def decide(
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    counts: ClusterCounts,
    now: dt.datetime,
    *,
    new: Observation | None = None,
    max_signal_age: dt.timedelta | None = None,
    domains: Sequence[DomainStanding] = (),
) -> Decision:
    """What to do next for `node` under `policy` (see the module docstring for the rules).

    `new` is the signal that just arrived (the operator's intake names it; it may be in
    `history.observations` already). Without it, every signal since the node's last
    incident and every watched condition it holds now are considered, most severe rule
    first: what `gpuheal explain` asks. `domains`: the node's place in its policy's fault
    domains (`policy.domains`): past a domain's limit a member's replacement is held, and a
    per-domain breaker may hold a step back.
    """
    label = policy.safety.opt_out_label
    opted_out = label in node.labels
    if history.incident is not None:
        if opted_out:
            return Blocked(Reason.OPTED_OUT, f"node carries the opt-out label {label}")
        return _continue_incident(
            policy, node, history, history.incident, counts=counts, now=now, domains=domains
        )
    if node.sources_readable_since is None:
        # Blind is not healthy and not unhealthy: nothing starts on missing data.
        return Idle(Reason.SOURCE_BLIND, "a signal source for this node cannot be read")
    decision = _start(policy, node, history, now, new=new, max_signal_age=max_signal_age)
    if opted_out and isinstance(decision, Act):
        message = f"{decision.message}, but the node opted out ({label})"
        return Blocked(Reason.OPTED_OUT, message, would=decision)
    return decision


def _start(
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    now: dt.datetime,
    *,
    new: Observation | None,
    max_signal_age: dt.timedelta | None,
) -> Decision:
    """No incident: does `new` (or any fresh signal) open one?"""
    candidates = [new] if new is not None else _fresh(policy, node, history, now)
    observations = _known(history.observations, candidates, now)
    pending: Wait | None = None
    best: Trigger | None = None
    for signal in candidates:
        stale = _stale(signal, history, now, max_signal_age)
        if stale is not None:
            if new is not None:
                return stale
            continue
        found = trigger_for(policy, node, observations, signal, now, elsewhere=history.elsewhere)
        if isinstance(found, Wait):
            pending = found if pending is None or found.until < pending.until else pending
        elif found is not None and (best is None or _more_severe(found, best)):
            best = found
    if best is not None:
        return _open(best)
    if pending is not None:
        return pending
    if new is not None:
        return Idle(Reason.NO_RULE, f"{new.what}: no rule of the policy matches")
    return Idle(Reason.HEALTHY, "no signal matches a rule")


def _more_severe(a: Trigger, b: Trigger) -> bool:
    """Rules are in policy order (most severe first); the newer signal breaks a tie."""
    return (a.rule_index, -a.signal.time.timestamp()) < (b.rule_index, -b.signal.time.timestamp())


def _fresh(
    policy: RemediationPolicySpec, node: NodeView, history: History, now: dt.datetime
) -> list[Observation]:
    """Every signal that may still start an incident: observed since the last incident
    ended, plus the watched conditions the node holds now."""
    resolved = history.last_resolved_at
    return [
        o
        for o in [*history.observations, *condition_observations(policy, node)]
        if o.time <= now and not _dealt_with(o, resolved)
    ]


def condition_observations(policy: RemediationPolicySpec, node: NodeView) -> list[Observation]:
    """The node's watched conditions that hold their bad status now, as observations."""
    out = []
    for type_, bad in watched_conditions(policy):
        cond = node.condition(type_)
        if cond is not None and cond.status == bad and cond.last_transition_time is not None:
            out.append(
                Observation(
                    time=cond.last_transition_time,
                    condition_type=type_,
                    condition_status=bad,
                    message=f"{type_}={bad} ({cond.reason or 'no reason'})",
                    source="conditions",
                    key=f"condition/{node.name}/{type_}={bad}/"
                    f"{cond.last_transition_time.isoformat()}",
                )
            )
    return out


def _known(
    observations: Iterable[Observation], extra: Iterable[Observation], now: dt.datetime
) -> list[Observation]:
    """Observations up to `now`, each signal once (the same signal may be both in memory
    and recorded on an incident)."""
    seen: dict[tuple[object, ...], Observation] = {}
    for o in [*observations, *extra]:
        if o.time <= now:
            seen.setdefault(o.identity, o)
    return list(seen.values())


def _dealt_with(signal: Observation, resolved: dt.datetime | None) -> bool:
    """Did the node's last incident end after this signal? Event times have whole seconds,
    so a signal in the second the incident ended counts as new (a replay of one recorded on
    that incident is caught by its identity before it gets here)."""
    return resolved is not None and signal.time < resolved.replace(microsecond=0)


def _stale(
    signal: Observation,
    history: History,
    now: dt.datetime,
    max_age: dt.timedelta | None,
) -> Idle | None:
    if signal.time > now:
        return Idle(Reason.STALE, f"{signal.what} is dated in the future ({signal.time})")
    resolved = history.last_resolved_at
    if resolved is not None and _dealt_with(signal, resolved):
        return Idle(
            Reason.STALE,
            f"{signal.what} at {signal.time.isoformat()} predates the end of the node's last "
            f"incident ({resolved.isoformat()})",
        )
    if max_age is not None and now - signal.time > max_age:
        return Idle(
            Reason.STALE,
            f"{signal.what} is {format_duration(now - signal.time)} old: counted as history, "
            "starts nothing",
        )
    return None


# --- triggers ----------------------------------------------------------------------------


def trigger_for(
    policy: RemediationPolicySpec,
    node: NodeView,
    observations: Sequence[Observation],
    signal: Observation,
    now: dt.datetime,
    *,
    elsewhere: Sequence[Observation] = (),
) -> Trigger | Wait | None:
    """The first rule (in policy order) that `signal` matches, at the rung its repeats
    reach; a `Wait` for a condition that has not held its `for` yet; None if no rule.
    `elsewhere`: the same GPUs' signals on other nodes (counted per GPU only)."""
    for index, rule in enumerate(policy.rules):
        if not rule_matches(rule, signal):
            continue
        if signal.condition_type is not None and signal.condition_status is not None:
            cond = node.condition(signal.condition_type)
            if (
                cond is None
                or cond.status != signal.condition_status
                or cond.last_transition_time != signal.time
            ):
                return None  # that bad spell is over (or a newer one replaced it)
            due = signal.time + dt.timedelta(
                seconds=held_for(rule, signal.condition_type, signal.condition_status)
            )
            if due > now:
                return Wait(
                    due,
                    Reason.CONDITION_PENDING,
                    f"{signal.what} has not held long enough (rule {rule.name})",
                )
        esc = rule.escalation_or_default()
        per_gpu = esc.scope is EscalationScope.GPU
        count = _count(rule, observations, signal, now, per_gpu=per_gpu, elsewhere=elsewhere)
        gpu_count = _count(rule, observations, signal, now, per_gpu=True, elsewhere=elsewhere)
        rung = rung_for(rule, count)
        steps = _guarded_steps(rule.ladder[rung].steps, signal.xid, gpu_count)
        why = f"{signal.what} ({count} in {esc.window}) matched rule {rule.name}"
        repeat = repeat_phrase(count, signal, esc.window, per_gpu=per_gpu, node=node.name)
        return Trigger(index, rule, rung, steps, count, signal, why, repeat)
    return None


def _count(
    rule: Rule,
    observations: Sequence[Observation],
    signal: Observation,
    now: dt.datetime,
    *,
    per_gpu: bool,
    elsewhere: Sequence[Observation] = (),
) -> int:
    """Faults matching the rule within its window (on the same GPU when `per_gpu`, wherever
    that GPU was: `elsewhere`, by UUID), `signal` included; one fault reported by two
    reporters counts once."""
    return len(
        _repeats(
            rule,
            [*observations, signal],
            signal.gpu,
            now,
            per_gpu=per_gpu,
            elsewhere=elsewhere,
            uuid=signal.gpu_uuid,
        )
    )


def _repeats(
    rule: Rule,
    observations: Sequence[Observation],
    gpu: str | None,
    now: dt.datetime,
    *,
    per_gpu: bool,
    elsewhere: Sequence[Observation] = (),
    uuid: str | None = None,
) -> list[list[Observation]]:
    """The matching observations in the rule's window, grouped into faults; per GPU, the
    same GPU's (by `uuid`) observations on other nodes (`elsewhere`) too."""
    since = now - parse_duration(rule.escalation_or_default().window)
    matching = {
        o.identity: o
        for o in observations
        if since <= o.time <= now and (not per_gpu or o.gpu == gpu) and rule_matches(rule, o)
    }
    if per_gpu and uuid:
        for o in elsewhere:
            if since <= o.time <= now and o.gpu_uuid == uuid and rule_matches(rule, o):
                matching.setdefault(o.identity, o)
    return faults(matching.values())


SAME_FAULT_WITHIN = dt.timedelta(minutes=2)
"""Two reporters of one XID on one GPU this close in time report one fault: node-problem-
detector posts the XID 79 line and the "fallen off the bus" message as two Events, and
dcgm-exporter's scrape (every 15 s by default) sees a kernel XID a little later."""


def same_fault(a: Observation, b: Observation) -> bool:
    """Is `b` another report of `a`'s fault (same XID, same GPU, another reporter, close in
    time)? A repeat from the same reporter is a new fault."""
    return (
        a.xid is not None
        and (a.xid, a.gpu) == (b.xid, b.gpu)
        and bool(a.reporter)
        and bool(b.reporter)
        and a.reporter != b.reporter
        and abs(a.time - b.time) <= SAME_FAULT_WITHIN
    )


def faults(observations: Iterable[Observation]) -> list[list[Observation]]:
    """Observations grouped into faults (oldest first): an observation joins the first
    fault it is another report of, where that reporter has not reported yet."""
    groups: list[list[Observation]] = []
    for o in sorted(observations, key=lambda o: o.time):
        home = next(
            (g for g in groups if same_fault(g[0], o) and all(x.reporter != o.reporter for x in g)),
            None,
        )
        if home is None:
            groups.append([o])
        else:
            home.append(o)
    return groups


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def human_window(window: str) -> str:
    """`168h` -> `7d` for messages (whole days from two days up), else as written."""
    seconds = int(parse_duration(window).total_seconds())
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    return window


def repeat_phrase(
    count: int, signal: Observation, window: str, *, per_gpu: bool, node: str = ""
) -> str:
    """`3rd XID 94 on GPU-8f6c... in 7d`: what the node's history says about this signal."""
    if signal.xid is not None:
        what = f"XID {signal.xid}"
    elif signal.condition_type is not None:
        what = f"{signal.condition_type}={signal.condition_status}"
    else:
        what = f"{signal.event_reason}"
    gpu = signal.gpu_uuid or signal.gpu
    if per_gpu and gpu:
        where = gpu if gpu.startswith(("GPU-", "MIG-")) else f"GPU {gpu}"
    else:
        where = node or "the node"
    return f"{_ordinal(count)} {what} on {where} in {human_window(window)}"


def rung_for(rule: Rule, count: int) -> int:
    """Every `occurrences` matching signals climb one rung (default escalation when the
    rule names none): 1-2 of 3 stay on rung 0, the 3rd reaches rung 1."""
    occurrences = rule.escalation_or_default().occurrences
    return min(count // occurrences, len(rule.ladder) - 1)


def _guarded_steps(steps: Sequence[Step], xid: int | None, gpu_count: int) -> tuple[Step, ...]:
    """Apply the catalogue's first-sight guard to a rung's steps."""
    if xid is None or gpu_count > 1:
        return tuple(steps)
    first_sight = lookup(xid).first_sight
    if first_sight is FirstSight.ALERT_ONLY:
        # A first sight that only warns still lets the jobs checkpoint (nothing disruptive;
        # the rung's own steps, in order, as `vet.ladder_of` expects of a guarded rung).
        asked = tuple(s for s in steps if s.action is Action.CHECKPOINT)
        return asked or (Step(action=Action.ALERT),)
    if first_sight is FirstSight.NO_REPLACE:
        kept = tuple(s for s in steps if s.action not in (Action.REPLACE, Action.RETIRE))
        return kept or (Step(action=Action.ALERT),)
    return tuple(steps)


def _open(trigger: Trigger) -> Decision:
    first = trigger.steps[0]
    if all(s.action is Action.ALERT for s in trigger.steps):
        return Act(
            Action.ALERT,
            Reason.ALERT_ONLY,
            f"{trigger.why}: alert only",
            rule=trigger.rule.name,
            rung=trigger.rung,
            step_index=0,
            step=first,
            trigger=trigger,
        )
    # Opened even when paused or in a storm: the record is harmless and is what shows every
    # unhealthy node; its steps wait for the pause to end (and for the safety gate).
    return Act(
        Move.OPEN,
        Reason.DETECTED,
        trigger.why,
        rule=trigger.rule.name,
        rung=trigger.rung,
        trigger=trigger,
    )


# --- an open incident --------------------------------------------------------------------


def _continue_incident(  # noqa: PLR0911 - one exit per documented outcome reads best
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    incident: IncidentView,
    *,
    counts: ClusterCounts,
    now: dt.datetime,
    domains: Sequence[DomainStanding] = (),
) -> Decision:
    safety = policy.safety
    if safety.paused:
        return Blocked(Reason.PAUSED, "policy is paused")
    observations = _known(history.observations, (), now)
    elsewhere = history.elsewhere
    escalation = _escalation(policy, node, observations, incident, now, elsewhere=elsewhere)
    if escalation is not None:
        return escalation
    failed = _climb_after_failure(incident)
    if failed is not None:
        return failed
    act = _next_step(policy, observations, incident, now, elsewhere=elsewhere)
    if act is None:
        return _after_ladder(
            policy, node, observations, incident, counts=counts, now=now, elsewhere=elsewhere
        )
    assert act.step is not None
    action = act.step.action
    # Approving the replace lifts a domain's hold: a person who knows the cause is fixed.
    held = None if Action.REPLACE in incident.approved else replacement_held(domains, node.name)
    if action is Action.REPLACE and held is not None:
        message = held_message(held, node.name)
        if incident.replaced_by is not None:  # its early claim outran the hold (settle)
            message += (
                f"; {incident.replaced_by} was claimed for it before the faults ahead of it "
                "were on record, and stays claimed"
            )
        return Blocked(Reason.DOMAIN_REPLACEMENT_HELD, message, would=act)
    if action in set(safety.require_approval) - incident.approved:
        return Blocked(Reason.APPROVAL_PENDING, f"{action} needs approval", would=act)
    if incident.dry_run:
        return Blocked(Reason.DRY_RUN, f"dry run: would {action}", would=act)
    settling = place_settling(domains, incident.started_at, now)
    spare = (
        None
        if held is not None or settling
        else spare_to_claim(policy, observations, incident, act, now)
    )
    if action in DISRUPTIVE_ACTIONS and not incident.holds_slot and _own_cordon(node, incident):
        # Its cordon took the slot, and a crash came before the status said so: the mark
        # counts in `counts` already; admitting the incident again would block it behind
        # itself for good. The slot is recorded with this step.
        return dataclasses.replace(act, takes_slot=True, reserve=spare)
    if action in DISRUPTIVE_ACTIONS and not incident.holds_slot:
        full = domain_breaker(domains)
        if full is not None:
            return Blocked(Reason.DOMAIN_BREAKER_OPEN, full[1], would=act)
        gate = admit(safety, counts, now)
        if gate.blocked is not None:
            reason, message, retry = gate.blocked
            return Blocked(reason, message, retry_at=retry, would=act, breaker=gate.breaker)
        return dataclasses.replace(act, takes_slot=True, breaker=gate.breaker, reserve=spare)
    return dataclasses.replace(act, reserve=spare) if incident.holds_slot else act


def _own_cordon(node: NodeView, incident: IncidentView) -> bool:
    """The node is kept out under this incident's own mark (gpuheal.io/cordoned-by)."""
    return bool(incident.name) and node.kept_out_by == incident.name


def spare_to_claim(
    policy: RemediationPolicySpec,
    observations: Sequence[Observation],
    incident: IncidentView,
    act: Act,
    now: dt.datetime,
) -> Step | None:
    """The rung's replace step, when its spare should be claimed now, beside `act`.

    The ladder says replace: the node leaves and its work moves to a spare. Claiming the
    spare only once the drain is over makes the requeued job wait for it (the demo lost
    ~1.5 s so; ByteRobust keeps warm standbys for this). So the spare is claimed as soon as
    the incident may disrupt (it holds or takes its maxUnhealthy slot with this step), in
    parallel with the rung's earlier steps, unless replace waits for a person's approval.
    The replace step itself then finds the claim made and completes.
    """
    if act.step is None or act.step.action is Action.REPLACE or act.step_index is None:
        return None
    if Action.REPLACE in incident.done:
        return None
    if Action.REPLACE in set(policy.safety.require_approval) - incident.approved:
        return None
    steps = incident_steps(policy, observations, incident, now)
    return next((s for s in steps[act.step_index + 1 :] if s.action is Action.REPLACE), None)


def _rule(policy: RemediationPolicySpec, name: str) -> Rule | None:
    return next((r for r in policy.rules if r.name == name), None)


def _escalation(
    policy: RemediationPolicySpec,
    node: NodeView,
    observations: Sequence[Observation],
    incident: IncidentView,
    now: dt.datetime,
    *,
    elsewhere: Sequence[Observation] = (),
) -> Act | None:
    """A repeat of the incident's rule since it opened that climbs above its rung."""
    rule = _rule(policy, incident.rule)
    if rule is None:
        return None
    fresh = [o for o in observations if o.time > incident.started_at and rule_matches(rule, o)]
    if not fresh:
        return None
    latest = max(fresh, key=lambda o: o.time)
    esc = rule.escalation_or_default()
    per_gpu = esc.scope is EscalationScope.GPU
    count = _count(rule, observations, latest, now, per_gpu=per_gpu, elsewhere=elsewhere)
    rung = min(rung_for(rule, count), len(incident.ladder) - 1)
    if rung <= incident.rung:
        return None
    phrase = repeat_phrase(count, latest, esc.window, per_gpu=per_gpu, node=node.name)
    return Act(
        Move.ESCALATE,
        Reason.ESCALATED,
        f"{phrase}: rung {incident.ladder[incident.rung].name} -> {incident.ladder[rung].name}",
        rule=rule.name,
        rung=rung,
    )


def _climb_after_failure(incident: IncidentView) -> Act | None:
    """The current rung's repair could not be verified, or the check after it failed:
    climb one rung; on the last rung the incident fails and the node stays out."""
    verification = incident.verification
    if incident.repair_failed is not None:
        reason, why = Reason.REPAIR_FAILED, incident.repair_failed
    elif verification is not None and verification.failed_at is not None:
        reason, why = Reason.VERIFICATION_FAILED, verification.message or "check failed"
    else:
        return None
    top = len(incident.ladder) - 1
    if incident.rung >= top:
        return Act(
            Move.CLOSE,
            reason,
            f"{why}; no rung left to climb: the node stays out of service for a person",
        )
    rung = incident.rung + 1
    return Act(
        Move.ESCALATE,
        reason,
        f"{why}: rung {incident.ladder[incident.rung].name} -> {incident.ladder[rung].name}",
        rule=incident.rule,
        rung=rung,
    )


def incident_steps(
    policy: RemediationPolicySpec,
    observations: Sequence[Observation],
    incident: IncidentView,
    now: dt.datetime,
    *,
    elsewhere: Sequence[Observation] = (),
) -> tuple[Step, ...]:
    """The incident's current rung (its own snapshot) after the first-sight guards."""
    steps = incident.ladder[min(incident.rung, len(incident.ladder) - 1)].steps
    if incident.trigger_xid is None:
        return tuple(steps)
    rule = _rule(policy, incident.rule)
    if rule is None:  # the policy dropped the rule: guard as on first sight
        return _guarded_steps(steps, incident.trigger_xid, 1)
    seen = _repeats(
        rule,
        observations,
        incident.trigger_gpu,
        now,
        per_gpu=True,
        elsewhere=elsewhere,
        uuid=incident.trigger_gpu_uuid,
    )
    return _guarded_steps(steps, incident.trigger_xid, len(seen))


def _next_step(
    policy: RemediationPolicySpec,
    observations: Sequence[Observation],
    incident: IncidentView,
    now: dt.datetime,
    *,
    elsewhere: Sequence[Observation] = (),
) -> Act | None:
    steps = incident_steps(policy, observations, incident, now, elsewhere=elsewhere)
    for index, step in enumerate(steps):
        if step.action in incident.done:
            continue
        return Act(
            operation=step.action,
            reason=Reason.NEXT_STEP,
            message=f"rung {incident.ladder[incident.rung].name} step {index}: {step.action}",
            rule=incident.rule,
            rung=incident.rung,
            step_index=index,
            step=step,
        )
    return None


def _after_ladder(  # noqa: PLR0911, PLR0912 - one exit per documented outcome reads best
    policy: RemediationPolicySpec,
    node: NodeView,
    observations: Sequence[Observation],
    incident: IncidentView,
    *,
    counts: ClusterCounts,
    now: dt.datetime,
    elsewhere: Sequence[Observation] = (),
) -> Decision:
    """Every step of the rung is done: close, verify, or return the node once it stayed
    healthy (to its ReservePool when it was replaced and the pool runs low)."""
    steps = incident_steps(policy, observations, incident, now, elsewhere=elsewhere)
    actions = [s.action for s in steps]
    if Action.RETIRE in actions:
        return Act(Move.CLOSE, Reason.RETIRED, "retired: the node stays out for inspection")
    pool = next((s.replace.reserve_pool_ref.name for s in steps if s.replace is not None), None)
    if Action.REPLACE in actions:
        after = actions[actions.index(Action.REPLACE) + 1 :]
        # A skipped repair (Noop hook) repaired nothing: the node waits for its repair.
        if not any(a in REPAIR_ACTIONS and a not in incident.repairs_skipped for a in after):
            skipped = [a.value for a in after if a in incident.repairs_skipped]
            return Act(
                Move.CLOSE,
                Reason.REPLACED,
                "replaced; the node stays out of service for repair"
                + (f" (its {' and '.join(skipped)}: skipped, nothing ran)" if skipped else ""),
            )
        # Repaired after its replacement (a reset/reboot after `replace`): verify, then return.
    if not any(a in DISRUPTIVE_ACTIONS for a in actions):
        said = "jobs asked to checkpoint" if Action.CHECKPOINT in actions else "alert raised"
        return Act(Move.CLOSE, Reason.ALERT_ONLY, f"{said}; nothing to undo")
    rts = policy.return_to_service
    if not rts.enabled:
        return Idle(Reason.RETURN_DISABLED, "returnToService is disabled: a person decides")
    if node.sources_readable_since is None:
        return Blocked(Reason.SOURCE_BLIND, "a signal source is blind: cannot tell it is healthy")
    hysteresis = parse_duration(rts.healthy_for)
    unhealthy = unhealthy_reasons(policy, node)
    if unhealthy:
        return Wait(now + hysteresis, Reason.STILL_UNHEALTHY, "; ".join(unhealthy))
    verified_at = None
    if rts.check.type is not CheckType.NONE:
        last_signal = max((o.time for o in observations), default=None)
        run = incident.verification
        stale = run is None or (last_signal is not None and run.started_at < last_signal)
        if stale or run is None or run.passed_at is None:
            if incident.dry_run:
                return Blocked(Reason.DRY_RUN, f"dry run: would run the {rts.check.type} check")
            return Act(
                Move.VERIFY,
                Reason.VERIFY,
                f"{rts.check.type} check before return to service"
                + (" (again: a signal arrived after the last run)" if run and stale else ""),
                rule=incident.rule,
                rung=incident.rung,
                restart=stale,
            )
        verified_at = run.passed_at
    watched = {t for t, _ in watched_conditions(policy)} | {"Ready"}
    healthy_since = max(
        [
            incident.started_at,
            incident.last_step_at or incident.started_at,
            node.sources_readable_since,
            *(o.time for o in observations),
            *([verified_at] if verified_at is not None else []),
            *(
                c.last_transition_time
                for c in node.conditions
                if c.type in watched and c.last_transition_time is not None
            ),
        ]
    )
    if now - healthy_since < hysteresis:
        return Wait(
            healthy_since + hysteresis,
            Reason.HYSTERESIS_PENDING,
            f"healthy for {format_duration(now - healthy_since)} of {rts.healthy_for}"
            + (" after its check passed" if verified_at is not None else ""),
        )
    unchecked = unchecked_return(actions, incident) if verified_at is None else None
    uncordon = incident.cordoned_by_us
    resume = incident.slurm_drained_by_us and rts.resume_slurm
    if not uncordon and not resume and incident.quarantined_device is None:
        return Act(
            Move.CLOSE,
            Reason.NOTHING_OWNED,
            "healthy; gpuheal owns nothing to undo",
            unchecked=unchecked,
        )
    if incident.dry_run:
        return Blocked(Reason.DRY_RUN, "dry run: would return the node to service")
    to_pool = return_destination(incident, pool, counts.pools.get(pool) if pool else None)
    where = f"to ReservePool {to_pool} (below minAvailable)" if to_pool else "to service"
    return Act(
        Move.RETURN_TO_SERVICE,
        Reason.HEALTHY_FOR_HYSTERESIS,
        f"healthy for {rts.healthy_for}"
        + (" after its check passed" if verified_at is not None else "")
        + f": back {where}",
        rule=incident.rule,
        rung=incident.rung,
        uncordon=uncordon,
        resume_slurm=resume,
        to_pool=to_pool,
        unchecked=unchecked,
    )


def unchecked_return(actions: Sequence[Action], incident: IncidentView) -> str:
    """What a return with no check (returnToService.check None) rests on, for Verified=
    Unknown: the policy's healthyFor alone, after the rung's verified repair if it had one
    (a reset/reboot is done only once verified on the node), else after no repair at all."""
    repairs = [a for a in actions if a in REPAIR_ACTIONS]
    skipped = [a.value for a in repairs if a in incident.repairs_skipped]
    verified = [a.value for a in repairs if a not in incident.repairs_skipped]
    base = "no check configured (returnToService.check.type None): returned on healthyFor alone"
    if verified:
        return f"{base}, after its verified {' and '.join(verified)}"
    if skipped:
        were = "were" if len(skipped) > 1 else "was"
        return f"{base}; its {' and '.join(skipped)} {were} skipped (Noop hook): not repaired"
    return f"{base}; no repair step ran"


def return_destination(
    incident: IncidentView, pool: str | None, counts: PoolCounts | None
) -> str | None:
    """Where a verified node goes: the pool that gave its replacement when that pool is
    below minAvailable (and gpuheal holds the node: its own cordon), else service (None)."""
    if incident.replaced_by is None or pool is None or counts is None:
        return None
    return pool if counts.low and incident.cordoned_by_us else None
