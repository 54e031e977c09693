"""token_exact (`engine: torch` runs): every completed request's token ids equal a single-process
generation of the same prompt, recomputed after the run.

The recomputation (torch) is the run's to provide, as a `TokenReference`
(testbed.engine.torch.reference): this checker only compares, so it imports no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from testbed.checkers.base import CheckerConfig, CheckInput, TokenReference, checker
from testbed.checkers.result import CheckResult, show_ids, vacuous
from testbed.metrics.records import RequestRecord

__all__ = ["TokenExactCheck", "check_token_exact"]


class TokenExactCheck(CheckerConfig):
    check: Literal["token_exact"] = "token_exact"


@checker(TokenExactCheck)
def token_exact(cfg: TokenExactCheck, run: CheckInput) -> CheckResult:
    return check_token_exact(run.records, run.reference)


def check_token_exact(
    records: Sequence[RequestRecord], reference: TokenReference | None
) -> CheckResult:
    """Every completed request's token ids equal a single-process greedy generation of the same
    prompt: remote prefill, the KV bytes over the link and decode from them lost nothing.

    The reference rebuilds each prompt from the record's id and length; the recorded digest
    confirms it is the prompt the router sent.
    """
    name = "token_exact"
    if reference is None:
        return CheckResult(name, False, "not an engine: torch run; nothing to compare")
    try:
        reference.prepare()
    except ImportError as exc:
        return CheckResult(name, False, f"cannot recompute: {exc}")
    completed = [r for r in records if r.status == "completed"]
    bad: list[str] = []
    missing: list[str] = []
    remote = 0
    for r in completed:
        if not r.output_ids:
            missing.append(r.id)
            continue
        digest = reference.prompt_digest(r.id, r.input_tokens)
        if r.prompt_digest is not None and digest != r.prompt_digest:
            bad.append(f"{r.id} (prompt digest differs)")
            continue
        if reference.generate(r.id, r.input_tokens, r.output_tokens) != r.output_ids:
            bad.append(r.id)
        remote += r.cross_dc
    exact = len(completed) - len(bad) - len(missing)
    detail = (
        f"{exact} of {len(completed)} completed requests token-exact "
        f"({remote} with KV across the link)"
    )
    if missing:
        detail += f"; {len(missing)} without token ids: {show_ids(missing)}"
    if bad:
        detail += f"; {len(bad)} differ from single-process generation: {show_ids(bad)}"
    if not completed:
        return vacuous(name, f"{detail}: nothing to compare")
    return CheckResult(name, not bad and not missing, detail)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "TokenExactCheck.check": (
        "tests/checkers/test_checker_fields.py::test_token_exact_compares_with_the_reference"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
