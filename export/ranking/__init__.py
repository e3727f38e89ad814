"""Ranking variants: one user and its candidates a request, the user's part sent and looked up once.

``graph`` turns a flat model's ONNX graph (``B`` independent rows) into its ranking
variant; ``variants`` writes one beside each exported ONNX model and checks it against
the flat model on the tiled rows.
"""
