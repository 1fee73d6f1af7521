"""A policy: an ordered list of compiled rules, whichever format they were written in.

Both formats (k8s-keystone-auth's policy file, :mod:`.keystone_policy`, and the
gateway's own ``authorization.rules``, :mod:`.own_rules`) compile to :class:`Rule`: a
check on the review and what follows when it holds. The first rule that holds decides;
when none does, the answer is "no opinion" and kube-apiserver asks its next authorizer
(RBAC, as the deploy configures it). A keystone policy only allows (its authorizer
answers allow or "No policy matched.", which its webhook sends as ``allowed: false``
alone, that is no opinion), so "first" and "any" decide alike there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from authn_gateway.authorization.sar import API_VERSIONS, AccessReview, render_status

Effect = Literal["allow", "deny"]

#: Whether a rule holds for a review: all of a rule's conditions, compiled to one call.
Check = Callable[[AccessReview], bool]

#: The answer's kind: the metric label and the log's word for it.
ALLOWED, DENIED, NO_OPINION = "allowed", "denied", "no_opinion"


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a policy. ``where`` names it in reasons and logs, e.g.
    ``policy.json [3]`` or ``authorization.rules[0]``."""

    where: str
    effect: Effect
    holds: Check


@dataclass(frozen=True, slots=True)
class Answer:
    """A decision as kube-apiserver receives it, rendered once per policy."""

    kind: str
    # One body per apiVersion: the answer carries the request's.
    bodies: dict[str, bytes]

    @classmethod
    def render(cls, kind: str, reason: str, error: str = "") -> Answer:
        return cls(
            kind,
            {
                v: render_status(v, kind == ALLOWED, kind == DENIED, reason, error)
                for v in API_VERSIONS
            },
        )


def answer_for(rule: Rule) -> Answer:
    verb = "allowed" if rule.effect == "allow" else "denied"
    return Answer.render(ALLOWED if rule.effect == "allow" else DENIED, f"{verb} by {rule.where}")


NO_RULE_MATCHED = Answer.render(NO_OPINION, "authn-gateway: no rule matched")


@dataclass(frozen=True, slots=True)
class Policy:
    """The rules in force, in order, with each one's answer rendered."""

    rules: tuple[Rule, ...]
    # Where the rules came from, for logs: "policy.json (12 rules), authorization.rules (2)".
    description: str
    _answers: tuple[Answer, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_answers", tuple(answer_for(r) for r in self.rules))

    def decide(self, review: AccessReview) -> Answer:
        """The first rule that holds decides; none: no opinion."""
        for rule, answer in zip(self.rules, self._answers, strict=True):
            if rule.holds(review):
                return answer
        return NO_RULE_MATCHED


def policy_of(parts: Sequence[tuple[str, Sequence[Rule]]]) -> Policy:
    """One policy from its parts, in order: ``[(source, rules), ...]``."""
    rules = tuple(r for _, part in parts for r in part)
    described = ", ".join(f"{source} ({len(part)} rules)" for source, part in parts)
    return Policy(rules, described or "no rules")
