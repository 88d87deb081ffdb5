"""The rules of the transition table, by concern (the way Corda's ``transitions`` package is).

Each module holds the rules for one part of a flow's life; :mod:`statemachine.transition`
puts them in the one table ``TRANSITIONS``, keyed by (status, event kind), and
``transition()`` looks a rule up there:

* :mod:`~statemachine.transitions.committing`: what every rule uses to journal a request,
  resume the flow, block it, and commit (checkpoint, dedup ids, outbox, effects);
* :mod:`~statemachine.transitions.starting`: a flow started here, a responder started by a
  peer's initial message, a flow restored from what the store found;
* :mod:`~statemachine.transitions.requests`: a live flow asks for something (a table of
  rules by request kind);
* :mod:`~statemachine.transitions.replay`: a restored flow asks for what its journal says;
* :mod:`~statemachine.transitions.delivery`: a message or a timer reaches the flow;
* :mod:`~statemachine.transitions.hospital`: the flow is kept for observation, or retried;
* :mod:`~statemachine.transitions.ending`: the flow returns, raises or is killed.

Every rule is pure: state and event in, a :class:`~statemachine.result.TransitionResult` out.
"""
