"""Remote prefill with the real model: real tensors through KVSender, the link emulator and
KVReceiver, decoded token-exact; cuts are retried, flipped bytes are caught and never decoded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import torch  # noqa: F401  (fail loudly here if the model extra is missing)
except ImportError as exc:
    raise ImportError(
        "the torch tests need torch: pip install -e '.[dev,model]' (or `make test`)"
    ) from exc

from testbed.engine.torch import TinyConfig, TinyHybridLM, TorchDecodeEngine, TorchPrefillEngine
from testbed.engine.torch.model import generate
from testbed.engine.torch.verify import VerifyOptions, run_verify
from testbed.transfer import KVReceiver, KVSender, TransferError
from testbed.transfer.fault_proxy import FaultProxy

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


async def test_verify_harness_is_exact_on_every_path() -> None:
    """Acceptance 1 and 2 in one run: shaped link, prefix hit, cut + retry, flipped byte."""
    report = await run_verify(
        VerifyOptions(prompts=6, seed=5, max_new_tokens=6, time_scale=0, concurrency=3)
    )
    assert report["failures"] == []
    for key in (
        "token_exact",
        "prefix_hit_exact",
        "reset_retried_exact",
        "corrupt_detected",
        "corrupt_retried_exact",
    ):
        assert report[key] == 6, key
    assert report["ok"] is True
    assert report["prefix_hit_tokens"] > 0
    assert report["transfer_retries"] >= 6  # every cut was survived by a retry
    assert report["checksum_failures"] == 6  # every flipped byte was caught


async def test_flipped_byte_fails_the_request_with_a_reason_and_nothing_is_decoded() -> None:
    model = TinyHybridLM(TinyConfig(seed=1))
    prompt = list(range(7, 57))
    res = await TorchPrefillEngine(model).run(prompt)
    async with KVReceiver(keep_payload=True, frame_timeout=5.0) as rx:
        rx.expect("bad")
        rx.expect("good")  # a receiver accepts frames only for ids it expects
        async with (
            FaultProxy(rx.port, flip_at=48 + 3 + 100) as flip,
            KVSender("127.0.0.1", flip.port, connections=1, max_retries=0) as sender,
        ):
            with pytest.raises(TransferError, match=r"(?i)checksum"):
                async with sender.open("bad", res.layer_sizes) as tx:
                    for i, data in enumerate(res.layers):
                        await tx.send_layer(i, data)
                    await tx.finish(timeout=10)
        assert flip.flips_done == 1
        assert rx.status("bad") == "failed"
        with pytest.raises(TransferError):
            await rx.wait("bad", 1)
        with pytest.raises(KeyError):
            rx.take_payload("bad")  # a failed request never hands bytes to the decoder
        # the same transfer cache over a clean connection decodes exactly
        async with KVSender("127.0.0.1", rx.port, connections=2) as sender:
            async with sender.open("good", res.layer_sizes) as tx:
                for i, data in enumerate(res.layers):
                    await tx.send_layer(i, data)
            await rx.wait("good", 5)
            dec = TorchDecodeEngine(model)
            state = dec.restore(rx.take_payload("good"))
            assert await dec.generate(state, res.first_token, 8) == generate(model, prompt, 8)


def test_verify_model_cli_prints_json_and_exits_zero() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "verify-model", "--prompts", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["prompts"] == 3 and doc["token_exact"] == 3 and doc["ok"] is True
    assert {"prefix_hit_exact", "reset_retried_exact", "corrupt_detected"} <= set(doc)
    assert doc["timing"]["time_scale"] == 10.0
