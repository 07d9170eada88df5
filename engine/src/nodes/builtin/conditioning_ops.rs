//! The conditioning transforms of `nodes.py`: `ConditioningAverage` (a weighted mix of two prompts' token
//! states), `ConditioningConcat` (one prompt's tokens after another's), `ConditioningMultiply` (a prompt's token
//! states and pooled vector scaled) and `ConditioningSetTimestepRange` (the part of sampling a prompt takes part
//! in, which the sampler honours).
//!
//! Invariant: as ComfyUI, only `conditioning_from`'s first prompt is read; each prompt of `conditioning_to`
//! keeps what rides along with it.

use std::sync::Arc;

use super::pure::Pure;
use crate::models::{Cond, Conditioning};
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let transform = |name: &str, display: &str| {
        NodeSpec::new(name, display, "model/conditioning/transform")
            .input(InputDef::typed("conditioning_to", "CONDITIONING"))
            .input(InputDef::typed("conditioning_from", "CONDITIONING"))
    };
    let percent =
        |name: &str, default: f64| InputDef::float(name, default, 0.0, 1.0).option("step", 0.001);
    vec![
        Pure::new(
            transform("ConditioningAverage", "Conditioning (Average)")
                .input(
                    InputDef::float("conditioning_to_strength", 1.0, 0.0, 1.0).option("step", 0.01),
                )
                .output(OutputDef::new("CONDITIONING"))
                .aliases(&[
                    "blend prompts",
                    "interpolate conditioning",
                    "mix prompts",
                    "style fusion",
                    "weighted blend",
                ]),
            conditioning_average,
        ),
        Pure::new(
            transform("ConditioningConcat", "Conditioning (Concat)")
                .output(OutputDef::new("CONDITIONING"))
                .aliases(&[]),
            conditioning_concat,
        ),
        Pure::new(
            NodeSpec::new(
                "ConditioningMultiply",
                "Conditioning (Multiply)",
                "model/conditioning/transform",
            )
            .input(InputDef::typed("conditioning", "CONDITIONING"))
            .input(InputDef::float("multiplier", 1.0, -100.0, 100.0).option("step", 0.01))
            .output(OutputDef::new("CONDITIONING"))
            .aliases(&[
                "scale conditioning",
                "scale prompt",
                "multiply conditioning",
                "multiply prompt",
            ]),
            conditioning_multiply,
        ),
        Pure::new(
            NodeSpec::new(
                "ConditioningSetTimestepRange",
                "ConditioningSetTimestepRange",
                "model/conditioning/transform",
            )
            .input(InputDef::typed("conditioning", "CONDITIONING"))
            .input(percent("start", 0.0))
            .input(percent("end", 1.0))
            .output(OutputDef::new("CONDITIONING"))
            .aliases(&[]),
            |inputs| {
                let range = (inputs.float("start")?, inputs.float("end")?);
                let out = inputs.conditioning("conditioning")?.with_extras(|e| {
                    e.timestep_range = Some(range);
                });
                Ok(vec![Value::Conditioning(Arc::new(out))])
            },
        ),
    ]
}

fn invalid(message: String) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// `conditioning_from`'s first prompt (ComfyUI warns and reads only it when there are more).
fn first_from<'a>(inputs: &'a Inputs, node: &str) -> Result<&'a Cond, NodeError> {
    let from = inputs.conditioning("conditioning_from")?;
    if from.entries.len() > 1 {
        tracing::warn!(
            "{node}: conditioning_from holds {} prompts; only the first is applied",
            from.entries.len()
        );
    }
    from.entries
        .first()
        .ok_or_else(|| invalid(format!("{node}: conditioning_from holds no prompt")))
}

/// Each of `conditioning_to`'s prompts with `f` of its tokens (and pooled vector), its extras kept.
fn each_to(
    inputs: &Inputs,
    f: impl Fn(&Cond) -> Result<Cond, NodeError>,
) -> Result<Vec<Value>, NodeError> {
    let to = inputs.conditioning("conditioning_to")?;
    let entries = to.entries.iter().map(f).collect::<Result<Vec<_>, _>>()?;
    Ok(vec![Value::Conditioning(Arc::new(Conditioning { entries }))])
}

/// `ConditioningMultiply`: each prompt's token states and pooled vector times `multiplier` (in f32, as a Python
/// scalar meets an f32 tensor), what rides along kept.
fn conditioning_multiply(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let k = inputs.float("multiplier")? as f32;
    let scaled = |t: &Tensor| {
        Tensor::new(t.shape().to_vec(), t.data().iter().map(|v| v * k).collect())
            .map_err(|e| NodeError::new(e.to_string()))
    };
    let entries = inputs
        .conditioning("conditioning")?
        .entries
        .iter()
        .map(|c| {
            Ok(Cond {
                cond: scaled(&c.cond)?,
                pooled: c.pooled.as_ref().map(scaled).transpose()?,
                extras: c.extras.clone(),
            })
        })
        .collect::<Result<Vec<_>, NodeError>>()?;
    Ok(vec![Value::Conditioning(Arc::new(Conditioning { entries }))])
}

