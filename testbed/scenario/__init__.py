"""Scenarios: a deployment, a workload, a policy, a nemesis timeline and checkers over a run.

Vocabulary from Jepsen: the generator submits requests, the nemesis injects faults, and the
checkers (`testbed.checkers`) assert invariants over the recorded history afterwards.
Nothing is imported here, so importing one submodule does not pull in the others.
"""
