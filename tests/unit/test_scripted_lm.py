"""The scripted OpenAI-compatible server, spoken to with plain HTTP clients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rlm_mcp.testing import Script, ScriptedLM, count_prompt_tokens, count_text_tokens
from rlm_mcp.testing.script import render_reply

SYSTEM = {"role": "system", "content": "sys"}


def root_messages(query: str, turns: int) -> list[dict[str, str]]:
    """A root conversation after `turns - 1` completed turns."""
    messages = [SYSTEM, {"role": "user", "content": f"Answer the following: {query}"}]
    for k in range(1, turns):
        messages += [
            {"role": "user", "content": f"Turn {k}:"},
            {"role": "assistant", "content": f"a{k}"},
            {"role": "user", "content": "REPL output:"},
        ]
    return [*messages, {"role": "user", "content": f"Turn {turns}:"}]


def chat(client: httpx.Client, lm: ScriptedLM, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return client.post(
        f"{lm.base_url}/chat/completions",
        json={"model": lm.script.model, "messages": messages, "max_tokens": 100, **extra},
    )


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_root_turns_by_assistant_count_repeat_and_default() -> None:
    with ScriptedLM({"root": ["t1", "t2"]}) as lm, httpx.Client() as client:
        assert [text_of(chat(client, lm, root_messages("q", t))) for t in (1, 2, 3, 4)] == ["t1", "t2", "t2", "t2"]
        assert [(r["role"], r["turn"]) for r in lm.requests] == [("root", 1), ("root", 2), ("root", 3), ("root", 4)]
    with ScriptedLM({"root": ["t1"], "root_default": "done"}) as lm, httpx.Client() as client:
        assert [text_of(chat(client, lm, root_messages("q", t))) for t in (1, 2)] == ["t1", "done"]


def test_root_by_query_scripts_child_runs() -> None:
    script = {"root": ["parent"], "root_by_query": [{"match": r"summarise chunk \d+", "replies": ["child1", "child2"]}]}
    with ScriptedLM(script) as lm, httpx.Client() as client:
        assert text_of(chat(client, lm, root_messages("big question", 1))) == "parent"
        assert text_of(chat(client, lm, root_messages("summarise chunk 7", 1))) == "child1"
        assert text_of(chat(client, lm, root_messages("summarise chunk 7", 2))) == "child2"


def test_sub_rules_templates_and_default() -> None:
    script = {
        "sub": [
            {"match": r"(?P<word>\w+) in French", "reply": "fr:\\g<word>"},
            {"match": r"echo", "reply": "you said {prompt}"},
            {"match": r"code", "reply": "print('a\\nb', {1: 2})"},
        ],
        "sub_default": "default for {prompt}",
    }
    with ScriptedLM(script) as lm, httpx.Client() as client:

        def sub(prompt: str) -> str:
            return text_of(chat(client, lm, [{"role": "user", "content": prompt}]))

        assert sub("say cat in French") == "fr:cat"
        assert sub("echo this") == "you said echo this"
        assert sub("code please") == "print('a\\nb', {1: 2})"  # braces and backslashes untouched
        assert sub("other") == "default for other"
        assert {r["role"] for r in lm.requests} == {"sub"} and lm.requests[0]["turn"] is None


def test_render_reply_keeps_unknown_groups() -> None:
    import re

    assert render_reply("\\1-\\2", re.search(r"(a)", "a"), "p") == "a-\\2"


def test_callables_in_process() -> None:
    script = Script(
        root_fn=lambda messages, turn: f"turn {turn} of {len(messages)}", sub_fn=lambda prompt: prompt.upper()
    )
    with ScriptedLM(script) as lm, httpx.Client() as client:
        assert text_of(chat(client, lm, root_messages("q", 2))) == "turn 2 of 6"
        assert text_of(chat(client, lm, [{"role": "user", "content": "hi"}])) == "HI"


def test_models_tokenize_health_shapes() -> None:
    with ScriptedLM({"max_model_len": 2048, "extra_models": ["other"]}) as lm, httpx.Client() as client:
        cards = client.get(f"{lm.base_url}/models").json()["data"]
        assert cards[0]["id"] == lm.script.base_model and cards[0]["max_model_len"] == 2048
        assert cards[0]["parent"] is None
        assert [(c["id"], c["parent"], c["max_model_len"]) for c in cards[1:]] == [
            ("rlm-v0.1", lm.script.base_model, None),
            ("other", lm.script.base_model, None),
        ]
        messages = root_messages("q", 1)
        tok = client.post(
            f"{lm.root_url}/tokenize", json={"model": "rlm-v0.1", "messages": messages, "add_generation_prompt": True}
        ).json()
        assert tok["count"] == count_prompt_tokens(messages) and tok["max_model_len"] == 2048
        assert len(tok["tokens"]) == tok["count"]
        assert client.get(f"{lm.root_url}/health").status_code == 200
        usage = chat(client, lm, messages).json()["usage"]
        assert usage["prompt_tokens"] == tok["count"]
        assert usage["completion_tokens"] == count_text_tokens("")
    with ScriptedLM({"tokenize": False, "models_endpoint": False, "health": False}) as lm, httpx.Client() as client:
        assert client.get(f"{lm.base_url}/models").status_code == 404
        assert client.post(f"{lm.root_url}/tokenize", json={"prompt": "x"}).status_code == 404
        assert client.get(f"{lm.root_url}/health").status_code == 404


def test_window_enforcement_like_vllm() -> None:
    with ScriptedLM({"max_model_len": 100, "sub_default": "y" * 400}) as lm, httpx.Client() as client:
        too_long = chat(client, lm, [{"role": "user", "content": "x" * 400}], max_tokens=10)
        assert too_long.status_code == 400
        assert too_long.json()["error"]["message"].startswith(
            "This model's maximum context length is 100 tokens. However, your prompt contains 107 input tokens"
        )
        too_many = chat(client, lm, [{"role": "user", "content": "x"}], max_tokens=101)
        assert too_many.status_code == 400
        assert "max_tokens=101 cannot be greater than max_model_len=100" in too_many.json()["error"]["message"]
        # Prompt 4+10+3 = 17 tokens; max_tokens 90 is clamped to 83; the 100-token reply is cut.
        clamped = chat(client, lm, [{"role": "user", "content": "x" * 40}], max_tokens=90).json()
        assert clamped["choices"][0]["finish_reason"] == "length"
        assert clamped["usage"] == {"prompt_tokens": 17, "completion_tokens": 83, "total_tokens": 100}
        assert clamped["choices"][0]["message"]["content"] == "y" * 332


def test_unknown_model_is_404_with_vllm_text() -> None:
    with ScriptedLM() as lm, httpx.Client() as client:
        response = chat(client, lm, [{"role": "user", "content": "q"}], model="ghost")
        assert response.status_code == 404
        assert response.json()["error"]["message"].startswith("The model `ghost` does not exist.")


def test_faults_by_role_turn_and_times() -> None:
    script = {
        "root": ["r1", "r2"],
        "faults": [
            {"when": "root", "turn": 2, "status": 503, "times": 1, "retry_after": 2},
            {"when": "sub", "match": "bad", "status": 500, "body": {"custom": True}, "times": 0},
            {"when": "sub", "match": "finish", "status": 200, "delay_s": 0.01, "times": 1},
        ],
    }
    with ScriptedLM({**script, "finish_reason": "length"}) as lm, httpx.Client() as client:
        assert text_of(chat(client, lm, root_messages("q", 1))) == "r1"
        failed = chat(client, lm, root_messages("q", 2))
        assert failed.status_code == 503 and failed.headers["retry-after"] == "2"
        assert text_of(chat(client, lm, root_messages("q", 2))) == "r2"  # spent after one use
        for _ in range(2):
            bad = chat(client, lm, [{"role": "user", "content": "bad"}])
            assert bad.status_code == 500 and bad.json() == {"custom": True}
        ok = chat(client, lm, [{"role": "user", "content": "finish"}]).json()
        assert ok["choices"][0]["finish_reason"] == "length"  # the script-wide override
        assert [r["status"] for r in lm.requests] == [200, 503, 200, 500, 500, 200]


def test_keep_alive_uses_one_connection() -> None:
    with ScriptedLM() as lm, httpx.Client() as client:
        for i in range(20):
            assert text_of(chat(client, lm, [{"role": "user", "content": str(i)}])) == "ok"
        assert lm.connections == 1


@pytest.mark.anyio
async def test_many_concurrent_clients() -> None:
    async with ScriptedLM({"delay_s": {"sub": 0.2}, "sub": [{"match": r"(\d+)", "reply": "n\\1"}]}) as lm:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(limits=limits) as client:
            results: dict[int, str] = {}

            async def one(i: int) -> None:
                r = await client.post(
                    f"{lm.base_url}/chat/completions",
                    json={"model": "rlm-v0.1", "messages": [{"role": "user", "content": str(i)}], "max_tokens": 10},
                )
                results[i] = r.json()["choices"][0]["message"]["content"]

            async with anyio.create_task_group() as tg:
                for i in range(80):
                    tg.start_soon(one, i)
        assert results == {i: f"n{i}" for i in range(80)}
        assert lm.max_in_flight > 1
        assert len(lm.requests) == 80


def test_subprocess_cli_with_port_file_and_log(tmp_path: Path) -> None:
    script_file, port_file, log_file = tmp_path / "s.json", tmp_path / "url", tmp_path / "log.jsonl"
    script_file.write_text(json.dumps({"root": ["hello from json"], "max_model_len": 4096}))
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlm_mcp.testing.scripted_lm",
            "--script",
            str(script_file),
            "--port-file",
            str(port_file),
            "--log",
            str(log_file),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
            assert port_file.read_text().strip() == url
            with httpx.Client() as client:
                r = client.post(
                    f"{url}/chat/completions",
                    json={"model": "rlm-v0.1", "messages": root_messages("q", 1), "max_tokens": 5},
                )
                assert text_of(r) == "hello from json"
                assert client.get(f"{url}/models").json()["data"][0]["max_model_len"] == 4096
        finally:
            proc.terminate()
            assert proc.wait(10) == 0
    entries = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [(e["role"], e["turn"], e["model"], e["status"]) for e in entries] == [("root", 1, "rlm-v0.1", 200)]
    assert entries[0]["body"]["max_tokens"] == 5


def test_script_loads_from_json_file(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {"sub": [{"match": "a", "reply": "b"}], "faults": [{"when": "root", "turn": 3}], "delay_s": {"root": 0.5}}
        )
    )
    script = Script.load(path)
    assert script.sub[0].reply == "b" and script.faults[0].error_status() == 500
    assert script.delay_for("root") == 0.5 and script.delay_for("sub") == 0.0


def test_process_helper_carries_the_script_and_log(tmp_path: Path) -> None:
    from rlm_mcp.testing import read_log, scripted_lm_process

    log_file = tmp_path / "requests.jsonl"
    script = Script(sub_default="from {prompt}", sub_fn=lambda p: "callables stay in process")
    with scripted_lm_process(script, log_path=log_file) as url, httpx.Client() as client:
        r = client.post(
            f"{url}/chat/completions", json={"model": "rlm-v0.1", "messages": [{"role": "user", "content": "x"}]}
        )
        assert text_of(r) == "from x"
    assert [(e["role"], e["status"]) for e in read_log(log_file)] == [("sub", 200)]


def test_process_helper_runs_another_interpreter_in_its_folder_on_a_raw_script(tmp_path: Path) -> None:
    # Another checkout's scripted LM (bench/compare_reference.py --lm-python): its interpreter,
    # from its own folder, on the script file exactly as written (never re-read by this checkout).
    import os
    import sys

    from rlm_mcp.testing import scripted_lm_process

    work = tmp_path / "work"
    work.mkdir()
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\npwd > ran-here\nexec {sys.executable} "$@"\n', encoding="utf-8")
    os.chmod(python, 0o755)
    raw = tmp_path / "script.json"
    raw.write_text('{"sub_default": "raw {prompt}"}', encoding="utf-8")
    with scripted_lm_process(raw, python=python, cwd=work) as url, httpx.Client() as client:
        r = client.post(
            f"{url}/chat/completions", json={"model": "rlm-v0.1", "messages": [{"role": "user", "content": "x"}]}
        )
        assert text_of(r) == "raw x"
    assert (work / "ran-here").read_text(encoding="utf-8").strip() == str(work)
    assert raw.read_text(encoding="utf-8") == '{"sub_default": "raw {prompt}"}'


def test_a_kept_alive_connection_survives_delayed_replies() -> None:
    # The delay watches the socket for a hang-up; the next request on the same connection must
    # still be read (it used to fail with "read() called while another coroutine is waiting").
    with ScriptedLM({"delay_s": 0.05, "sub_default": "fine"}) as lm, httpx.Client() as client:
        for _ in range(3):
            response = chat(client, lm, [{"role": "user", "content": "hi"}])
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"] == "fine"
        assert lm.connections == 1
        assert [r["status"] for r in lm.requests] == [200, 200, 200]
