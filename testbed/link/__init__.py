"""The cross-datacenter link: a Toxiproxy-compatible emulator, its client and kernel (tc) shaping."""
