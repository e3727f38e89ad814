"""The local ``pytorch`` backend (TorchScript models); tritonserver loads its ``model.py`` by path."""
