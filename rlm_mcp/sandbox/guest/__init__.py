"""Code that runs inside the sandbox (any backend): the kernel, the answer rules, the bootstrap.

`kernel.py` and `answer_rules.py` are stdlib only and import-free: their source is sent over the
kernel channel and exec'd by the bootstrap command (`bootstrap.py`), so any image with python3
can be a sandbox. The host imports `answer_rules` and `bootstrap` as ordinary modules.
"""
