"""bench/benchenv.py — a benchmark's peers in a venv of their own (their pins are not the
project's .venv's), created once from a requirements file and re-created when it changes."""
import subprocess
import sys
from pathlib import Path


def own_venv(base: Path, name: str, requirements: Path, who: str) -> Path:
    """The python of base/<name>, with `requirements` installed."""
    venv = base / name
    py = venv / "bin" / "python"
    stamp = venv / ".requirements"
    if not py.exists() or not stamp.exists() or stamp.read_text() != requirements.read_text():
        print(f"{who}: creating the venv {venv} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(requirements)], check=True)
        stamp.write_text(requirements.read_text())
    return py
