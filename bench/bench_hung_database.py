"""What `vision-rag serve` answers while its embedded Postgres is stopped (SIGSTOP), and how soon.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_hung_database.py [--stopped 25] [--clients 2]

Starts `serve` on a fresh home holding the bundled sample PDF (`vision-rag ingest`, so searches
read the index database), then stops the postmaster and all its backends for `--stopped`
seconds while `--clients` threads send /search requests and one polls /health; prints, for each
endpoint, the answers by status with their median and longest wait, how soon after the stop /health
said 503, and how soon after SIGCONT both answered 200 again.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
from served import CLI, serving, status_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stopped", type=float, default=25.0, help="seconds the database stays stopped")
    parser.add_argument("--clients", type=int, default=2, help="threads sending searches")
    args = parser.parse_args()
    search = {"query": "revenue", "mode": "vector"}
    with serving(prefix="bench_hung_database_") as served:
        url, home = served.url, served.home
        samples = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"
        sample = next(path for path in sorted(samples.iterdir()) if path.suffix == ".pdf")
        subprocess.run([*CLI, "ingest", str(sample)], env=served.env, capture_output=True, check=True)
        status_of(f"{url}/search", search)
        postmaster = psutil.Process(int((home / "pgdata" / "postmaster.pid").read_text().split()[0]))
        answers: dict[str, list[tuple[float, int, float]]] = defaultdict(list)  # (sent, status, seconds)
        phase = {"stopped_at": 0.0, "resumed_at": float("inf"), "done": False}

        def send(path: str, body: dict | None, pause: float) -> None:
            while not phase["done"]:
                sent = time.monotonic()
                status = status_of(f"{url}{path}", body)
                answers[path].append((sent, status, time.monotonic() - sent))
                time.sleep(pause)

        threads = [threading.Thread(target=send, args=("/search", search, 0.2)) for _ in range(args.clients)]
        threads.append(threading.Thread(target=send, args=("/health", None, 0.2)))
        for thread in threads:
            thread.start()
        time.sleep(2)
        stopped = [postmaster, *postmaster.children(recursive=True)]  # the backends of this moment
        for process in stopped:
            process.suspend()
        phase["stopped_at"] = time.monotonic()
        time.sleep(args.stopped)
        for process in stopped:
            process.resume()
        phase["resumed_at"] = time.monotonic()
        time.sleep(10)
        phase["done"] = True
        for thread in threads:
            thread.join()
        print(f"postmaster and {len(stopped) - 1} backends stopped for {args.stopped:.0f} s")
        for path, rows in answers.items():
            during = [row for row in rows if phase["stopped_at"] <= row[0] < phase["resumed_at"]]
            by_status: dict[int, list[float]] = defaultdict(list)
            for _, status, seconds in during:
                by_status[status].append(seconds)
            said = ", ".join(
                f"{status}: {len(waits)} (median {statistics.median(waits):.2f} s, longest {max(waits):.2f} s)"
                for status, waits in sorted(by_status.items())
            )
            first_503 = min(
                (sent + seconds for sent, status, seconds in during if status == 503), default=None
            )
            after = [row for row in rows if row[0] >= phase["resumed_at"]]
            first_ok = min((sent + seconds for sent, status, seconds in after if status == 200), default=None)
            down = "never" if first_503 is None else f"{first_503 - phase['stopped_at']:.1f} s after the stop"
            back = "never" if first_ok is None else f"{first_ok - phase['resumed_at']:.1f} s after SIGCONT"
            print(f"{path} while stopped: {said}; first 503 {down}; 200 again {back}")


if __name__ == "__main__":
    main()
