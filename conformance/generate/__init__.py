"""The generation lane: greedy decoding of causal LMs on a target against the CPU, per prompt-length
bucket, dtype and mode, as a serving team replays prompts before it moves inference.

- :mod:`.lms`    the causal LMs (transformers' causal-LM mapping, the zoo's tiny configs) and prompts;
- :mod:`.decode` ``generate`` with a server's KV cache, each step timed, its logits kept;
- :mod:`.judge`  the near-tie rule, the log-likelihood bound, an item's verdict;
- :mod:`.lane`   the work kind (``conformance run --generate hf``), rows in opdb's ``gen_results``;
- :mod:`.gate`   the gate's generation section: agreement or quality that dropped between builds.

Settings (buckets, new tokens, prompts, the near-tie factor, log-likelihood bounds) are data:
``conformance/data/generation.toml``.
"""
