"""What the runs say, pure over a loaded ``SweepData``: a metric per group (``results``), agreement of
unit maps (``agreement``, the one engine), weight masks (``masks``), prompt transfer (``transfer``),
pruning curves (``pruning``) and FFN neurons (``neurons``). Each returns plain values or one result
type the views render; none draws, prints or serves."""
