"""Post-import hooks for processes started by the test harness (importable: this directory is on PYTHONPATH).

``after_import("pkg.module", callback)`` calls ``callback(module)`` right after ``pkg.module`` has executed
(at once if it is already imported).  Used by the CPU shims and by the demo's reporting hook to patch a
module without importing it early.
"""

import importlib.abc
import sys


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _PostImportFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec, callback = loader.exec_module, self.callback

        def exec_module(module):
            original_exec(module)
            callback(module)

        loader.exec_module = exec_module
        return spec


def after_import(name, callback):
    """Call ``callback(module)`` once the module ``name`` is imported (at once if it already is)."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PostImportFinder(name, callback))
