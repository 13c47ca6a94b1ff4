"""The ground floor: the one error type, digests, the logger and bounded JSON reading and writing. Imports
nothing of the wheelhouse."""
