//! A node failure in ComfyUI's words: the Python exception name clients match on in
//! `execution_error.exception_type`, and the message as ComfyUI formats it.
//!
//! This is the one place an engine [`ErrorKind`] gets its wire name; the mapping is also documented on
//! `WsExecutionError.exception_type` in `spec/openapi.yaml`, which must list the same names.

use kiln_engine::nodes::ErrorKind;

/// The name ComfyUI's `full_type_name` gives the exception it raises for the same failure (module-qualified
/// unless it is a Python builtin).
///
/// An interrupt never reaches a client under this name: the run ends with `execution_interrupted`, as
/// ComfyUI's `handle_execution_error` does for `InterruptProcessingException`.
pub(crate) fn exception_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Failed => "RuntimeError",
        ErrorKind::InvalidValue => "ValueError",
        ErrorKind::WrongType => "TypeError",
        ErrorKind::FileNotFound => "FileNotFoundError",
        ErrorKind::Io => "OSError",
        ErrorKind::ImageDecode => "PIL.UnidentifiedImageError",
        ErrorKind::OutOfMemory => "torch.OutOfMemoryError",
        ErrorKind::Interrupted => "comfy.model_management.InterruptProcessingException",
        ErrorKind::MissingNode => "KeyError",
        ErrorKind::DependencyCycle => "graph.DependencyCycleError",
    }
}

/// `exception_message` as ComfyUI builds it: the error's text, a newline, then a tip for the failures it has
/// one for (running out of memory), so every message ends with a line break.
pub(crate) fn exception_message(kind: ErrorKind, message: &str) -> String {
    let tip = match kind {
        ErrorKind::OutOfMemory => {
            "This error means Kiln ran out of memory.\n\nTIPS: If the workflow worked before, the batch_size \
             or the image size may have been set too large."
        }
        ErrorKind::Failed
        | ErrorKind::InvalidValue
        | ErrorKind::WrongType
        | ErrorKind::FileNotFound
        | ErrorKind::Io
        | ErrorKind::ImageDecode
        | ErrorKind::Interrupted
        | ErrorKind::MissingNode
        | ErrorKind::DependencyCycle => "",
    };
    format!("{message}\n{tip}")
}

#[cfg(test)]
mod tests {
    use kiln_engine::nodes::ErrorKind;

    use super::{exception_message, exception_type};

    #[test]
    fn each_kind_has_comfyuis_exception_name() {
        let names = [
            (ErrorKind::Failed, "RuntimeError"),
            (ErrorKind::InvalidValue, "ValueError"),
            (ErrorKind::WrongType, "TypeError"),
            (ErrorKind::FileNotFound, "FileNotFoundError"),
            (ErrorKind::Io, "OSError"),
            (ErrorKind::ImageDecode, "PIL.UnidentifiedImageError"),
            (ErrorKind::OutOfMemory, "torch.OutOfMemoryError"),
            (ErrorKind::Interrupted, "comfy.model_management.InterruptProcessingException"),
            (ErrorKind::MissingNode, "KeyError"),
            (ErrorKind::DependencyCycle, "graph.DependencyCycleError"),
        ];
        for (kind, name) in names {
            assert_eq!(exception_type(kind), name, "{kind:?}");
        }
    }

    /// The spec's description of `exception_type` names every name a client can receive.
    #[test]
    fn the_spec_documents_every_name() {
        let spec: serde_json::Value =
            serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("the spec parses");
        let description = spec["components"]["schemas"]["WsExecutionError"]["properties"]
            ["exception_type"]["description"]
            .as_str()
            .expect("a description");
        for kind in [
            ErrorKind::Failed,
            ErrorKind::InvalidValue,
            ErrorKind::WrongType,
            ErrorKind::FileNotFound,
            ErrorKind::Io,
            ErrorKind::ImageDecode,
            ErrorKind::OutOfMemory,
            ErrorKind::Interrupted,
            ErrorKind::MissingNode,
            ErrorKind::DependencyCycle,
        ] {
            let name = format!("`{}`", exception_type(kind));
            assert!(description.contains(&name), "{name} is not documented: {description}");
        }
    }

    #[test]
    fn messages_end_with_a_line_break_and_out_of_memory_has_a_tip() {
        // As tests/golden/comfyui/ws_execution_error.json: "cannot identify image file '…'\n".
        assert_eq!(
            exception_message(ErrorKind::ImageDecode, "cannot identify image file 'bad.png'"),
            "cannot identify image file 'bad.png'\n"
        );
        let oom = exception_message(ErrorKind::OutOfMemory, "cannot allocate 64 GiB");
        assert!(oom.starts_with("cannot allocate 64 GiB\nThis error means"), "{oom}");
    }
}
