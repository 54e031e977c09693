"""The PrfaaS scheduler's control loops: what it measures and how it re-plans (policies stay pure).

The short-term loop estimates the cross-datacenter bandwidth actually available from what the
PrfaaS senders see, and re-searches the routing threshold with the planner when it moves; the
decision itself stays in `testbed.policy.prfaas`, which only reads the resulting snapshot.
"""
