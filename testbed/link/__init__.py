"""The cross-datacenter link: a Toxiproxy-compatible emulator, its client, kernel (tc) shaping."""
