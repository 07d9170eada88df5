"""Fixtures for Kiln's text nodes (engine/src/nodes/builtin/strings.rs, text.rs), from ComfyUI's own
comfy_extras/nodes_string.py at 0f1fa67a: each case calls the node's `execute` with Python's `str` and `re`.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/strings.py

Writes engine/tests/fixtures/strings/cases.json: [{"node", "inputs", "output"}], or "error" (the exception's
type) where ComfyUI raises.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/strings"

TEXT = "  Héllo, wörld! they're 1st in line\tß\u001f "
CASES = [
    ("StringSubstring", {"string": TEXT, "start": 2, "end": 7}),
    ("StringSubstring", {"string": TEXT, "start": -6, "end": -1}),
    ("StringSubstring", {"string": TEXT, "start": 9, "end": 3}),
    ("StringSubstring", {"string": TEXT, "start": -100, "end": 100}),
    ("StringLength", {"string": TEXT}),
    ("StringLength", {"string": "日本語 🎉"}),
    *[("CaseConverter", {"string": TEXT, "mode": m}) for m in ("UPPERCASE", "lowercase", "Capitalize",
                                                              "Title Case")],
    ("CaseConverter", {"string": "日本ab 3rd-party o'neil", "mode": "Title Case"}),
    *[("StringTrim", {"string": TEXT, "mode": m}) for m in ("Both", "Left", "Right")],
    ("StringContains", {"string": TEXT, "substring": "WÖRLD", "case_sensitive": False}),
    ("StringContains", {"string": TEXT, "substring": "WÖRLD", "case_sensitive": True}),
    ("StringCompare", {"string_a": "Prefix text", "string_b": "prefix", "mode": "Starts With",
                       "case_sensitive": False}),
    ("StringCompare", {"string_a": "Prefix text", "string_b": "prefix", "mode": "Starts With",
                       "case_sensitive": True}),
    ("StringCompare", {"string_a": "a.png", "string_b": ".PNG", "mode": "Ends With", "case_sensitive": False}),
    ("StringCompare", {"string_a": "Same", "string_b": "same", "mode": "Equal", "case_sensitive": True}),
    ("RegexMatch", {"string": TEXT, "regex_pattern": r"w.rld", "case_insensitive": True, "multiline": False,
                    "dotall": False}),
    ("RegexMatch", {"string": "a\nb", "regex_pattern": r"a.b", "case_insensitive": True, "multiline": False,
                    "dotall": False}),
    ("RegexMatch", {"string": "a\nb", "regex_pattern": r"a.b", "case_insensitive": True, "multiline": False,
                    "dotall": True}),
    ("RegexMatch", {"string": "x", "regex_pattern": r"(unclosed", "case_insensitive": True, "multiline": False,
                    "dotall": False}),
    ("RegexReplace", {"string": "cat bat CAT", "regex_pattern": r"cat", "replace": "dog"}),
    ("RegexReplace", {"string": "cat bat CAT", "regex_pattern": r"cat", "replace": "dog",
                      "case_insensitive": False}),
    ("RegexReplace", {"string": "2024-05-06", "regex_pattern": r"(\d+)-(\d+)-(?P<day>\d+)",
                      "replace": r"\g<day>/\2/\1 [\g<0>]\n\t\\"}),
    ("RegexReplace", {"string": "one two three four", "regex_pattern": r"\w+", "replace": "<\\g<0>>", "count": 2}),
    ("RegexReplace", {"string": "abxd", "regex_pattern": r"x*", "replace": "-"}),
    ("RegexReplace", {"string": "a1b22", "regex_pattern": r"(\d)?", "replace": "[\\1]"}),
    ("RegexReplace", {"string": "line1\nline2", "regex_pattern": r"^line", "replace": "L", "multiline": True}),
    ("RegexReplace", {"string": "x", "regex_pattern": r"x", "replace": r"\q"}),
    ("RegexReplace", {"string": "x", "regex_pattern": r"x", "replace": r"\2"}),
    ("RegexReplace", {"string": "x", "regex_pattern": r"x", "replace": r"a\.b\101"}),
    ("RegexMatch", {"string": "the end\n", "regex_pattern": r"end$", "case_insensitive": True, "multiline": False,
                    "dotall": False}),
    ("RegexMatch", {"string": "the end\n", "regex_pattern": r"end\Z", "case_insensitive": True,
                    "multiline": False, "dotall": False}),
    ("RegexMatch", {"string": "cost: 5$", "regex_pattern": r"5[$]", "case_insensitive": True, "multiline": False,
                    "dotall": False}),
    ("RegexReplace", {"string": "a,b,\n", "regex_pattern": r",$", "replace": ""}),
    ("RegexReplace", {"string": "a\nb\n", "regex_pattern": r"$", "replace": "!", "multiline": True}),
    ("RegexReplace", {"string": "xyz", "regex_pattern": r"abc", "replace": r"\1"}),
    ("RegexReplace", {"string": "xyz", "regex_pattern": r"abc", "replace": r"\g<nope>"}),
    ("CaseConverter", {"string": "ახალი წელი", "mode": "Capitalize"}),
    ("CaseConverter", {"string": "ახალი წელი", "mode": "Title Case"}),
    ("CaseConverter", {"string": "ΟΔΟΣ ΚΑΙ ΟΣ'. ΣΑ", "mode": "Capitalize"}),
    ("CaseConverter", {"string": "ΟΔΟΣ ΚΑΙ ΟΣ'. ΣΑ", "mode": "Title Case"}),
    ("CaseConverter", {"string": "ΟΔΟΣ ΚΑΙ ΟΣ'. ΣΑ", "mode": "lowercase"}),
    ("RegexExtract", {"string": "id=12, id=34", "regex_pattern": r"id=(\d+)", "mode": "All Groups",
                      "case_insensitive": True, "multiline": False, "dotall": False, "group_index": 1}),
    ("RegexExtract", {"string": "ID=12", "regex_pattern": r"id=(\d+)", "mode": "First Match",
                      "case_insensitive": False, "multiline": False, "dotall": False, "group_index": 1}),
]


def main():
    import_comfyui(node_modules=True)
    from comfy_extras import nodes_string

    out = []
    for node, inputs in CASES:
        case = {"node": node, "inputs": inputs}
        try:
            case["output"] = getattr(nodes_string, node).execute(**inputs).result[0]
        except Exception as e:  # noqa: BLE001 - recorded, the test expects an error
            case["error"] = type(e).__name__
        out.append(case)
    os.makedirs(OUT, exist_ok=True)
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    print(len(out), "cases;", sum("error" in c for c in out), "errors")


if __name__ == "__main__":
    main()
