"""Fuzzes the real `kiln` binary from the OpenAPI document it serves, with schemathesis.

    python tests/fuzz/run.py KILN [--seed N] [--examples N | --seconds S] [--workers N] [--report DIR]

Starts `KILN --port 0 --data-dir <temp dir>` behind `kiln-contract-proxy` (tests/clients/kiln_under_contract.py,
which checks every answer against spec/openapi.yaml, unknown keys included), points schemathesis at the proxy's
`/api/openapi.json` with tests/fuzz/schemathesis.toml and the checks of kiln_checks.py, and fails if schemathesis
finds anything or the proxy saw an answer the spec does not describe.

`--examples N` (the test command's pass) runs each operation's examples, the coverage phase and N generated cases
per operation, one worker, a fixed seed and no example database: the same requests every run. `--seconds S` runs
every phase until the time is spent (the long pass).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clients"))

from kiln_under_contract import KilnUnderContract  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kiln", help="the kiln binary, e.g. target/debug/kiln")
    parser.add_argument("--seed", type=int, default=9)
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=int, default=None, help="generated cases per operation")
    budget.add_argument("--seconds", type=int, default=None, help="run every phase for this long")
    parser.add_argument("--workers", default="1")
    parser.add_argument("--report", type=Path, default=None, help="write schemathesis' ndjson/junit reports here")
    args = parser.parse_args()
    if args.examples is None and args.seconds is None:
        args.examples = 60

    schemathesis = Path(sys.executable).with_name("schemathesis")
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-") as data_dir:
        # The built-in CPU nodes run any prompt the fuzzer manages to queue; none is slow.
        kiln = KilnUnderContract(args.kiln, Path(data_dir))
        try:
            command = [
                str(schemathesis), "--config-file", str(HERE / "schemathesis.toml"),
                "run", f"{kiln.url}/api/openapi.json",
                "--seed", str(args.seed),
                "--workers", args.workers,
                "--generation-database", "none",
                "--request-timeout", "30",
                "--no-color",
            ]
            if args.seconds is not None:
                command += ["--max-time", str(args.seconds)]
            else:
                command += ["--phases", "examples,coverage,fuzzing", "--max-examples", str(args.examples)]
            if args.report is not None:
                command += ["--report", "ndjson,junit", "--report-dir", str(args.report)]
            env = dict(os.environ, SCHEMATHESIS_HOOKS=str(HERE / "kiln_checks.py"))
            print("fuzz:", " ".join(command[1:]), flush=True)
            # Run where schemathesis' own cache (`.schemathesis/`) lands in the temporary directory.
            status = subprocess.run(command, env=env, cwd=data_dir, check=False).returncode
        finally:
            # Raises when the proxy saw an answer the spec does not describe.
            kiln.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
