import subprocess
import sys

import qkv


def test_import_prints_nothing():
    done = subprocess.run([sys.executable, "-c", "import qkv"], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout == "" and done.stderr == ""


def test_public_names_exist():
    for name in qkv.__all__:
        assert hasattr(qkv, name), name
