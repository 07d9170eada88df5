"""comfy-cli (Comfy-Org's command line) against the real `kiln` binary, unmodified:
`comfy --json run --workflow <api.json> --host 127.0.0.1 --port P --wait` must complete and point at outputs
that `/view` serves. Kiln runs behind the contract proxy (every answer checked against the spec).

Usage: test_comfy_cli.py <path to kiln> <path to the comfy executable>.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request
from pathlib import Path

from kiln_under_contract import KilnUnderContract

KILN = sys.argv.pop(1) if len(sys.argv) > 1 else "target/debug/kiln"
COMFY = sys.argv.pop(1) if len(sys.argv) > 1 else "comfy"


class ComfyCliAgainstKiln(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.data_dir = Path(tempfile.mkdtemp(prefix="kiln-comfy-cli-"))
        cls.kiln = KilnUnderContract(KILN, cls.data_dir)
        cls.host, cls.port = cls.kiln.host, cls.kiln.port

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.data_dir, ignore_errors=True)
        cls.kiln.stop()

    def run_workflow(self, workflow: dict) -> dict:
        path = self.data_dir / "workflow_api.json"
        path.write_text(json.dumps(workflow))
        env = {"HOME": str(self.data_dir / "home"), "PATH": "/usr/bin:/bin"}
        command = [COMFY, "--skip-prompt", "--no-enable-telemetry", "--json", "run", "--workflow", str(path),
                   "--host", self.host, "--port", self.port, "--wait"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        return json.loads(done.stdout.strip().splitlines()[-1])

    def test_run_waits_for_completion_and_reports_outputs(self) -> None:
        envelope = self.run_workflow({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": 255}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "cli"}},
        })
        self.assertTrue(envelope["ok"], envelope)
        data = envelope["data"]
        self.assertEqual(data["status"], "completed")
        self.assertEqual(sorted(data["executed_node_ids"]), ["1", "2", "3"])
        [url] = data["outputs"]
        with urllib.request.urlopen(url) as response:
            self.assertEqual(response.headers["Content-Type"], "image/png")
            self.assertTrue(response.read().startswith(b"\x89PNG"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
