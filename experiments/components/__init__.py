"""What several methods share, so a method file imports components, never another method:
the fine-tuned stage the head methods start from (``finetuning``), the training objective with
its bias model and teacher (``debias``, ``bias``), the probes' pass over UD sentences
(``probing``) and the soft-prompted encoder of skill neurons (``prompting``). Below the methods,
above ``training`` (what every method uses)."""