/// `[B, L, D]` of a prompt's tokens, or an error naming `node`.
fn tokens(t: &Tensor, node: &str) -> Result<[usize; 3], NodeError> {
    match *t.shape() {
        [b, l, d] => Ok([b, l, d]),
        ref other => Err(invalid(format!("{node}: a prompt's tokens [B, L, D], not {other:?}"))),
    }
}

/// `ConditioningAverage`: each prompt's tokens times `conditioning_to_strength`, plus the first `from` prompt's
/// (its first L tokens, zeros past its end) times the rest; the pooled vectors alike, where `from` has one.
fn conditioning_average(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    const NODE: &str = "ConditioningAverage";
    let from = first_from(inputs, NODE)?;
    let strength = inputs.float("conditioning_to_strength")?;
    // Python's scalars meet f32 tensors as f32s; `1.0 - strength` is taken in double first.
    let (keep, mix) = (strength as f32, (1.0 - strength) as f32);
    let [fb, fl, fd] = tokens(&from.cond, NODE)?;
    each_to(inputs, |to| {
        let [b, l, d] = tokens(&to.cond, NODE)?;
        if d != fd || (fb != 1 && fb != b) {
            return Err(invalid(format!(
                "{NODE}: prompts of shapes {:?} and {:?} cannot be averaged: their widths (and batches) must \
                 agree",
                to.cond.shape(),
                from.cond.shape()
            )));
        }
        let mut values = Vec::with_capacity(b * l * d);
        for s in 0..b {
            let row = if fb == 1 { 0 } else { s };
            for i in 0..l {
                for c in 0..d {
                    let t1 = to.cond.data()[(s * l + i) * d + c];
                    let t0 = if i < fl { from.cond.data()[(row * fl + i) * d + c] } else { 0.0 };
                    values.push(t1 * keep + t0 * mix);
                }
            }
        }
        let cond = Tensor::new(vec![b, l, d], values).map_err(|e| NodeError::new(e.to_string()))?;
        let pooled = match (&to.pooled, &from.pooled) {
            // A prompt without a pooled vector mixes `from`'s with itself, as ComfyUI's default makes it.
            (own, Some(theirs)) => {
                let own = own.as_ref().unwrap_or(theirs);
                if own.shape() != theirs.shape() {
                    return Err(invalid(format!(
                        "{NODE}: pooled vectors of shapes {:?} and {:?}",
                        own.shape(),
                        theirs.shape()
                    )));
                }
                let mixed = own.data().iter().zip(theirs.data()).map(|(a, b)| a * keep + b * mix);
                Some(
                    Tensor::new(own.shape().to_vec(), mixed.collect())
                        .map_err(|e| NodeError::new(e.to_string()))?,
                )
            }
            (own, None) => own.clone(),
        };
        Ok(Cond { cond, pooled, extras: to.extras.clone() })
    })
}

