"""tools/notebook_metadata.py: the notebooks' canonical top-level metadata, the normaliser run after nbconvert,
and the pre-save hook ``make lab`` gives Jupyter (the browser test opens and closes every notebook)."""

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.fixture(scope="module")
def notebook_metadata(load_tool):
    return load_tool("notebook_metadata")


def drifted(metadata: dict) -> dict:
    """``metadata`` as another machine's JupyterLab or nbconvert would leave it."""
    metadata = copy.deepcopy(metadata)
    metadata["kernelspec"]["display_name"] = "Python 3"
    metadata["language_info"]["version"] = "3.12.9"
    metadata["vscode"] = {"interpreter": {"hash": "0" * 64}}
    return metadata


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_notebooks_have_canonical_metadata(notebook_metadata, path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    metadata = notebook["metadata"]
    assert metadata == notebook_metadata.canonical_metadata(metadata)
    assert {k: v for k, v in metadata.items() if k != "widgets"} == notebook_metadata.CANONICAL
    # The widget state kept beside it holds every widget a stored output shows.
    shown = {output["data"][WIDGET_VIEW]["model_id"] for cell in notebook["cells"] for output in cell.get("outputs", [])
             if WIDGET_VIEW in output.get("data", {})}
    assert shown <= set(metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {}))
    assert bool(shown) is (path.name in ("01_k_cache_layout.ipynb", "02_negotiation.ipynb", "04_performance.ipynb",
                                         "06_logits_to_tokens.ipynb"))


def test_canonical_metadata_is_what_make_labs_kernel_writes(notebook_metadata):
    """JupyterLab writes the kernelspec and language_info of the kernel it starts: ipykernel's python3."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert notebook_metadata.CANONICAL["kernelspec"] == {"display_name": spec.display_name,
                                                          "language": spec.language, "name": "python3"}
    language_info = {**IPythonKernel.language_info, "version": notebook_metadata.CANONICAL["language_info"]["version"]}
    assert notebook_metadata.CANONICAL["language_info"] == language_info
    assert notebook_metadata.CANONICAL["language_info"]["version"].startswith("3.11.")  # the Python of CI


def test_canonical_metadata_restores_the_kernel_fields_and_keeps_widgets(notebook_metadata):
    stored = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))["metadata"]
    other = drifted(stored)
    before = copy.deepcopy(other)
    assert notebook_metadata.canonical_metadata(other) == stored
    assert other == before  # the argument is left alone
    assert notebook_metadata.canonical_metadata({}) == notebook_metadata.CANONICAL


def write_drifted(source: Path, target: Path) -> None:
    notebook = json.loads(source.read_text(encoding="utf-8"))
    notebook["metadata"] = drifted(notebook["metadata"])
    target.write_text(json.dumps(notebook, indent=1), encoding="utf-8")


def test_normalise_writes_the_stored_bytes_back(notebook_metadata, tmp_path):
    for source in NOTEBOOKS:
        target = tmp_path / source.name
        write_drifted(source, target)
        assert notebook_metadata.normalise(target) is True
        assert target.read_bytes() == source.read_bytes()
        assert notebook_metadata.normalise(target) is False


def test_notebook_metadata_script_normalises_the_files_it_is_given(tmp_path):
    targets = [tmp_path / source.name for source in NOTEBOOKS]
    write_drifted(NOTEBOOKS[0], targets[0])
    shutil.copy(NOTEBOOKS[1], targets[1])
    script = [sys.executable, str(ROOT / "tools" / "notebook_metadata.py")]
    out = subprocess.run([*script, *map(str, targets[:2])], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == f"{targets[0]}: metadata made canonical\n"
    assert [t.read_bytes() for t in targets[:2]] == [s.read_bytes() for s in NOTEBOOKS[:2]]
    usage = subprocess.run(script, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: python tools/notebook_metadata.py" in usage.stderr


def test_pre_save_hook_saves_the_stored_bytes_through_jupyter(tmp_path, monkeypatch):
    """Jupyter's own contents manager, configured by the file ``make lab`` gives it, saving a notebook whose
    metadata drifted: the file comes out byte for byte as stored."""
    pytest.importorskip("jupyter_server", reason="needs JupyterLab's server (make lab installs it)")
    from jupyter_server.services.contents.filemanager import FileContentsManager
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))  # where saving signs notebooks
    config = PyFileConfigLoader("jupyter_server_config.py", path=str(ROOT / "tools")).load_config()
    (tmp_path / "root").mkdir()
    manager = FileContentsManager(root_dir=str(tmp_path / "root"), config=config)
    for source in NOTEBOOKS:
        shutil.copy(source, tmp_path / "root" / source.name)
        model = manager.get(source.name)
        model["content"]["metadata"] = drifted(model["content"]["metadata"])
        manager.save(model, source.name)
        assert (tmp_path / "root" / source.name).read_bytes() == source.read_bytes()


def test_make_lab_gives_jupyter_the_pre_save_hook():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    out = subprocess.run([make, "-n", "-C", str(ROOT), "lab", "TORCH=cpu", "VENV=/nonexistent/venv"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"JUPYTER_CONFIG_PATH={ROOT}/tools" in out.stdout and "jupyter lab" in out.stdout
    assert (ROOT / "tools" / "jupyter_server_config.py").exists()
