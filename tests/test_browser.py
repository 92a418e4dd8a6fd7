"""The workbook as a person uses it: JupyterLab on 127.0.0.1, Debian's Chromium driven by Playwright.

Each test opens a copy of a notebook (the stored outputs in the repository are never touched), runs every cell,
and, for the explorers, moves their controls and checks that the page shows what the package computes for the new
values: the same text report, and an image whose PNG bytes are exactly what the package's figure function draws.
Screenshots land in test-artifacts/.
"""

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from preshuffle import negotiation, plots, report, widgets
from preshuffle.shapes import Shape

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
APP = "window.jupyterapp.shell.currentWidget"


def require_browser():
    missing = [] if CHROMIUM.exists() else [str(CHROMIUM)]
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if missing:
        message = f"browser tests need {' and '.join(missing)} (make test installs Debian's chromium as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a random free port with a fresh token, serving a copy of notebooks/."""
    require_browser()
    work = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", work / "notebooks")
    # No news pop-up over the page; every cell rendered (no windowing), so off-screen widgets exist in the DOM.
    for plugin, values in (("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
                           ("notebook-extension/tracker", {"windowingMode": "none"})):
        path = work / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(work / "config"), "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(work / "workspaces")}
    log = open(work / "lab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work / 'notebooks'}",
         "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {(work / 'lab.log').read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield {"base": base, "token": token}
    finally:
        server.terminate()  # the server's own pid; it shuts its kernels down on SIGTERM
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    yield context.new_page()
    context.close()


def run_notebook(page, lab, name: str) -> None:
    """Open ``name``, clear its outputs, run every cell and wait until the kernel is idle again."""
    # A fresh workspace per page, so the notebook opened by an earlier test is not restored beside this one.
    workspace = f"{Path(name).stem}-{secrets.token_hex(4)}"
    page.goto(f"{lab['base']}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab['token']}")
    page.wait_for_function(f"() => window.jupyterapp && {APP}?.context?.path === {json.dumps(name)}"
                           f" && {APP}.sessionContext?.session?.kernel?.status === 'idle'", timeout=90_000)
    page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs');"
                  " await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_function(f"""() => {{
        const nb = {APP};
        const cells = nb.content.widgets.filter(c => c.model.type === 'code');
        return nb.sessionContext.session.kernel.status === 'idle' && cells.every(c => c.model.executionCount !== null);
    }}""", timeout=180_000)


def error_outputs(page) -> list:
    return page.evaluate(f"""() => {APP}.content.widgets.filter(c => c.model.type === 'code')
        .flatMap(c => c.model.outputs.toJSON()).filter(o => o.output_type === 'error')
        .map(o => o.ename + ': ' + o.evalue)""")


def screenshot(page, name: str, top=None) -> None:
    """Save the page; with ``top``, scrolled so that this element starts at the top of the notebook."""
    if top is not None:
        top.evaluate("e => e.scrollIntoView({block: 'start'})")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


def explorer(page, control: str):
    """The interactive widget holding a slider labelled ``control``, its report, and the slider's handle."""
    box = page.locator(".widget-interact").filter(has=page.locator(".widget-slider", has_text=control)).first
    box.scroll_into_view_if_needed()
    slider = box.locator(".widget-slider").filter(has_text=control).first
    return box, box.locator(".widget-output").first, slider


def move(page, slider, key: str, expected_readout: str) -> None:
    slider.locator(".noUi-handle").focus()
    page.keyboard.press(key)
    slider.locator(".widget-readout", has_text=expected_readout).wait_for()


def shows(output, text: str) -> None:
    """Wait until the widget's report is exactly ``text`` (the callback runs in the kernel, asynchronously)."""
    deadline = time.monotonic() + 30
    while output.inner_text().strip() != text.strip():
        assert time.monotonic() < deadline, f"the page shows\n{output.inner_text()}\ninstead of\n{text}"
        time.sleep(0.2)


def shown_png(output) -> bytes | None:
    """The PNG bytes of the image the widget's output shows (None while it shows none)."""
    images = output.locator("img")
    if images.count() == 0:
        return None
    src = images.first.get_attribute("src") or ""
    prefix = "data:image/png;base64,"
    return base64.b64decode(src[len(prefix):]) if src.startswith(prefix) else None


def draws(output, png: bytes, before: bytes | None = None) -> bytes:
    """Wait until the widget's image is exactly ``png`` (what the package draws for the new values), which must
    differ from the image ``before`` the move; return it."""
    assert png != before, "the move should change the figure"
    deadline = time.monotonic() + 30
    while (shown := shown_png(output)) != png:
        if time.monotonic() > deadline:
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "mismatch-page.png").write_bytes(shown or b"")
            (ARTIFACTS / "mismatch-package.png").write_bytes(png)
            pytest.fail("the page's image is not the package's figure for these values (both in test-artifacts/)")
        time.sleep(0.2)
    return png


def test_negotiation_explorer_shows_what_the_package_computes(page, lab):
    record = report.load()

    def figure(n):
        return plots.png_bytes(plots.negotiation_decision_plot(n, report.kernel_costs(n, record)))

    run_notebook(page, lab, "02_negotiation.ipynb")
    assert error_outputs(page) == []
    box, output, slider = explorer(page, "--block-size")
    expected = negotiation.negotiate(16, "rocm")
    shows(output, negotiation.format_negotiation(expected))
    image = draws(output, figure(expected))
    screenshot(page, "negotiation-16-after.png", top=box)

    move(page, slider, "ArrowRight", "24")            # 24: not a multiple of 16, so back to per-token paging
    expected = negotiation.negotiate(24, "rocm")
    assert expected.kernel_block_size == 1
    shows(output, negotiation.format_negotiation(expected))
    image = draws(output, figure(expected), image)

    move(page, slider, "ArrowLeft", "16")
    box.get_by_role("button", name=widgets.PR_STATES[1]).click()    # before the PR: 16 fell to 1
    expected = negotiation.negotiate(16, "rocm", before_pr=True)
    assert expected.kernel_block_size == 1 and not expected.kernel.preshuffled
    shows(output, negotiation.format_negotiation(expected))
    image = draws(output, figure(expected), image)
    screenshot(page, "negotiation-16-before.png", top=box)

    box.get_by_role("button", name="cuda").click()
    expected = negotiation.negotiate(16, "cuda", before_pr=True)
    shows(output, negotiation.format_negotiation(expected))
    draws(output, figure(expected), image)


def test_layout_explorer_shows_what_the_package_computes(page, lab):
    def figure(token, dim, block_size):
        return plots.png_bytes(plots.lane_bytes_plot(widgets.lane_vector(token, dim, block_size)))

    run_notebook(page, lab, "01_k_cache_layout.ipynb")
    assert error_outputs(page) == []
    box, output, dim = explorer(page, "dim")
    shows(output, widgets.format_lane_vector(widgets.lane_vector(3, 37, 16)))
    image = draws(output, figure(3, 37, 16))
    move(page, dim, "ArrowRight", "38")
    shows(output, widgets.format_lane_vector(widgets.lane_vector(3, 38, 16)))
    image = draws(output, figure(3, 38, 16), image)
    _, output, size = explorer(page, "block size")
    move(page, size, "ArrowRight", "32")
    shows(output, widgets.format_lane_vector(widgets.lane_vector(3, 38, 32)))
    draws(output, figure(3, 38, 32), image)
    screenshot(page, "layout-explorer.png", top=box)


def test_workload_explorer_shows_what_the_package_computes(page, lab):
    record = report.load()

    def figure(batch, avg_ctx, next_n, precision):
        nearest, bars = report.workload_bars(record, batch, avg_ctx, next_n, 64, "normal", precision)
        return plots.png_bytes(plots.workload_plot(nearest, Shape(batch, next_n, avg_ctx), bars))

    run_notebook(page, lab, "04_performance.ipynb")
    assert error_outputs(page) == []
    box, output, batch = explorer(page, "batch")
    image = draws(output, figure(64, 8192, 1, "exact"))
    screenshot(page, "workload-explorer.png", top=box)
    move(page, batch, "ArrowRight", "128")
    move(page, batch, "ArrowRight", "256")
    image = draws(output, figure(256, 8192, 1, "exact"), image)
    box.get_by_role("button", name="fp8").click()
    draws(output, figure(256, 8192, 1, "fp8"), image)
    assert box.get_by_role("button", name="measure live").is_disabled()   # the interpreter's timings mean nothing


@pytest.mark.parametrize("name, sliders, images", [
    ("01_k_cache_layout.ipynb", 3, 6), ("02_negotiation.ipynb", 1, 4), ("03_paged_mqa_kernel.ipynb", 0, 2),
    ("04_performance.ipynb", 2, 4), ("05_hopper_kernel.ipynb", 0, 3), ("06_logits_to_tokens.ipynb", 2, 4),
])
def test_every_notebook_runs_in_the_browser(page, lab, name, sliders, images):
    run_notebook(page, lab, name)
    assert error_outputs(page) == []
    assert page.locator(".widget-slider").count() == sliders       # widgets rendered, not left as text
    assert page.get_by_text("Error displaying widget").count() == 0
    assert page.locator(".jp-RenderedImage img").count() >= images
    screenshot(page, name.replace(".ipynb", ".png"))



def test_opening_and_closing_every_notebook_leaves_it_unchanged(page, lab):
    """JupyterLab writes the kernelspec and language_info of the kernel it starts into the notebook it opens.
    The stored notebooks already carry them (tools/notebook_metadata.py), so a reader who only looks leaves each
    document clean and its file as stored: ``git status`` stays clean. Even a save writes the same bytes."""
    contents, token = f"{lab['base']}/api/contents", lab["token"]
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:  # fresh copies: the tests above ran theirs, which autosave may have written
        put = page.request.put(f"{contents}/untouched-{path.name}?token={token}",
                               data={"type": "file", "format": "text", "content": path.read_text(encoding="utf-8")})
        assert put.ok, put.text()
    page.goto(f"{lab['base']}/lab/workspaces/untouched-{secrets.token_hex(4)}?reset&token={token}")
    page.wait_for_function("() => window.jupyterapp?.shell", timeout=90_000)
    for path in paths:
        name = f"untouched-{path.name}"
        # Open, and once the kernel's info and spec are in (JupyterLab writes both into the model), read whether
        # the document is dirty; then save and close it.
        dirty = page.evaluate(f"""async () => {{
            const app = window.jupyterapp;
            await app.restored;
            const panel = await app.commands.execute('docmanager:open', {{path: {json.dumps(name)}}});
            await panel.context.ready;
            await panel.sessionContext.ready;
            const kernel = panel.sessionContext.session.kernel;
            await kernel.info;
            await kernel.spec;
            await new Promise(resolve => setTimeout(resolve, 1000));
            const dirty = panel.context.model.dirty;
            await panel.context.save();
            panel.dispose();
            return dirty;
        }}""")
        assert dirty is False, f"opening {path.name} changed it in JupyterLab"
        saved = page.request.get(f"{contents}/{name}?type=file&format=text&content=1&token={token}")
        assert saved.json()["content"] == path.read_text(encoding="utf-8"), f"{path.name} changed on disk"
