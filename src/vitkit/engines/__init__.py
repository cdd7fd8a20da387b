"""CPU inference: ONNX export (``onnx_export``), int8 quantization (``int8``), running a model
under torch, ONNX Runtime or OpenVINO (``backends``), fp32 Linear layers on oneDNN
(``onednn``) and the allocator setting (``allocator``).

Nothing is imported here: the CLI sets the allocator before PyTorch starts."""
