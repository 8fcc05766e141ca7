"""The scripted server's latency model: per-call delay, a decode rate and a concurrency limit
with a queue (what bench/lm_time.py measures rlm-mcp against)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pydantic
import pytest

from rlm_mcp.testing import Script, ScriptedLM, count_text_tokens

REPLY = "x" * 40  # 10 tokens


def body(i: int) -> dict[str, object]:
    return {"model": "rlm-v0.1", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 100}


@pytest.mark.anyio
async def test_requests_past_the_limit_queue_and_are_all_answered() -> None:
    async with ScriptedLM({"delay_s": 0.05, "max_concurrency": 2, "sub_default": "a{prompt}"}) as lm:
        answers: dict[int, str] = {}
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=20)) as client:

            async def one(i: int) -> None:
                r = await client.post(f"{lm.base_url}/chat/completions", json=body(i))
                answers[i] = r.json()["choices"][0]["message"]["content"]

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
        assert answers == {i: f"aq{i}" for i in range(8)}
        assert 1 <= lm.max_serving <= 2  # never more served at once than the limit
        assert lm.serving == 0 and lm.in_flight == 0
        assert all(r["queued_s"] >= 0 and r["status"] == 200 for r in lm.requests)


def test_without_a_limit_nothing_queues() -> None:
    with ScriptedLM({"sub_default": "ok"}) as lm, httpx.Client() as client:
        client.post(f"{lm.base_url}/chat/completions", json=body(0))
        assert [r["queued_s"] for r in lm.requests] == [0.0]


def test_the_decode_rate_adds_completion_tokens_over_rate_to_the_delay() -> None:
    script = {"delay_s": {"sub": 0.01}, "tokens_per_s": {"sub": 1000.0}, "sub_default": REPLY}
    with ScriptedLM(script) as lm, httpx.Client() as client:
        r = client.post(f"{lm.base_url}/chat/completions", json=body(0))
        assert r.json()["usage"]["completion_tokens"] == 10
        assert lm.requests[0]["scripted_latency_s"] == pytest.approx(0.01 + 10 / 1000)


def test_script_latency_helpers() -> None:
    script = Script(delay_s={"root": 0.5, "sub": 0.1}, tokens_per_s={"root": 50.0})
    assert script.decode_s("root", 25) == 0.5 and script.decode_s("sub", 25) == 0.0
    assert script.scripted_latency_s("root", REPLY) == 0.5 + count_text_tokens(REPLY) / 50
    assert Script(tokens_per_s=100.0).scripted_latency_s("sub", REPLY) == 0.1
    with pytest.raises(pydantic.ValidationError):
        Script(max_concurrency=0)


def test_cli_flags_set_the_latency_model(tmp_path: Path) -> None:
    log_file = tmp_path / "log.jsonl"
    args = ["--tokens-per-s", "1000", "--delay-s", "0.002", "--max-concurrency", "1", "--log", str(log_file)]
    with subprocess.Popen(
        [sys.executable, "-m", "rlm_mcp.testing.scripted_lm", *args], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            with httpx.Client() as client:
                r = client.post(
                    f"{url}/chat/completions", json={**body(0), "messages": [{"role": "user", "content": "q"}]}
                )
                assert r.status_code == 200
        finally:
            proc.terminate()
            assert proc.wait(10) == 0
    (entry,) = [json.loads(line) for line in log_file.read_text().splitlines()]
    # "ok" is 1 token: 0.002 s of latency + 1 / 1000 s of decode
    assert entry["scripted_latency_s"] == pytest.approx(0.003) and entry["queued_s"] >= 0


class _Clock:
    """A clock the test moves: the sub-call's reply function advances it (the server's own work
    on a request), and each of the server's waits advances it by what was waited."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def wait(self, delay: float, reader: object, buf: object) -> bool:
        self.waits.append(round(delay, 9))
        self.now += delay
        return False  # the client stayed


@pytest.mark.parametrize(("work", "waits"), [(0.0, [0.5, 0.25]), (0.1, [0.5, 0.15]), (0.6, [0.5])])
def test_the_servers_own_work_is_within_the_scripted_latency(
    monkeypatch: pytest.MonkeyPatch, work: float, waits: list[float]
) -> None:
    """A served request is answered when its scripted latency, counted from when it was served,
    has passed: time the server spent building the reply shortens the wait, instead of holding
    the slot past the script (decode 0.25 s: 10 tokens at 40/s)."""
    clock = _Clock()

    def reply(prompt: str) -> str:
        clock.now += work  # building this reply took `work` seconds of the server's time
        return REPLY

    monkeypatch.setattr("rlm_mcp.testing.chat_serving.wait_or_disconnect", clock.wait)
    script = Script(delay_s={"sub": 0.5}, tokens_per_s={"sub": 40.0}, sub_fn=reply)
    with ScriptedLM(script) as lm, httpx.Client() as client:
        lm._clock = clock
        r = client.post(f"{lm.base_url}/chat/completions", json=body(0))
        assert r.json()["choices"][0]["message"]["content"] == REPLY
    assert clock.waits == waits
    assert lm.requests[0]["scripted_latency_s"] == pytest.approx(0.75)  # what the script says, as before
