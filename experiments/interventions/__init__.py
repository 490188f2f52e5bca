"""What a method does TO a model, without editing model files: head gates and token gates, pruning
and uniform attention (``heads``, ``attention``), weight masks (``masks``), FFN neurons read,
perturbed and sliced (``neurons``, ``ffn_prune``). Each attach returns a ``handles.Handle``."""
