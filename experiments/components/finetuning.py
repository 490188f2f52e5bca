"""The fine-tuned model a method starts from or looks at: its ``init_from`` stage, a ``finetune`` run.

head_gates' SP pipeline and the head analyses (head_importance, head_ablation,
attention_analysis) all start from the same stage; it is written once here, not imported from
the ``finetune`` method.
"""

from __future__ import annotations


def finetune_stage(steps: int | None = None) -> dict[str, dict]:
    """The ``init_from`` stage of a method that starts from a fine-tuned model (head_gates' SP, the
    head analyses): a ``finetune`` run of the same model, task, seed and training settings, or of
    ``steps`` training steps; shared by every cell that differs only in the dependant's own keys."""
    upstream: dict = {"method": "finetune"}
    if steps is not None:
        upstream["train"] = {"max_steps": steps}
    return {"init_from": upstream}
