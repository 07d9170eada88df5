"""Starts the real `kiln` binary behind `kiln-contract-proxy`, which checks every answer and websocket frame
against spec/openapi.yaml. Clients talk to the proxy; `stop()` fails if the server sent anything the spec does
not describe.

The proxy binary is `$KILN_CONTRACT_PROXY`, or `target/debug/kiln-contract-proxy` (the test command builds it).
"""

import os
import signal
import subprocess
import threading
from pathlib import Path

PROXY = os.environ.get("KILN_CONTRACT_PROXY", "target/debug/kiln-contract-proxy")


def _listening_address(process: subprocess.Popen, what: str) -> str:
    """Reads the process's log until it says where it listens; keeps draining it afterwards."""
    for line in process.stderr:
        if "listening on http://" in line:
            threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
            return line.split("listening on http://")[1].strip()
    raise RuntimeError(f"{what} exited before listening")


class KilnUnderContract:
    """`kiln --port 0 --disable-front-end --data-dir DIR [extra args]` behind the checking proxy (no frontend:
    tests never download one)."""

    def __init__(self, kiln: str, data_dir: Path, *extra: str) -> None:
        command = [kiln, "--port", "0", "--disable-front-end", "--data-dir", str(data_dir), *extra]
        self.kiln = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        backend = _listening_address(self.kiln, "kiln")
        self.proxy = subprocess.Popen([PROXY, backend], stderr=subprocess.PIPE, text=True)
        for line in self.proxy.stderr:
            if "listening on http://" in line:
                self.address = line.split("listening on http://")[1].strip()
                break
        else:
            raise RuntimeError("kiln-contract-proxy exited before listening")
        self.url = "http://" + self.address
        self.host, self.port = self.address.rsplit(":", 1)

    def stop(self) -> None:
        """Stops both; raises AssertionError with the proxy's report if any answer broke the contract."""
        self.proxy.send_signal(signal.SIGTERM)
        report = self.proxy.stderr.read()
        code = self.proxy.wait()
        self.kiln.kill()
        self.kiln.wait()
        print(report.strip().splitlines()[0] if report.strip() else "contract: no report")
        if code != 0:
            raise AssertionError(f"kiln sent answers the spec does not describe:\n{report}")
