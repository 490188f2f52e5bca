"""Pure maths of the methods: tensors in, tensors out; no I/O, no global RNG, no run state."""
