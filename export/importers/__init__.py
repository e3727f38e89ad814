"""What users bring -> one exporter interface (:class:`export.framework.FrameworkExporter`).

Sources are found and read here: a PyTorch DLRM checkpoint of any known layout, rebuilt
(``dlrm_sources``, ``dlrm_layouts``, ``dlrm_rebuild``), any ``nn.Module`` (``torch_module``),
a TensorFlow SavedModel or ``.keras`` file (``keras_sources``, ``keras_inputs``); the
framework-specific graph writers that turn each into ONNX with the served tensors sit beside
them (``torch_onnx``, ``onnx_dlrm``, ``onnx_wide_deep``, ``onnx_keras``, ``tf_convert``).
``sources`` holds the options every importer shares (``--table-sizes``, ``--input-map``).
"""
