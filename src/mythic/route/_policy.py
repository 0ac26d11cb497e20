"""The tier policy: which tier serves a request, from its kind, context size, deadline,
the NPC's archetype and a cost weight. Pure and synchronous: decided on the caller's path."""

from __future__ import annotations

from dataclasses import dataclass

from mythic.config import REQUEST_KINDS, TOOL_KINDS, RouteRule, RouteSettings

TIER_ORDER = ("gold", "silver", "bronze")
"""Smallest and fastest first: a request too big for its tier moves right."""


class UnknownKindError(ValueError):
    """A request names a kind the router does not know."""


@dataclass(frozen=True, slots=True)
class RouteDecision:
    tier: str
    rule: int
    """Index of the matching rule in the effective rules."""
    reason: str


class TierPolicy:
    """Maps requests to tiers by the first matching rule, then moves a request whose context
    is larger than its tier takes to the next tier (gold, silver, bronze, then the others)."""

    def __init__(self, route: RouteSettings) -> None:
        self.route = route
        self.rules = route.rules
        named = [t for t in TIER_ORDER if t in route.tiers]
        self.order = named + sorted(set(route.tiers) - set(named))

    def decide(
        self,
        kind: str,
        *,
        context_tokens: int = 0,
        deadline_s: float | None = None,
        archetype: str | None = None,
        cost: float = 1.0,
    ) -> RouteDecision:
        """The tier for one request.

        Raises:
            UnknownKindError: `kind` is not one of `REQUEST_KINDS`.
        """
        if kind not in REQUEST_KINDS:
            raise UnknownKindError(f"unknown request kind {kind!r}; kinds: {REQUEST_KINDS}")
        for i, rule in enumerate(self.rules):
            if _matches(rule, kind, context_tokens, deadline_s, archetype, cost):
                return self._fit(kind, rule.tier, i, context_tokens)
        raise AssertionError("the default rules cover every kind")  # pragma: no cover

    def _fit(self, kind: str, tier: str, rule: int, context_tokens: int) -> RouteDecision:
        reason = f"rule {rule}"
        settings = self.route.tiers[tier]
        limit = settings.max_context_tokens
        if limit is None or context_tokens <= limit:
            return RouteDecision(tier, rule, reason)
        for bigger in self.order[self.order.index(tier) + 1 :]:
            candidate = self.route.tiers[bigger]
            if kind in TOOL_KINDS and not candidate.tools:
                continue
            if candidate.max_context_tokens is None or context_tokens <= (
                candidate.max_context_tokens
            ):
                return RouteDecision(
                    bigger, rule, f"{reason}; {context_tokens} tokens > {tier}'s {limit}"
                )
        return RouteDecision(tier, rule, f"{reason}; no tier takes {context_tokens} tokens")


def _matches(
    rule: RouteRule,
    kind: str,
    context_tokens: int,
    deadline_s: float | None,
    archetype: str | None,
    cost: float,
) -> bool:
    if rule.kinds and kind not in rule.kinds:
        return False
    if rule.archetypes and archetype not in rule.archetypes:
        return False
    if rule.min_context_tokens is not None and context_tokens < rule.min_context_tokens:
        return False
    if rule.max_context_tokens is not None and context_tokens > rule.max_context_tokens:
        return False
    if rule.max_deadline_s is not None and (deadline_s is None or deadline_s > rule.max_deadline_s):
        return False
    return rule.min_cost is None or cost >= rule.min_cost