/// `ConditioningConcat`: the first `from` prompt's tokens after each prompt's.
fn conditioning_concat(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    const NODE: &str = "ConditioningConcat";
    let from = first_from(inputs, NODE)?;
    let [fb, _, fd] = tokens(&from.cond, NODE)?;
    each_to(inputs, |to| {
        let [b, _, d] = tokens(&to.cond, NODE)?;
        if (b, d) != (fb, fd) {
            return Err(invalid(format!(
                "{NODE}: prompts of shapes {:?} and {:?} cannot be joined: their batches and widths must agree",
                to.cond.shape(),
                from.cond.shape()
            )));
        }
        let cond = super::latent::cat(&to.cond, &from.cond, 1)?;
        Ok(Cond { cond, ..to.clone() })
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::models::CondExtras;
    use crate::nodes::Node;

    fn run(name: &str, inputs: Vec<(&str, Value)>) -> Result<Conditioning, NodeError> {
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        match crate::fixtures::node_outputs(&node, inputs)?.into_iter().next() {
            Some(Value::Conditioning(c)) => Ok((*c).clone()),
            other => panic!("{name}: not one conditioning: {other:?}"),
        }
    }

    fn prompts(entries: Vec<Cond>) -> Value {
        Value::Conditioning(Arc::new(Conditioning { entries }))
    }

    /// `conditioning_ops.py`'s prompts: `to` (to0 with a pooled vector and an extra, to1 without) and `from`.
    fn sides(io: &BTreeMap<String, Tensor>) -> (Value, Value) {
        let marked = CondExtras { guidance: Some(Some(2.5)), ..CondExtras::default() };
        let to0 =
            Cond { extras: marked, ..Cond::new(io["to0"].clone(), Some(io["to0.pooled"].clone())) };
        let to1 = Cond::new(io["to1"].clone(), None);
        let from = Cond::new(io["from"].clone(), Some(io["from.pooled"].clone()));
        (prompts(vec![to0, to1]), prompts(vec![from]))
    }

    #[test]
    fn average_and_concat_match_comfyui() {
        let io = crate::fixtures::tensors("conditioning_ops/io.safetensors");
        let (to, from) = sides(&io);
        for strength in [0.3, 1.0] {
            let out = run(
                "ConditioningAverage",
                vec![
                    ("conditioning_to", to.clone()),
                    ("conditioning_from", from.clone()),
                    ("conditioning_to_strength", Value::Float(strength)),
                ],
            )
            .unwrap();
            for (i, entry) in out.entries.iter().enumerate() {
                let name = format!("average.{strength:.1}.{i}");
                assert_eq!(entry.cond, io[&name], "{name}");
                assert_eq!(entry.pooled.as_ref(), Some(&io[&format!("{name}.pooled")]), "{name}");
            }
            // What rides along stays with each prompt.
            assert_eq!(out.entries[0].extras.guidance, Some(Some(2.5)));
        }
        let out = run(
            "ConditioningConcat",
            vec![("conditioning_to", to.clone()), ("conditioning_from", from.clone())],
        )
        .unwrap();
        for (i, entry) in out.entries.iter().enumerate() {
            assert_eq!(entry.cond, io[&format!("concat.{i}")], "concat.{i}");
        }
        // Prompts of another width are refused, naming the node.
        let narrow = prompts(vec![Cond::new(Tensor::full(vec![1, 2, 4], 0.0), None)]);
        let Err(err) =
            run("ConditioningConcat", vec![("conditioning_to", to), ("conditioning_from", narrow)])
        else {
            panic!("widths 8 and 4")
        };
        assert!(err.message.contains("ConditioningConcat"), "{}", err.message);
    }

    /// `scripts/reference/latent_transform.py`'s record of ComfyUI's `ConditioningMultiply`.
    #[test]
    fn multiply_scales_tokens_and_pooled_as_comfyui() {
        let io = crate::fixtures::tensors("latent_transform/io.safetensors");
        let marked = CondExtras { guidance: Some(Some(2.5)), ..CondExtras::default() };
        let prompt = Cond {
            extras: marked.clone(),
            ..Cond::new(io["cond"].clone(), Some(io["pooled"].clone()))
        };
        let out = run(
            "ConditioningMultiply",
            vec![("conditioning", prompts(vec![prompt])), ("multiplier", Value::Float(-1.7))],
        )
        .unwrap();
        assert_eq!(out.entries[0].cond, io["multiply.cond"]);
        assert_eq!(out.entries[0].pooled.as_ref(), Some(&io["multiply.pooled"]));
        assert_eq!(out.entries[0].extras, marked, "what rides along is kept");
    }

    /// ComfyUI's CFGGuider (cfg 2, euler, 5 steps) on the tiny Wan t2v model with two positive prompts over
    /// halves of the run, a third over all of it, and a negative absent from its first steps
    /// (`scripts/reference/wan_windows.py timestep_range`).
    #[test]
    fn prompts_take_part_only_in_their_part_of_sampling_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/timestep_range.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-timestep-range-{}", std::process::id()));
        let (env, model) = crate::fixtures::tiny_wan_t2v_model(&dir);
        let ranged = |name: &str, range: Option<(f64, f64)>| {
            let cond = Conditioning { entries: vec![Cond::new(io[name].clone(), None)] };
            let ranges =
                [("start", range.map_or(0.0, |r| r.0)), ("end", range.map_or(1.0, |r| r.1))];
            match range {
                None => cond,
                Some(_) => {
                    let mut inputs = vec![("conditioning", Value::Conditioning(Arc::new(cond)))];
                    inputs.extend(ranges.map(|(k, v)| (k, Value::Float(v))));
                    run("ConditioningSetTimestepRange", inputs).unwrap()
                }
            }
        };
        let mut positive = ranged("context.p0", Some((0.0, 0.5)));
        positive.entries.extend(ranged("context.p1", Some((0.5, 1.0))).entries);
        positive.entries.extend(ranged("context.p2", None).entries);
        let negative = ranged("context.negative", Some((0.3, 1.0)));
        let got =
            super::super::windowed::sample_as_fixture(&env, &model, (&positive, &negative), &io);
        crate::fixtures::assert_relative("timestep ranges", got.data(), io["out"].data(), 1e-4);

        // Context windows that split the first two positive prompts among them: a window whose prompt sits the
        // step out predicts zeros there.
        let windows = crate::models::context_windows::ContextWindows {
            split_conds: true,
            ..crate::fixtures::wan_windows()
        };
        let windowed = crate::models::DiffusionModel {
            context_windows: Some(Arc::new(windows)),
            ..model.clone()
        };
        let split = Conditioning { entries: positive.entries[..2].to_vec() };
        let plain_negative =
            Conditioning { entries: vec![Cond::new(io["context.negative"].clone(), None)] };
        let split_io = [("noise", "split.noise"), ("sigmas", "sigmas")]
            .map(|(k, from)| (k.to_owned(), io[from].clone()))
            .into_iter()
            .collect();
        let got = super::super::windowed::sample_as_fixture(
            &env,
            &windowed,
            (&split, &plain_negative),
            &split_io,
        );
        crate::fixtures::assert_relative("split windows", got.data(), io["split.out"].data(), 1e-4);
        let _ = std::fs::remove_dir_all(dir);
    }
}
