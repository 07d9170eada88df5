//! [`Pure`]: a node whose whole work is a function of its inputs (no device, no files, no context): most
//! utility, text, mask and sampling-value nodes.

use std::sync::Arc;

use crate::nodes::{Context, Inputs, Node, NodeError, NodeResult, NodeSpec};
use crate::value::Value;

/// A node that computes its outputs from its inputs with `run`.
pub(super) struct Pure {
    spec: Arc<NodeSpec>,
    run: fn(&Inputs) -> Result<Vec<Value>, NodeError>,
}

impl Pure {
    /// The node `spec` declares, computed by `run`.
    pub(super) fn new(spec: NodeSpec, run: fn(&Inputs) -> Result<Vec<Value>, NodeError>) -> Pure {
        Pure { spec: Arc::new(spec), run }
    }
}

impl Node for Pure {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        Ok(NodeResult::values((self.run)(inputs)?))
    }
}
