"""The wheelhouse library: everything noxfile.py and tasks.py call.

Modules return values and raise :class:`ci.errors.WheelhouseError`; only the
entry points (noxfile.py, tasks.py) print and exit.
"""
