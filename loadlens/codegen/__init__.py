"""The generators of the derived files committed in the checkout (``make generate``).

They run from a source tree only (``python -m loadlens.codegen [--check] [--root DIR]``) and are left out of
the wheel: the installed runtime never needs them. Each module's ``outputs(root)`` builds ``{path: text}``.
"""
