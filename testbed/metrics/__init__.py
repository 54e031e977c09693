"""History, per-request records, summaries, reports and timelines of a run."""
