"""Installs metafam: `pip install .` (add `[test]` for the test tools)."""

from setuptools import find_packages, setup

setup(
    name="metafam",
    version="0.1.0",
    description="Meta-learning over task families in modern JAX: tasks, families, datasets, learned optimizers.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["metafam", "metafam.*"]),
    package_data={"metafam.datasets": ["data/*.npz", "data/*.gz", "data/*.txt"]},
    include_package_data=True,
    install_requires=["jax>=0.4.35", "dm-haiku>=0.0.13", "optax>=0.2.4", "numpy>=1.24", "tqdm>=4.60",
                      "absl-py>=1.0"],
    extras_require={"test": ["pytest>=7", "hypothesis>=6", "chex>=0.1.86", "matplotlib>=3.7"],
                    "plot": ["matplotlib>=3.7"], "tb": ["tensorboardX>=2.6"]},
    entry_points={"console_scripts": ["metafam=metafam.cli:run"]},
    license="Apache-2.0",
)
