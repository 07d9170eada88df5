"""Schemathesis hooks for Kiln's fuzz pass (loaded by tests/fuzz/run.py through SCHEMATHESIS_HOOKS).

`positive_data_acceptance` wants every request the spec calls valid to be accepted. A few refusals depend on what
the server holds or on the bytes of a file, which no schema can say, and ComfyUI answers them with 400. For those
operations schemathesis.toml lets the built-in check take a 400, and `semantic_refusals_only` below makes sure
such a 400 is that refusal and no other: a schema-level refusal of valid data still fails the run.
"""

import schemathesis


def _json(response):
    try:
        return response.json()
    except ValueError:
        return None


def _prompt_refused_by_validation(case, response):
    # The prompt is well formed but names unknown node classes, misses inputs, links badly... (graph validation
    # against the registered nodes). `no_prompt`, `invalid_prompt` and `invalid_prompt_id` are shape refusals.
    body = _json(response) or {}
    kind = (body.get("error") or {}).get("type")
    return kind not in (None, "no_prompt", "invalid_prompt", "invalid_prompt_id")


def _duplicate_user(case, response):
    return _json(response) == {"error": "Duplicate username."}


def _not_a_directory(case, response):
    return response.text == "Path is not a directory"


def _not_an_image(case, response):
    return (_json(response) or {}).get("code") == "invalid_image"


def _view_of_a_non_image(case, response):
    # `/view` answers 400 with no body (as ComfyUI's status codes) both for a bad file name, which the spec's
    # pattern excludes from valid data, and for a re-encoding asked of a file that is not an image: any
    # `preview`, even an empty one (ComfyUI tests its presence), or the `rgb` and `a` channels.
    query = case.query or {}
    return "preview" in query or query.get("channel") in ("rgb", "a")


# operationId -> whether a 400 is the refusal the schema cannot express.
SEMANTIC_400 = {
    "executePrompt": _prompt_refused_by_validation,
    "createUser": _duplicate_user,
    "listUserDataV2": _not_a_directory,
    "uploadMask": _not_an_image,
    "viewFile": _view_of_a_non_image,
}


@schemathesis.check
def semantic_refusals_only(ctx, response, case):
    """A 400 to valid data is allowed only where it is a refusal no schema can express."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    operation_id = case.operation.definition.raw.get("operationId")
    allowed = SEMANTIC_400.get(operation_id)
    if allowed is not None and not allowed(case, response):
        raise AssertionError(
            f"{operation_id} refused valid data with a 400 that is not its state- or content-dependent refusal: "
            f"{response.text[:300]!r}"
        )
    return None


def _sendable_field_name(name):
    # A multipart field's name is written in its part's `Content-Disposition` header, where control characters
    # cannot appear (RFC 9110 field values); such a part is not a form field at all.
    return not any(ord(c) < 0x20 or ord(c) == 0x7F for c in str(name))


@schemathesis.hook
def map_case(context, case):
    """Drops the extra form fields schemathesis names with control characters: no HTTP message can carry them."""
    media_type = case.media_type or ""
    if media_type.startswith("multipart/") and isinstance(case.body, dict):
        case.body = {name: value for name, value in case.body.items() if _sendable_field_name(name)}
    return case
