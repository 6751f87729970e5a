"""Trusting a node's host key, as an action: its checks, plan, run and audit records.

nodes/trust.py reads known_hosts and writes the one line; this module decides whether the action
may run and audits every outcome, so the console only shows the plan, asks, and calls `answer`.

- refused (audited when the node waits on its key): the node is not reached over SSH or waits on
  nothing, the console is read-only, or the key cannot be planned;
- a CHANGED key is planned but refused (audited): the console shows why and the commands to run;
- an UNKNOWN key is confirmed by the user, audited (confirmed) before known_hosts is written, and a
  write that fails is audited (failed).
"""

from typing import Any, Callable, Optional, Tuple

from opsconsole.actions.plan import Refused
from opsconsole.audit_outcomes import OUTCOME_CANCELLED, OUTCOME_CONFIRMED, OUTCOME_FAILED, OUTCOME_OK, OUTCOME_REFUSED
from opsconsole.model import STATE_HOSTKEY, NodeState

ACTION_TRUST_HOSTKEY = "trust_hostkey"

# (action, node, detail, outcome) -> True when the record was written (the console's app.audit).
Audit = Callable[[str, str, str, str], bool]


def plan_trust_action(name: str, state: Optional[NodeState], link: Any, read_only: bool, audit: Audit) -> Any:
    """The TrustPlan for node `name` (nodes.trust), or Refused with the line to show.

    Loads asyncssh (through nodes.trust): only when the action is asked for.
    """
    from opsconsole.nodes.trust import plan_trust, ssh_link_of

    if state is None or ssh_link_of(link) is None:
        raise Refused("%s is not reached over SSH: no host key to trust" % name)
    if state.state != STATE_HOSTKEY:
        raise Refused("%s is %s: no host key waits to be trusted" % (name, state.state))
    if read_only:
        audit(ACTION_TRUST_HOSTKEY, name, "read-only console; fingerprint %s" % state.fingerprint, OUTCOME_REFUSED)
        raise Refused("read-only console [R]: trusting host keys is off")
    plan = plan_trust(state, link)
    if isinstance(plan, str):
        audit(ACTION_TRUST_HOSTKEY, name, plan, OUTCOME_REFUSED)
        raise Refused(plan)
    if plan.changed:  # shown with the old lines and the commands to remove them; never written here
        audit(ACTION_TRUST_HOSTKEY, name, "changed key, known_hosts not edited: " + plan.detail(), OUTCOME_REFUSED)
    return plan


def answer(plan: Any, confirmed: bool, audit: Audit) -> Tuple[str, str]:
    """Carry out the user's answer to an UNKNOWN key's plan: (outcome, the line to show).

    The confirmed record is written before known_hosts is: an action that cannot be audited is not done.
    OUTCOME_OK means the key is trusted and the node can be retried now.
    """
    from opsconsole.nodes.trust import trust_planned_key

    if not confirmed:
        audit(ACTION_TRUST_HOSTKEY, plan.node, plan.detail(), OUTCOME_CANCELLED)
        return OUTCOME_CANCELLED, "host key of %s not trusted" % plan.node
    if plan.changed:
        return OUTCOME_REFUSED, "host key of %s changed: not trusted" % plan.node
    if not audit(ACTION_TRUST_HOSTKEY, plan.node, plan.detail(), OUTCOME_CONFIRMED):
        return OUTCOME_FAILED, "host key of %s not trusted: the audit log could not be written" % plan.node
    problem = trust_planned_key(plan)
    if problem:
        audit(ACTION_TRUST_HOSTKEY, plan.node, "%s: %s" % (plan.detail(), problem), OUTCOME_FAILED)
        return OUTCOME_FAILED, problem
    # Its result too, as every other action's record has one after its confirmed one.
    audit(ACTION_TRUST_HOSTKEY, plan.node, plan.detail(), OUTCOME_OK)
    return OUTCOME_OK, "trusted %s %s for %s; connecting" % (plan.key_type, plan.fingerprint, plan.node)
