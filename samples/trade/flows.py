"""A two-party trade with a third-party approver.

The buyer proposes a trade to the seller. Before agreeing, the seller asks the approver named
in the proposal (an initiating sub flow: the approver's node starts ``ApproverFlow`` for it).
The approver accepts trades up to a value limit and timestamps its decision with the
journaled clock. The seller answers the buyer with the outcome, under a trade id drawn from
the journaled ``uuid()``, or refuses with a ``FlowException`` that reaches the buyer.
"""

from __future__ import annotations

import datetime

import attrs

from flows import (
    FlowException,
    FlowLogic,
    FlowSession,
    Party,
    initiated_by,
    initiating_flow,
    serializable,
    startable_by_rpc,
)

APPROVAL_LIMIT_CENTS = 1_000_000
"""The approver refuses trades worth more than this (in cents)."""


@serializable
@attrs.frozen
class TradeProposal:
    """What the buyer offers: ``quantity`` of ``item`` at ``unit_price_cents`` each."""

    item: str
    quantity: int
    unit_price_cents: int
    buyer: Party
    approver: Party

    @property
    def value_cents(self) -> int:
        """Total value of the trade."""
        return self.quantity * self.unit_price_cents


@serializable
@attrs.frozen
class ApprovalDecision:
    """The approver's answer, with the (journaled) time it was made, in epoch seconds."""

    approved: bool
    reason: str
    decided_at: float


@serializable
@attrs.frozen
class TradeOutcome:
    """The agreed trade."""

    trade_id: str
    proposal: TradeProposal
    seller: Party
    decision: ApprovalDecision


@initiating_flow
@startable_by_rpc
class BuyerFlow(FlowLogic[TradeOutcome]):
    """Propose a trade to ``seller``; returns the agreed outcome or raises the refusal."""

    def __init__(
        self, seller: Party, approver: Party, item: str, quantity: int, unit_price_cents: int
    ) -> None:
        self.seller = seller
        self.approver = approver
        self.item = item
        self.quantity = quantity
        self.unit_price_cents = unit_price_cents

    def call(self) -> TradeOutcome:
        """Send the proposal, check the answer matches it."""
        self.progress("Proposing the trade")
        proposal = TradeProposal(
            self.item, self.quantity, self.unit_price_cents, self.our_identity, self.approver
        )
        session = self.initiate_flow(self.seller)
        session.send(proposal)
        self.progress("Waiting for the seller's answer")

        def check(outcome: TradeOutcome) -> TradeOutcome:
            if outcome.proposal != proposal or outcome.seller != self.seller:
                raise FlowException(f"the seller answered a different trade: {outcome}")
            return outcome

        return session.receive(TradeOutcome).unwrap(check)


@initiated_by(BuyerFlow)
class SellerFlow(FlowLogic[TradeOutcome]):
    """Check the proposal, get it approved, answer the buyer."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> TradeOutcome:
        """Receive, approve (sub flow), answer."""

        def check(proposal: TradeProposal) -> TradeProposal:
            if proposal.buyer != self.session.counterparty:
                raise FlowException(f"{self.session.counterparty} proposed on behalf of others")
            if proposal.quantity <= 0 or proposal.unit_price_cents <= 0:
                raise FlowException(f"quantity and price must be positive: {proposal}")
            return proposal

        proposal = self.session.receive(TradeProposal).unwrap(check)
        self.progress("Waiting for approval")
        decision = self.sub_flow(RequestApprovalFlow(proposal))
        if not decision.approved:
            raise FlowException(f"trade refused by {proposal.approver}: {decision.reason}")
        outcome = TradeOutcome(self.uuid(), proposal, self.our_identity, decision)
        self.session.send(outcome)
        return outcome


@initiating_flow
class RequestApprovalFlow(FlowLogic[ApprovalDecision]):
    """Sub flow: ask the proposal's approver for a decision."""

    def __init__(self, proposal: TradeProposal) -> None:
        self.proposal = proposal

    def call(self) -> ApprovalDecision:
        """Send the proposal to the approver and return its decision."""
        session = self.initiate_flow(self.proposal.approver)
        return session.send_and_receive(ApprovalDecision, self.proposal).unwrap(lambda d: d)


@initiated_by(RequestApprovalFlow)
class ApproverFlow(FlowLogic[ApprovalDecision]):
    """Approve trades up to ``APPROVAL_LIMIT_CENTS``."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> ApprovalDecision:
        """Decide and answer."""
        proposal = self.session.receive(TradeProposal).unwrap(lambda p: p)
        decided_at = self.now().timestamp()
        if proposal.value_cents > APPROVAL_LIMIT_CENTS:
            limit = APPROVAL_LIMIT_CENTS / 100
            decision = ApprovalDecision(
                False, f"value exceeds the limit of {limit:.2f}", decided_at
            )
        else:
            decision = ApprovalDecision(True, "within limit", decided_at)
        self.session.send(decision)
        return decision


def describe(outcome: TradeOutcome) -> str:
    """One line about a trade, for the CLI."""
    when = datetime.datetime.fromtimestamp(outcome.decision.decided_at, tz=datetime.UTC)
    p = outcome.proposal
    return (
        f"trade {outcome.trade_id}: {p.quantity} x {p.item} at {p.unit_price_cents / 100:.2f} "
        f"from {outcome.seller.organisation} to {p.buyer.organisation}, approved {when:%H:%M:%S}"
    )
