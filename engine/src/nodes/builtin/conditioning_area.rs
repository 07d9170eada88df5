//! Regional prompting's nodes: `ConditioningSetArea`, `ConditioningSetAreaPercentage`,
//! `ConditioningSetAreaStrength`, `ConditioningSetMask` (`nodes.py`) and `ConditioningSetAreaPercentageVideo`
//! (`comfy_extras.nodes_video_model`). Each sets a part of every prompt's [`PromptRegion`], as ComfyUI's
//! `conditioning_set_values` does; the sampler runs each prompt on its block of the latent and weighs it there
//! (`prompt_regions`).

use std::sync::Arc;

use super::pure::Pure;
use crate::models::{Area, CondExtras};
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let transform = |name: &str, display: &str| {
        NodeSpec::new(name, display, "model/conditioning/transform")
            .input(InputDef::typed("conditioning", "CONDITIONING"))
    };
    let pixels = super::latent_transform::pixels;
    // Sizes default to 1.0; offsets to an integer 0, as ComfyUI declares them.
    let size = |name: &str| fraction(name, 1.0);
    let offset = |name: &str| fraction(name, 0);
    let strength = || InputDef::float("strength", 1.0, 0.0, 10.0).option("step", 0.01);
    vec![
        Pure::new(
            transform("ConditioningSetArea", "Conditioning (Set Area)")
                .input(pixels("width", 64, 64))
                .input(pixels("height", 64, 64))
                .input(pixels("x", 0, 0))
                .input(pixels("y", 0, 0))
                .input(strength())
                .output(OutputDef::new("CONDITIONING"))
                .aliases(&[
                    "regional prompt",
                    "area prompt",
                    "spatial conditioning",
                    "localized prompt",
                ]),
            set_area,
        ),
        Pure::new(
            transform("ConditioningSetAreaPercentage", "Conditioning (Set Area with Percentage)")
                .input(size("width"))
                .input(size("height"))
                .input(offset("x"))
                .input(offset("y"))
                .input(strength())
                .output(OutputDef::new("CONDITIONING"))
                .aliases(&[]),
            |inputs| {
                let [w, h, x, y] = ["width", "height", "x", "y"].map(|k| inputs.float(k));
                set_fraction(inputs, vec![h?, w?, y?, x?])
            },
        ),
        Pure::new(
            transform("ConditioningSetAreaStrength", "Conditioning (Set Area Strength)")
                .input(strength())
                .output(OutputDef::new("CONDITIONING"))
                .aliases(&[]),
            |inputs| {
                let strength = inputs.float("strength")?;
                with_region(inputs, |e| e.region.strength = Some(strength))
            },
        ),
        Pure::new(
            transform("ConditioningSetMask", "Conditioning (Set Mask)")
                .input(InputDef::typed("mask", "MASK"))
                .input(strength())
                .input(InputDef::choices("set_cond_area", &["default", "mask bounds"]))
                .output(OutputDef::new("CONDITIONING"))
                .aliases(&["masked prompt", "regional inpaint conditioning", "mask conditioning"]),
            set_mask,
        ),
        Pure::new(
            transform(
                "ConditioningSetAreaPercentageVideo",
                "Conditioning (Set Area with Percentage for Video)",
            )
            .python_module("comfy_extras.nodes_video_model")
            .input(size("width"))
            .input(size("height"))
            .input(size("temporal"))
            .input(offset("x"))
            .input(offset("y"))
            .input(offset("z"))
            .input(strength())
            .output(OutputDef::new("CONDITIONING"))
            .aliases(&[]),
            |inputs| {
                let [w, h, t, x, y, z] =
                    ["width", "height", "temporal", "x", "y", "z"].map(|k| inputs.float(k));
                set_fraction(inputs, vec![t?, h?, w?, z?, y?, x?])
            },
        ),
    ]
}

/// A fraction of the latent (the percentage nodes' inputs): from an integer 0 to 1.0, step 0.01.
fn fraction(name: &str, default: impl Into<serde_json::Value>) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .option("default", default)
        .option("min", 0)
        .option("max", 1.0)
        .option("step", 0.01)
}

/// The input conditioning with `set` applied to every prompt's extras.
fn with_region(inputs: &Inputs, set: impl Fn(&mut CondExtras)) -> Result<Vec<Value>, NodeError> {
    let out = inputs.conditioning("conditioning")?.with_extras(set);
    Ok(vec![Value::Conditioning(Arc::new(out))])
}

