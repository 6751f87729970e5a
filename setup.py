"""What pyproject.toml cannot say: the package list adds opsconsole.themes, which lives in themes/.

pyproject.toml maps it (`package-dir`) and ships its TOML files (`package-data`); a wheel and an
editable install both see the package opsconsole.themes.
"""

from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["opsconsole*"], exclude=["*.__pycache__"]) + ["opsconsole.themes"])
