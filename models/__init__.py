"""Reference architectures (DLRM in PyTorch, Wide & Deep in Keras) and their training."""
