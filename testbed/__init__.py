"""prfaas-testbed: live emulation of cross-datacenter prefill/decode (PrfaaS-PD) LLM serving."""

__version__ = "0.1.0"
