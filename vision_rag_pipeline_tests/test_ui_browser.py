"""The Dagster UI after an ingest, seen by a real headless Chromium: asset graph, sensors, schedule, and a
partition's metadata render."""

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

CHROMIUM = "/usr/bin/chromium"
SAMPLES = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"
PDF = SAMPLES / "larkspur_q3_2024_operations_review.pdf"

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
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
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
