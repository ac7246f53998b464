"""Point the pip ROS 2 wheels' exported CMake files at this interpreter's include dirs.

The kilted wheels hard-code the wheel builder's Python and numpy include paths; CMake then refuses them
("includes non-existent path"). Idempotent: re-run after installing more ROS wheels.
"""
import pathlib
import re
import sys
import sysconfig

import numpy


def main() -> int:
    prefix = pathlib.Path(sys.prefix)
    py_inc = sysconfig.get_paths()["include"]
    np_inc = numpy.get_include()
    builder_np = re.compile(r"/opt/python/cp3\d+-cp3\d+/lib/python3\.\d+/site-packages/numpy/(?:_core|core)/include")
    builder_py = re.compile(r"/opt/python/cp3\d+-cp3\d+/include/python3\.\d+")
    changed = 0
    for path in (prefix / "share").rglob("*.cmake"):
        text = path.read_text(errors="surrogateescape")
        new = builder_py.sub(py_inc, builder_np.sub(np_inc, text))
        if new != text:
            path.write_text(new, errors="surrogateescape")
            changed += 1
    print(f"patched {changed} CMake files under {prefix / 'share'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
