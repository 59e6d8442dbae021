"""edl serve: exported models over the Open Inference Protocol (KServe v2) with ONNX Runtime."""
