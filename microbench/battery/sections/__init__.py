"""The ten tests of the draft's §5, one module each; importing this package imports every module in it,
and each registers its test (``registry.register_test``): a new test is a new file here, no list to edit."""

import importlib
import pkgutil

__all__: list[str] = []

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
