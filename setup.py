"""Pure-Python install of bolt_ros (engine, nodes, kernels, `bolt` CLI).

colcon builds the ROS package (interfaces + these sources) through CMakeLists.txt; this file serves
`pip install .` for engine-only machines and the editable install of the development environment.
"""
from setuptools import find_packages, setup

packages = [p for p in find_packages(include=["bolt_ros", "bolt_ros.*"]) if not p.startswith("bolt_ros.kernels")]
packages += ["bolt_ros.kernels"] + ["bolt_ros.kernels." + p for p in find_packages("kernels")]

setup(
    name="bolt_ros",
    version="0.1.0",
    description="A fast, local, conversational brain for robots (GGUF engine + DFlash + ROS 2 nodes)",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=packages,
    package_dir={"bolt_ros.kernels": "kernels"},
    include_package_data=True,
    package_data={"bolt_ros.kernels.cpu": ["*.c", "*.h"],  # built on first use (kernels/cpu/native.py)
                  "bolt_ros.models": ["*.gguf"],  # the default chat model's DFlash drafter
                  "bolt_ros.robot.reachy_mini": ["reach_table.json"]},  # the Reachy Mini's reach (reach.py)
    install_requires=["numpy", "gguf>=0.19", "torch", "pydantic>=2", "PyYAML", "Jinja2", "tqdm",
                      "llguidance"],
    extras_require={"gpu": ["triton"], "vision": ["opencv-python-headless"]},
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/bolt_ros"]),
        ("share/bolt_ros", ["package.xml"]),
    ],
    entry_points={"console_scripts": ["bolt = bolt_ros.cli:main"]},
)
