"""One module per nemesis action: the model of its scenario entry and its Fault, registered with
`@ACTIONS.register` (testbed.nemesis.fault). Every module here is imported when the registry is
first read, so a new action is one new file (docs/extending.md). Nothing is imported here."""
