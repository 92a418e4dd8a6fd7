"""The notebooks' top-level metadata in one canonical form, so that opening a notebook never dirties the tree.

JupyterLab writes the kernelspec and ``language_info`` of the kernel it starts into a notebook's metadata, and
nbconvert writes ``language_info`` when it executes one. The stored notebooks carry exactly what both write for
``make lab``'s kernel on Python 3.11.7 (the Python of CI and of the stored outputs), so JupyterLab finds nothing
to change on open and saves nothing. Elsewhere (another Python, another kernel name) the same metadata is put
back on every save, by the pre-save hook ``make lab`` gives Jupyter (tools/jupyter_server_config.py), and by
running this file after executing notebooks with nbconvert:

    python tools/notebook_metadata.py notebooks/*.ipynb

Standard library only; the files are written the way nbformat writes them (indent 1, sorted keys).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

CANONICAL = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.7",
    },
}
# Kept as found: the state of the stored widget outputs (the explorers of chapters 1, 2 and 4), which nbconvert
# records.
KEPT = ("widgets",)


def canonical_metadata(metadata: dict) -> dict:
    """``metadata`` with the canonical kernelspec and language_info, and nothing else but the KEPT keys."""
    return {**copy.deepcopy(CANONICAL), **{key: metadata[key] for key in KEPT if key in metadata}}


def pre_save_hook(model: dict, **_) -> None:
    """Jupyter server pre-save hook: a notebook is saved with canonical metadata."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        content = model["content"]
        content["metadata"] = canonical_metadata(content.get("metadata", {}))


def normalise(path: Path) -> bool:
    """Rewrite the notebook at ``path`` with canonical metadata; True if that changed the file."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    notebook["metadata"] = canonical_metadata(notebook.get("metadata", {}))
    canonical = json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    if canonical == text:
        return False
    path.write_text(canonical, encoding="utf-8")
    return True


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python tools/notebook_metadata.py NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    for path in paths:
        if normalise(Path(path)):
            print(f"{path}: metadata made canonical")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
