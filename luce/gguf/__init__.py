"""GGUF files: reader (memory-mapped), typed model config, quant codecs, writer."""
