"""Raw CODEX discovery (``raw``), instrument metadata (``metadata``) and TIFF I/O (``tiff``)."""