/// `ConditioningSetArea`: the block in latent cells (the pixels ÷ 8, as ComfyUI divides whatever the model's
/// VAE), its strength, and the area no longer taken from a mask.
fn set_area(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let cells = |name: &str| -> Result<usize, NodeError> {
        let v = inputs.int(name)?;
        usize::try_from(v).map(|v| v / 8).map_err(|_| {
            NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("ConditioningSetArea: `{name}` must not be negative, got {v}"),
            )
        })
    };
    let area = vec![cells("height")?, cells("width")?, cells("y")?, cells("x")?];
    let strength = inputs.float("strength")?;
    with_region(inputs, |e| {
        e.region.area = Some(Area::Cells(area.clone()));
        e.region.strength = Some(strength);
        e.region.area_from_mask = false;
    })
}

/// The percentage nodes: sizes then offsets as fractions, with the strength.
fn set_fraction(inputs: &Inputs, fractions: Vec<f64>) -> Result<Vec<Value>, NodeError> {
    let strength = inputs.float("strength")?;
    with_region(inputs, |e| {
        e.region.area = Some(Area::Fraction(fractions.clone()));
        e.region.strength = Some(strength);
        e.region.area_from_mask = false;
    })
}

/// `ConditioningSetMask`: the mask, its strength, and whether the area is the mask's bounds.
fn set_mask(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let (mask, [b, h, w]) = super::mask::mask(inputs, "mask")?;
    let mask = super::mask::tensor(vec![b, h, w], mask.data().to_vec())?;
    let strength = inputs.float("strength")?;
    let bounds = inputs.string("set_cond_area")? != "default";
    with_region(inputs, |e| {
        e.region.mask = Some(mask.clone());
        e.region.mask_strength = Some(strength);
        e.region.area_from_mask = bounds;
    })
}

