//! The JoyAI Image Edit node (`comfy_extras.nodes_joyimage`): `TextEncodeJoyImageEdit` encodes an edit
//! instruction with up to six reference images, each first resized to JoyImage's nearest aspect bucket, seen by
//! Qwen3-VL and, with a VAE, encoded as the prompt's reference latents.

use std::sync::Arc;

use super::qwen::vision_input;
use super::qwen3vl_edit::encode;
use super::resize::resize;
use super::vae;
use crate::compute::Compute;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;

/// JoyImage's aspect buckets at about 1024² pixels, `(height, width)` (ComfyUI's `BUCKETS_1024`).
const BUCKETS_1024: [(usize, usize); 49] = [
    (512, 1792),
    (512, 1856),
    (512, 1920),
    (512, 1984),
    (512, 2048),
    (576, 1600),
    (576, 1664),
    (576, 1728),
    (576, 1792),
    (640, 1472),
    (640, 1536),
    (640, 1600),
    (704, 1344),
    (704, 1408),
    (704, 1472),
    (768, 1216),
    (768, 1280),
    (768, 1344),
    (832, 1152),
    (832, 1216),
    (896, 1088),
    (896, 1152),
    (960, 1024),
    (960, 1088),
    (1024, 960),
    (1024, 1024),
    (1088, 896),
    (1088, 960),
    (1152, 832),
    (1152, 896),
    (1216, 768),
    (1216, 832),
    (1280, 768),
    (1344, 704),
    (1344, 768),
    (1408, 704),
    (1472, 640),
    (1472, 704),
    (1536, 640),
    (1600, 576),
    (1600, 640),
    (1664, 576),
    (1728, 576),
    (1792, 512),
    (1792, 576),
    (1856, 512),
    (1920, 512),
    (1984, 512),
    (2048, 512),
];

/// Reference images the node grows (`image0` … `image5`).
const MAX_IMAGES: usize = 6;

/// The bucket whose height-to-width ratio is nearest `height / width` (the first of equals).
fn best_bucket(height: usize, width: usize) -> (usize, usize) {
    let target = height as f64 / width as f64;
    let gap = |&(h, w): &(usize, usize)| (h as f64 / w as f64 - target).abs();
    let mut best = BUCKETS_1024[0];
    for bucket in &BUCKETS_1024[1..] {
        if gap(bucket) < gap(&best) {
            best = *bucket;
        }
    }
    best
}

