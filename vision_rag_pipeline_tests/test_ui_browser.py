"""The Dagster UI after an ingest, seen by a real headless Chromium: asset graph, sensors, schedule, a
partition's metadata, and the image assets' thumbnails (opened with a click, as a user does)."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import websocket

CHROMIUM = "/usr/bin/chromium"
SAMPLES = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"
PDF = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
# No GPU, no sandbox (root), no calls out of this machine (they are refused here, many at a time).
HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def webserver(vision_rag_home: Path):
    from vision_rag_pipeline.defs.runner import ingest_paths
    from vision_rag_pipeline.documents.registry import document_id_for

    ingest_paths([str(PDF)])  # what the UI must show is asserted below, through the browser
    port = free_port()
    bin_dir = Path(sys.executable).parent
    process = subprocess.Popen(
        [
            str(bin_dir / "dagster-webserver"),
            "-m",
            "vision_rag_pipeline.definitions",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Started from a script, the server ignores SIGTERM unless SIGINT is back to its default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/server_info", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail("dagster-webserver did not come up")
            time.sleep(1)
    yield url, document_id_for(PDF)
    process.terminate()
    process.wait(timeout=30)


def render(url: str, tmp_path: Path, name: str) -> str:
    """The page's DOM after its scripts ran; a screenshot is kept next to it for a human to look at."""
    profile = tmp_path / f"profile-{name}"
    flags = [
        *HEADLESS,
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",
        "--window-size=1600,1000",
    ]
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={tmp_path / f'{name}.png'}", url], capture_output=True, timeout=120
    )
    shutil.rmtree(profile, ignore_errors=True)
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    return dom.stdout


def test_asset_graph_and_catalog_render(webserver, tmp_path):
    url, _ = webserver
    graph = render(f"{url}/asset-groups", tmp_path, "graph")
    for group in ("documents", "images", "enrichment", "chunks", "embeddings", "indexes"):
        assert f">{group}<" in graph
    catalog = render(f"{url}/assets", tmp_path, "catalog")
    for asset in ("raw_documents", "image_enrichments", "document_chunks", "pgvector_index", "lexical_index"):
        assert asset in catalog


def test_a_partitions_metadata_renders(webserver, tmp_path):
    url, partition = webserver
    dom = render(f"{url}/assets/raw_documents?view=partitions&partition={partition}", tmp_path, "partition")
    assert partition in dom
    for metadata_key in ("sha256", "source_path", "pages"):
        assert metadata_key in dom


def test_sensors_and_schedule_are_listed(webserver, tmp_path):
    url, _ = webserver
    dom = render(f"{url}/automation", tmp_path, "automation")
    for name in ("inbox_sensor", "version_sensor", "daily_reindex"):
        assert name in dom


class Browser:
    """Headless Chromium driven over the DevTools protocol: navigate, run script, take screenshots."""

    def __init__(self, profile: Path) -> None:
        self.process = subprocess.Popen(
            [
                CHROMIUM,
                *HEADLESS,
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",  # the port chosen goes to DevToolsActivePort
                "--window-size=1600,1100",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        self._wait(lambda: port_file.exists() and port_file.read_text().strip(), "Chromium's DevTools port")
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(target for target in targets if target["type"] == "page")
        self.socket = websocket.create_connection(
            page["webSocketDebuggerUrl"], suppress_origin=True, timeout=60
        )
        self.calls = 0

    @staticmethod
    def _wait(check, what: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while not (found := check()):
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}")
            time.sleep(0.3)
        return found

    def call(self, method: str, **params) -> dict:
        self.calls += 1
        self.socket.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.calls:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, what: str):
        return self._wait(lambda: self.evaluate(expression), what)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)


# Clicks "[Show Markdown]" in the `thumbnails` row of the metadata table; true once clicked.
SHOW_THUMBNAILS = """(() => {
  const row = [...document.querySelectorAll('tr')]
    .find(r => r.cells.length && r.cells[0].textContent.trim() === 'thumbnails');
  const link = row && [...row.querySelectorAll('*')]
    .find(e => e.children.length === 0 && e.textContent.includes('Show Markdown'));
  if (link) link.click();
  return Boolean(link);
})()"""
# The data-URI thumbnails the browser decoded (a broken image has no natural width), with their alt text.
DECODED_THUMBNAILS = """[...document.querySelectorAll('img')]
  .filter(i => i.src.startsWith('data:image/jpeg;base64,') && i.complete && i.naturalWidth > 0)
  .map(i => i.alt)"""


@pytest.mark.parametrize(
    ("asset", "expected"),
    [
        ("extracted_images", {"page-1-image-4.png", "page-3.png"}),
        ("image_verdicts", {"page-1-image-4.png", "page-3.png"}),
        ("image_enrichments", {"page-1-image-4.png", "page-3.png"}),
    ],
)
def test_the_image_assets_show_their_pictures(webserver, tmp_path, asset, expected):
    url, partition = webserver
    browser = Browser(tmp_path / "profile")
    try:
        browser.call("Page.navigate", url=f"{url}/assets/{asset}?view=partitions&partition={partition}")
        browser.wait_for(SHOW_THUMBNAILS, "the thumbnails row and its [Show Markdown] link")
        shown = set(browser.wait_for(DECODED_THUMBNAILS, "decoded thumbnails"))
        dialog = browser.evaluate("document.querySelector('[role=dialog]')?.innerText || ''")
        browser.screenshot(tmp_path / f"{asset}.png")  # for a human to look at
    finally:
        browser.close()
    assert expected <= shown, shown
    if asset == "image_enrichments":  # each row: verdict, OCR confidence, the chunk's first words
        assert "VISION" in dialog and "High (" in dialog and "MEMORANDUM" in dialog, dialog