/// `conditioning` through the node `name` with the other `inputs` (for tests here and in `prompt_regions`).
#[cfg(test)]
pub(super) fn apply(
    name: &str,
    conditioning: crate::models::Conditioning,
    inputs: Vec<(&str, Value)>,
) -> Result<crate::models::Conditioning, NodeError> {
    use crate::nodes::Node;
    let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
    let mut all = vec![("conditioning", Value::Conditioning(Arc::new(conditioning)))];
    all.extend(inputs);
    match crate::fixtures::node_outputs(&node, all)?.into_iter().next() {
        Some(Value::Conditioning(c)) => Ok((*c).clone()),
        other => panic!("{name}: not one conditioning: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::models::{Cond, Conditioning, PromptRegion};
    use crate::tensor::Tensor;

    fn prompt(t: &Tensor) -> Conditioning {
        Conditioning { entries: vec![Cond::new(t.clone(), None)] }
    }

    fn ints(pairs: &[(&'static str, i64)]) -> Vec<(&'static str, Value)> {
        pairs.iter().map(|&(k, v)| (k, Value::Int(v))).collect()
    }

    fn floats(pairs: &[(&'static str, f64)]) -> Vec<(&'static str, Value)> {
        pairs.iter().map(|&(k, v)| (k, Value::Float(v))).collect()
    }

    /// `ConditioningSetArea` (pixels, strength).
    pub(super) fn area(c: Conditioning, [w, h, x, y]: [i64; 4], strength: f64) -> Conditioning {
        let mut inputs = ints(&[("width", w), ("height", h), ("x", x), ("y", y)]);
        inputs.extend(floats(&[("strength", strength)]));
        apply("ConditioningSetArea", c, inputs).expect("ConditioningSetArea")
    }

    /// `ConditioningSetMask` ("default" unless `bounds`).
    pub(super) fn mask(
        c: Conditioning,
        mask: &Tensor,
        strength: f64,
        bounds: bool,
    ) -> Conditioning {
        let set = if bounds { "mask bounds" } else { "default" };
        let mut inputs = vec![
            ("mask", Value::Mask(mask.clone())),
            ("set_cond_area", Value::String(set.to_owned())),
        ];
        inputs.extend(floats(&[("strength", strength)]));
        apply("ConditioningSetMask", c, inputs).expect("ConditioningSetMask")
    }

    /// `ConditioningSetAreaPercentageVideo` (width, height, temporal, x, y, z, strength).
    pub(super) fn video_area(c: Conditioning, v: [f64; 7]) -> Conditioning {
        let names = ["width", "height", "temporal", "x", "y", "z", "strength"];
        let inputs = names.iter().zip(v).map(|(&k, v)| (k, Value::Float(v))).collect();
        apply("ConditioningSetAreaPercentageVideo", c, inputs).expect("the video node")
    }

    #[test]
    fn the_nodes_set_comfyuis_region() {
        let base = prompt(&Tensor::full(vec![1, 2, 4], 0.5));
        let region = |c: &Conditioning| c.entries[0].extras.region.clone();
        // Pixels ÷ 8 as (h, w, y, x), with the strength.
        let framed = area(base.clone(), [100, 64, 23, 8], 1.5);
        let want = PromptRegion {
            area: Some(Area::Cells(vec![8, 12, 1, 2])),
            strength: Some(1.5),
            ..PromptRegion::default()
        };
        assert_eq!(region(&framed), want);
        // A mask after it keeps the area; "mask bounds" takes the area from the mask when sampling starts.
        let m = Tensor::full(vec![1, 4, 4], 1.0);
        let masked = mask(framed, &m, 0.7, true);
        let want = PromptRegion {
            mask: Some(m.clone()),
            mask_strength: Some(0.7),
            area_from_mask: true,
            ..want
        };
        assert_eq!(region(&masked), want);
        // An area set after the mask is the area again.
        let reframed = area(masked, [64, 64, 0, 0], 1.0);
        assert!(!region(&reframed).area_from_mask);
        // Fractions as (h, w, y, x) and (t, h, w, z, y, x).
        let mut inputs =
            floats(&[("width", 0.25), ("height", 0.5), ("x", 0.75), ("y", 0.3), ("strength", 2.0)]);
        let pct =
            apply("ConditioningSetAreaPercentage", base.clone(), inputs.split_off(0)).unwrap();
        assert_eq!(region(&pct).area, Some(Area::Fraction(vec![0.5, 0.25, 0.3, 0.75])));
        assert_eq!(region(&pct).strength, Some(2.0));
        let video = video_area(base.clone(), [0.35, 0.5, 0.67, 0.5, 0.25, 0.34, 1.3]);
        assert_eq!(
            region(&video).area,
            Some(Area::Fraction(vec![0.67, 0.5, 0.35, 0.34, 0.25, 0.5]))
        );
        let strong = apply("ConditioningSetAreaStrength", base, floats(&[("strength", 0.4)]));
        assert_eq!(region(&strong.unwrap()).strength, Some(0.4));
    }

    /// One of `regions.py`'s sampling cases: `side` lists (prompt, what the nodes do to it).
    fn sample_case(
        io: &BTreeMap<String, Tensor>,
        case: &str,
        positive: Conditioning,
        negative: Conditioning,
    ) {
        let dir = std::env::temp_dir().join(format!("kiln-regions-{case}-{}", std::process::id()));
        let (env, model) = crate::fixtures::tiny_wan_t2v_model(&dir);
        let case_io: BTreeMap<String, Tensor> = [("noise", "noise"), ("sigmas", "sigmas")]
            .map(|(k, from)| {
                let prefix = if case == "video2d" { "video" } else { case };
                (k.to_owned(), io[&format!("{prefix}.{from}")].clone())
            })
            .into_iter()
            .collect();
        let got = super::super::windowed::sample_as_fixture(
            &env,
            &model,
            (&positive, &negative),
            &case_io,
        );
        crate::fixtures::assert_relative(case, got.data(), io[&format!("{case}.out")].data(), 1e-4);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn joined(sides: Vec<Conditioning>) -> Conditioning {
        Conditioning { entries: sides.into_iter().flat_map(|c| c.entries).collect() }
    }

    /// ComfyUI's CFGGuider on the tiny Wan model with prompts in areas, under masks and weighed
    /// (`scripts/reference/regions.py`): a one-frame latent whose sides each have areas the other side mirrors.
    #[test]
    fn regional_prompts_sample_as_comfyuis_on_an_image() {
        let io = crate::fixtures::tensors("regions/sampling.safetensors");
        let p = |name: &str| prompt(&io[&format!("image.{name}")]);
        let positive = joined(vec![
            p("p0"),
            area(p("p1"), [96, 128, 64, 48], 1.5),
            mask(p("p2"), &io["image.mask2"], 0.7, false),
            mask(area(p("p3"), [48, 80, 144, 0], 0.8), &io["image.mask3"], 1.0, false),
        ]);
        let negative = joined(vec![p("n0"), area(p("n1"), [64, 64, 0, 0], 1.0)]);
        sample_case(&io, "image", positive, negative);
    }

    /// As above on a video latent: ConditioningSetAreaPercentageVideo's block of frames and a one-frame mask
    /// over every frame; then a (2-D) area over every frame.
    #[test]
    fn regional_prompts_sample_as_comfyuis_on_a_video() {
        let io = crate::fixtures::tensors("regions/sampling.safetensors");
        let p = |name: &str| prompt(&io[&format!("video.{name}")]);
        let positive = joined(vec![
            p("p0"),
            video_area(p("p1"), [0.5, 0.5, 0.67, 0.5, 0.25, 0.34, 1.3]),
            mask(p("p3"), &io["video.mask3"], 1.0, false),
        ]);
        sample_case(&io, "video", positive, p("n0"));
        let p = |name: &str| prompt(&io[&format!("video2d.{name}")]);
        let positive = joined(vec![p("p0"), area(p("p1"), [32, 32, 16, 16], 1.0)]);
        sample_case(&io, "video2d", positive, p("n0"));
    }
}
