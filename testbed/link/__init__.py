"""The cross-datacenter link: a Toxiproxy-compatible emulator, its client, kernel (tc) shaping,
and a run's link on it (`deployment`). The `testbed link` commands are testbed.cli.link."""
