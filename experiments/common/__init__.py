"""What every layer shares and nothing here depends on: the one "did you mean" (``naming``), the
vocabulary of model units (``units``), a weight mask as stored (``mask_format``) and the one
figure-to-PNG encoder (``png``). Pure Python, numpy and matplotlib: no torch."""
