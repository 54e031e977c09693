"""The PrfaaS scheduler's control loops: what it measures and how it re-plans (policies stay pure).

The short-term loop estimates the cross-datacenter bandwidth actually available from what the
PrfaaS senders see, and re-searches the routing threshold with the planner when it moves; the
decision itself stays in `testbed.policy.prfaas`, which only reads the resulting snapshot.

- loops:     the short-term and long-term loops of one router (ControlLoops)
- state:     what they decide and the router reads: t, scarcity, estimate, draining, events
- cluster:   what they need from the router (a protocol; they never import a service)
- spec:      their settings, the scenario's typed config models
- observed:  the planner's workload input as the run shows it (recent arrivals' lengths)
- shortterm, longterm, bandwidth, balance: the pure controllers and estimators they feed
"""
