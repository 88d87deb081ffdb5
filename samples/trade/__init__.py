"""The trade sample: a buyer, a seller and a third-party approver."""

from samples.trade.flows import (
    ApprovalDecision,
    ApproverFlow,
    BuyerFlow,
    RequestApprovalFlow,
    SellerFlow,
    TradeOutcome,
    TradeProposal,
)

__all__ = [
    "ApprovalDecision",
    "ApproverFlow",
    "BuyerFlow",
    "RequestApprovalFlow",
    "SellerFlow",
    "TradeOutcome",
    "TradeProposal",
]
