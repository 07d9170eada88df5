//! `FluxKVCache` (`comfy_extras.nodes_flux`): the model with its reference latents' keys and values computed once
//! per sampling run. The first model call with references runs them as usual (modulated at timestep 0, the
//! method the patch makes the default) and stores their keys and values in every block; the later calls leave
//! the references' tokens out and attend to the stored ones (models-flux.md §4.5).

use std::sync::Arc;

use super::pure::Pure;
use crate::models::DiffusionModel;
use crate::nodes::{InputDef, NodeSpec, OutputDef};
use crate::value::Value;

/// `FluxKVCache`.
pub(super) fn flux_kv_cache_node() -> Pure {
    Pure::new(
        NodeSpec::new("FluxKVCache", "Flux KV Cache", "experimental")
            .python_module("comfy_extras.nodes_flux")
            .v3()
            .experimental()
            .description(
                "Enables KV Cache optimization for reference images on Flux family models.",
            )
            .input(InputDef::typed("model", "MODEL").tooltip("The model to use KV Cache on."))
            .output(OutputDef::new("MODEL").tooltip("The patched model with KV Cache enabled.")),
        |inputs| {
            let model = inputs.model("model")?;
            let patched = DiffusionModel { reference_kv_cache: true, ..model.as_ref().clone() };
            Ok(vec![Value::Model(Arc::new(patched))])
        },
    )
}
