"""Builds the optional C size check and C rounding; everything else is in pyproject.toml.

``optional=True``: without a C compiler the build goes on and the walker uses its pure-Python
check (same output, slower on documents made of many small nodes).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("encoder._csize", ["encoder/_csize.c"], optional=True),
        Extension("encoder._cround", ["encoder/_cround.c"], optional=True),
    ]
)
