"""Run one RLM completion with the reference library itself (rlms 0.1.3), as the adapter card
shows it: backend "vllm" at an OpenAI-compatible URL, environment "local", depth 1; or, for a
job with "session" (a list of {"context", "query"}), one completion per step in persistent mode
(`RLM(persistent=True)`: one REPL, context_i and history_i).

Run by the reference venv's interpreter (never imported by the tests): reads a JSON job on
stdin, prints the final answer(s) as JSON on stdout.
"""

import json
import sys

from rlm import RLM


def main() -> None:
    job = json.load(sys.stdin)
    steps = job.get("session")
    rlm = RLM(
        backend="vllm",
        backend_kwargs={"model_name": job["model"], "base_url": job["base_url"], "api_key": "EMPTY"},
        environment="local",
        max_depth=1,
        max_iterations=job["max_iterations"],
        persistent=steps is not None,
    )
    if steps is None:
        result = rlm.completion(job["context"], root_prompt=job["query"])
        json.dump({"answer": result.response}, sys.stdout)
        return
    answers = [rlm.completion(step["context"], root_prompt=step["query"]).response for step in steps]
    rlm.close()
    json.dump({"answers": answers}, sys.stdout)


if __name__ == "__main__":
    main()
