# `make lab` puts this directory on JUPYTER_CONFIG_PATH: every notebook is saved with the canonical top-level
# metadata of tools/notebook_metadata.py, so opening one under another Python or kernel name leaves it as it was.
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebook_metadata import pre_save_hook  # noqa: E402

c.FileContentsManager.pre_save_hook = pre_save_hook  # noqa: F821 (c: the config Jupyter passes in)
# JupyterLab applies the server's config to the contents manager twice; the second time warns of an override
# although the hook is the same one.
warnings.filterwarnings("ignore", message="Overriding existing pre_save_hook")
