"""What a sweep's Ray Job runs: its driver, then, once the driver finished the sweep, the sweep's
report into its MLflow parent run (the figures and summary metrics ``headsweep report`` logs).

    python -m headsweep.sweep_job SWEEP_ID

The top of the levels, since the report is drawn by analysis and logged by the orchestrator
(``orchestrator.driving.driver_job.submit_driver`` starts it). The job's status is the driver's:
a killed or crashed driver ends the job at once (its report waits for the driver that finishes
the sweep: the supervisor resumes it within seconds), and a failed report never fails the job.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    sweep_id = (sys.argv[1:] if argv is None else argv)[0]
    from orchestrator.driving import (
        driver,  # first: it sets Tune's environment before Ray is imported
    )

    code = driver.main([sweep_id])
    if code == 0:
        report(sweep_id)
    return code


def report(sweep_id: str) -> None:
    """``headsweep report SWEEP`` once the sweep is finished, unless the sweep is untracked
    (``HEADSWEEP_TRACK=0``); what goes wrong is said on stderr, never the job's failure."""
    if os.environ.get("HEADSWEEP_TRACK", "1") == "0":
        return
    from headsweep import cli

    try:
        cli.main(["report", sweep_id])
    except Exception as err:  # the sweep's runs are done and recorded: a report is not worth failing them
        print(f"headsweep: the report of {sweep_id} failed: {err!r}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
