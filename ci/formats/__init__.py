"""File formats, read and written safely: wheels (archive, RECORD, METADATA, the raw-copy rewrite), ELF,
CUDA fat binaries and arch lists, and the logs builds leave (ninja's, sccache's). Imports only ``ci.base``."""
