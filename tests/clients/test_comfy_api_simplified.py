"""comfy-api-simplified (a third-party ComfyUI client) against the real `kiln` binary, unmodified.

Usage: test_comfy_api_simplified.py <path to kiln>. Starts kiln on a free port with a fresh data directory,
behind the contract proxy (every answer checked against the spec), then uploads an image, queues workflows and
waits for their images the way the library's users do.
"""

import shutil
import struct
import sys
import tempfile
import unittest
import zlib
from pathlib import Path

from comfy_api_simplified import ComfyApiWrapper, ComfyWorkflowWrapper
from kiln_under_contract import KilnUnderContract

KILN = sys.argv.pop(1) if len(sys.argv) > 1 else "target/debug/kiln"


def tiny_png(path: Path) -> None:
    """A 2x2 red PNG, written by hand so the test needs no imaging library."""
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


class ComfyApiSimplifiedAgainstKiln(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.data_dir = Path(tempfile.mkdtemp(prefix="kiln-casd-"))
        cls.kiln = KilnUnderContract(KILN, cls.data_dir)
        cls.url = cls.kiln.url
        cls.api = ComfyApiWrapper(cls.url)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.data_dir, ignore_errors=True)
        cls.kiln.stop()

    def test_queue_and_wait_images(self) -> None:
        workflow = ComfyWorkflowWrapper({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 8, "batch_size": 1, "color": 0}, "_meta": {"title": "Canvas"}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}, "_meta": {"title": "Invert"}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "casd"}, "_meta": {"title": "Save Image"}},
        })
        workflow.set_node_param("Canvas", "color", 0x00FF00)
        images = self.api.queue_and_wait_images(workflow, "Save Image")
        self.assertEqual(list(images), ["casd_00001_.png"])
        self.assertTrue(images["casd_00001_.png"].startswith(b"\x89PNG"))

    def test_upload_then_load_image(self) -> None:
        source = self.data_dir / "red.png"
        tiny_png(source)
        uploaded = self.api.upload_image(source)
        self.assertEqual(uploaded, {"name": "red.png", "subfolder": "default_upload_folder", "type": "input"})
        workflow = {
            "1": {"class_type": "LoadImage", "inputs": {"image": "default_upload_folder/red.png"}, "_meta": {"title": "Load"}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}, "_meta": {"title": "Preview"}},
        }
        images = self.api.queue_and_wait_images(workflow, "Preview")
        self.assertEqual(len(images), 1)

    def test_queue_and_info_routes(self) -> None:
        self.assertIn("queue_running", self.api.get_queue())
        self.assertIn("EmptyImage", self.api.get_object_info())
        self.assertEqual(self.api.get_system_stats()["devices"][0]["type"], "cpu")
        self.assertEqual(self.api.get_embeddings(), [])
        self.api.interrupt()


if __name__ == "__main__":
    unittest.main(verbosity=2)
