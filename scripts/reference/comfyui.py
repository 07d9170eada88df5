"""Imports ComfyUI itself, at the commit Kiln matches, for the reference scripts that record its behaviour
(comfy_sampling.py, quant.py): from the checkout COMFYUI_DIR names (outside the repository; nothing of it is
copied here), as a CPU run with its command line parsed."""

import os
import sys
import tempfile


def import_comfyui(node_modules=False):
    """Puts COMFYUI_DIR first on the path and sets ComfyUI up for a CPU run (exits naming the variable when
    it is not set); afterwards `import comfy.<module>` works. With `node_modules`, `comfy_extras.<module>` too:
    those import ComfyUI's `nodes`, which imports torchaudio; when it is not installed an empty stand-in package
    is put on the path (the nodes the scripts record do not use it)."""
    if node_modules:
        try:
            import torchaudio  # noqa: F401
        except ImportError:
            stub = os.path.join(tempfile.mkdtemp(), "torchaudio")
            os.makedirs(stub)
            for module in ("__init__", "functional", "transforms"):
                open(os.path.join(stub, f"{module}.py"), "w").close()
            sys.path.insert(0, os.path.dirname(stub))
    directory = os.environ.get("COMFYUI_DIR")
    if not directory:
        sys.exit("set COMFYUI_DIR to a ComfyUI checkout at 0f1fa67a")
    sys.path.insert(0, directory)
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
