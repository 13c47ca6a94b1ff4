"""Wheel checks and fixes, one module per concern.

- ``archive``: safe wheel reading, members in place (rejects unsafe or corrupt zips and decompression bombs)
- ``elf``: minimal ELF64 reader (sections, dynamic symbols, versions) and demangling
- ``abi``: torch ABI check against a target torch (interpreter, dir or wheel file)
- ``coverage``: every claimed CPython has a build of every extension module
- ``archs`` / ``fatbin``: CUDA arch lists and the archs a wheel's device code covers
- ``rewrite``: strip the ``+local`` version segment without recompressing
- ``metadata``: PEP 658 ``.metadata`` files with digests
- ``audit``: ``auditwheel show``/``repair`` (torch and CUDA libraries excluded)
- ``check``: :func:`check_wheels`, all of the above in one report
- ``torch_wheel``: a row's torch wheel, downloaded (not installed) for the publish job's ABI re-check
"""
