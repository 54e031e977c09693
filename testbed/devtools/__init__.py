"""Tools for working on the testbed itself (not used by runs)."""
