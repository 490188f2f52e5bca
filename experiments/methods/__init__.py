"""The methods: one readable file each, a plain dict to find them (no decorator registry).

Each module exposes ``VERSION`` (bump when its results would change),
``PIPELINES`` (the first is the default) and ``run(cfg, ctx) -> RunResult``.
"""

from experiments.methods import finetune, head_gates

METHODS = {
    "head_gates": head_gates,
    "finetune": finetune,
}
