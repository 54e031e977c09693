"""Workloads: input length distributions, arrival processes and trace readers."""
