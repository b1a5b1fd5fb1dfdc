"""Jobs that test_warm_launcher.py hands to real warm workers, their steps in the run's process as the
project's are: one that answers at once, one that waits long enough to be killed or terminated mid-run."""

import time

import dagster as dg

WAIT_SECONDS = 120


@dg.op
def answer() -> int:
    return 42


@dg.job(executor_def=dg.in_process_executor)
def quick_job() -> None:
    answer()


@dg.op
def wait_a_while() -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)


@dg.job(executor_def=dg.in_process_executor)
def waiting_job() -> None:
    wait_a_while()
