"""The wheelhouse library: everything noxfile.py and tasks.py call, in packages by layer, each importing only
the layers below it (tests/test_layers.py): ``base``, ``formats``, ``model``, ``checks``, ``timing``, ``store``,
``build``, ``publish``, ``maintenance``, ``flows``.

Modules return values and raise :class:`ci.base.errors.WheelhouseError`; only the entry points (noxfile.py,
tasks.py, ``python -m ci``) print and exit.
"""
