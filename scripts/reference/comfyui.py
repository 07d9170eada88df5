"""Imports ComfyUI itself, at the commit Kiln matches, for the reference scripts that record its behaviour
(comfy_sampling.py, quant.py): from the checkout COMFYUI_DIR names (outside the repository; nothing of it is
copied here), as a CPU run with its command line parsed."""

import os
import sys


def import_comfyui():
    """Puts COMFYUI_DIR first on the path and sets ComfyUI up for a CPU run (exits naming the variable when
    it is not set); afterwards `import comfy.<module>` works."""
    directory = os.environ.get("COMFYUI_DIR")
    if not directory:
        sys.exit("set COMFYUI_DIR to a ComfyUI checkout at 0f1fa67a")
    sys.path.insert(0, directory)
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
