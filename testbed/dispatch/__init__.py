"""The dispatch core (testbed.dispatch.core): one request's attempts, exclusions, reasons and
cache plan, with no I/O, shared by the live router and the sim; its constants in
testbed.dispatch.rules."""
