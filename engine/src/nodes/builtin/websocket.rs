//! `SaveImageWebsocket` (ComfyUI's `custom_nodes/websocket_image_save.py`, loaded by a default install): sends
//! each image of the batch to the prompt's client as a PNG preview frame instead of writing a file. Scripts use
//! it to receive images over `/ws` (ComfyUI's `websockets_api_example_ws_images.py`).

use std::sync::Arc;

use super::files::encode_png;
use super::image::dims;
use crate::nodes::{
    Context, Fingerprint, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, Preview,
    PreviewFormat,
};

/// `SaveImageWebsocket`: one `progress` and one PNG preview frame per image; no outputs, no files, nothing in
/// the history's outputs.
pub(super) struct SaveImageWebsocket(Arc<NodeSpec>);

impl SaveImageWebsocket {
    pub(super) fn new() -> SaveImageWebsocket {
        SaveImageWebsocket(Arc::new(
            NodeSpec::new("SaveImageWebsocket", "Save Image (Websocket)", "image")
                .input(InputDef::typed("images", "IMAGE"))
                .output_node()
                .python_module("custom_nodes.websocket_image_save"),
        ))
    }
}

impl Node for SaveImageWebsocket {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    /// Upstream's `IS_CHANGED` returns the time: the images are sent again on every run.
    fn fingerprint(&self, _inputs: &Inputs) -> Fingerprint {
        Fingerprint::Always
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let images = inputs.image("images")?;
        let (batch, h, w, c) = dims(images)?;
        for b in 0..batch {
            ctx.check_interrupt()?;
            // As upstream's progress bar: the step before this image, of the batch size, then the image.
            ctx.progress(b as f64, batch as f64);
            let pixels = &images.data()[b * h * w * c..(b + 1) * h * w * c];
            let mut bytes = Vec::new();
            encode_png(&mut bytes, pixels, w, h, c, &[]).map_err(NodeError::new)?;
            ctx.preview(Preview { format: PreviewFormat::Png, bytes });
        }
        Ok(NodeResult { outputs: Vec::new(), ui: None })
    }
}
