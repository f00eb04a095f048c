"""Pure-torch metrics: tensors in, floats out. No Lightning, no Ray."""
