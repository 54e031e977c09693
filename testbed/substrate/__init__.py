"""Substrates: where a deployment's services run (`local` processes; `compose` later)."""