/// `image` (one image) resized bilinearly to its bucket after a center crop to the bucket's aspect, its first
/// three channels kept (ComfyUI's `_resize_reference`).
fn bucketed(image: &Tensor) -> Result<Tensor, NodeError> {
    let &[batch, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    if batch != 1 {
        return Err(NodeError::new(format!(
            "JoyImage reference inputs must contain one image each, got a batch of {batch}"
        )));
    }
    let (bucket_h, bucket_w) = best_bucket(h, w);
    let resized = resize(image, bucket_w, bucket_h, "bilinear", true)?;
    if c <= 3 {
        return Ok(resized);
    }
    let data = resized.data();
    let rgb = data.chunks_exact(c).flat_map(|pixel| pixel[..3].iter().copied()).collect();
    Tensor::new(vec![1, bucket_h, bucket_w, 3], rgb).map_err(|e| NodeError::new(e.to_string()))
}

/// `TextEncodeJoyImageEdit`: the instruction with the connected reference images (each resized to its aspect
/// bucket, about 1024² pixels) in JoyImage's template; with a VAE, their encodings appended as the
/// conditioning's reference latents.
pub(super) struct TextEncodeJoyImageEdit {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl TextEncodeJoyImageEdit {
    pub(super) fn new(compute: Arc<Compute>) -> TextEncodeJoyImageEdit {
        let prompt = InputDef::typed("prompt", "STRING")
            .option("multiline", true)
            .option("dynamicPrompts", true);
        let spec = NodeSpec::new("TextEncodeJoyImageEdit", "", "model/conditioning/joyimage")
            .python_module("comfy_extras.nodes_joyimage")
            .v3()
            .input(InputDef::typed("clip", "CLIP"))
            .input(prompt)
            .optional(InputDef::typed("vae", "VAE"))
            .optional_autogrow_prefix(
                "images",
                InputDef::typed("image", "IMAGE"),
                "image",
                MAX_IMAGES,
            )
            .output(OutputDef::new("CONDITIONING"));
        TextEncodeJoyImageEdit { spec: Arc::new(spec), compute }
    }
}

impl Node for TextEncodeJoyImageEdit {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let mut resized = Vec::new();
        for i in 0..MAX_IMAGES {
            let key = format!("images.image{i}");
            if inputs.get(&key).is_some() {
                resized.push(bucketed(inputs.image(&key)?)?);
            }
        }
        let seen =
            resized.iter().map(|image| vision_input(clip, image)).collect::<Result<Vec<_>, _>>()?;
        let mut references = Vec::new();
        if inputs.has("vae") && !resized.is_empty() {
            let vae = inputs.vae("vae")?;
            for image in &resized {
                references.push(vae::encode(&self.compute, vae, image, ctx)?);
            }
        }
        let cond = encode(&self.compute, inputs, inputs.string("prompt")?, &seen, &references)?;
        Ok(NodeResult::values([cond]))
    }
}

#[cfg(test)]
mod tests {
    //! Against ComfyUI 0f1fa67a's `_find_best_bucket` and `_resize_reference` (`scripts/reference/joyimage_te.py`,
    //! fixture `engine/models/tests/fixtures/joyimage_te/`): the bucket and crop each input size gets, and the
    //! node's copies of the fixture's images (stored one pixel in seven each way).

    use std::collections::BTreeMap;

    use super::{best_bucket, bucketed};
    use crate::nodes::builtin::resize::crop_box;
    use crate::tensor::Tensor;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/tests/fixtures/joyimage_te")
            .join(name)
    }

    fn pair(v: &serde_json::Value) -> (usize, usize) {
        (v[0].as_u64().expect("int") as usize, v[1].as_u64().expect("int") as usize)
    }

    /// The fixture's f32 tensors by name.
    fn io() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(fixture("io.safetensors")).expect("io.safetensors");
        let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        file.tensors()
            .into_iter()
            .map(|(name, view)| {
                let values = view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                (name, (view.shape().to_vec(), values.collect()))
            })
            .collect()
    }

    #[test]
    fn buckets_and_crops_are_comfyuis() {
        let cases: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture("cases.json")).expect("cases.json"))
                .expect("json");
        let buckets = cases["buckets"].as_array().expect("buckets");
        assert!(buckets.len() > 5);
        for case in buckets {
            let (h, w) = pair(&case["input"]);
            let (bh, bw) = pair(&case["bucket"]);
            assert_eq!(best_bucket(h, w), (bh, bw), "{h}x{w}");
            let (y, x) = pair(&case["crop"]);
            let (ch, cw) = pair(&case["cropped"]);
            assert_eq!(crop_box(w, h, bw, bh), (x, y, cw, ch), "{h}x{w}");
        }
    }

    #[test]
    fn reference_copies_are_comfyuis() {
        let io = io();
        for name in ["A", "B", "S"] {
            let (shape, values) = &io[&format!("input.{name}")];
            let image = Tensor::new(shape.clone(), values.clone()).expect("image");
            let copy = bucketed(&image).expect("bucketed");
            let (sub_shape, want) = &io[&format!("copy.{name}.sub7")];
            let &[_, h, w, c] = copy.shape() else { panic!("{:?}", copy.shape()) };
            let got: Vec<f32> = (0..h)
                .step_by(7)
                .flat_map(|y| (0..w).step_by(7).map(move |x| (y, x)))
                .flat_map(|(y, x)| copy.data()[(y * w + x) * c..(y * w + x) * c + 3].to_vec())
                .collect();
            assert_eq!(&sub_shape[1..3], &[h.div_ceil(7), w.div_ceil(7)], "{name}");
            let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{name}: {worst}");
        }
    }
}
