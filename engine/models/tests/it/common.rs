//! Helpers every test module of this binary uses: the CPU backend with a memory manager, and the fixtures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{LoadPlan, ManagerConfig, MemoryManager, Model, SafetensorsFile};
use kiln_compute::{DType, Tensor};
use kiln_models::wan_vae::ClipVae;
use kiln_models::{Error, Header};

/// A fixture file under `tests/fixtures/`.
pub(crate) fn fixture(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(relative)
}

/// The CPU backend with `device_memory` bytes of simulated VRAM, and a memory manager on it (pinning off, so
/// tests never page-lock host memory).
pub(crate) fn cpu(device_memory: u64) -> (Arc<Cpu>, Arc<MemoryManager>) {
    let cpu = Arc::new(Cpu::new(device_memory));
    let manager = MemoryManager::new(cpu.memory().clone(), ManagerConfig::for_this_machine(false))
        .expect("a memory manager on the simulated device");
    (cpu, manager)
}

/// Every tensor of a safetensors fixture as f32 (f32, bf16 and f16 files), by name, with its shape.
pub(crate) fn read_tensors(relative: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let path = fixture(relative);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data();
            let values = match view.dtype() {
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
                other => {
                    panic!("{}: {name} is {other:?}; fixtures hold f32 or bf16", path.display())
                }
            };
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// A safetensors file of f32 tensors (name → shape and values) in the temporary folder, removed on drop.
pub(crate) struct TempTensors(pub(crate) PathBuf);

impl TempTensors {
    /// Writes `tensors` to `kiln-<name>-<pid>-<n>.safetensors` in the temporary folder (`n` counts the files this
    /// process wrote, so tests running at once on the same fixture each have their own).
    pub(crate) fn new(
        name: &str,
        tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    ) -> TempTensors {
        TempTensors::with_metadata(name, tensors, &[])
    }

    /// [`TempTensors::new`] with header metadata entries.
    pub(crate) fn with_metadata(
        name: &str,
        tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
        metadata: &[(&str, &str)],
    ) -> TempTensors {
        static WRITTEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = WRITTEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir()
            .join(format!("kiln-{name}-{}-{n}.safetensors", std::process::id()));
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, (shape, values))| {
                (name, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
            })
            .collect();
        let views = data.iter().map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .expect("a tensor");
            (name.clone(), view)
        });
        let metadata = (!metadata.is_empty())
            .then(|| metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        safetensors::serialize_to_file(views, metadata, &path).expect("writes the file");
        TempTensors(path)
    }
}

impl Drop for TempTensors {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Asserts `got` is within relative error `tol` of `want`: ‖got − want‖∞ ≤ tol · max(‖want‖∞, 1e-6).
#[track_caller]
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    assert_within(what, got, want, tol * scale);
}

/// Asserts every value of `got` is within `tol` of `want`'s (an absolute bound; NaN fails).
#[track_caller]
pub(crate) fn assert_within(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: {} values, want {}", got.len(), want.len());
    let (worst, at) = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| ((g - w).abs(), i))
        .fold((0f32, 0), |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a });
    assert!(
        worst <= tol,
        "{what}: max error {worst} at {at} (got {}, want {}) exceeds {tol}",
        got[at],
        want[at]
    );
}

/// Writes a safetensors file whose bf16 tensors of `shapes` are all zero, as a sparse file (real-sized VAEs
/// cost no disk).
pub(crate) fn write_header_only(path: &Path, shapes: &[(String, Vec<usize>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in shapes {
        let len = shape.iter().product::<usize>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header)).expect("a header");
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    std::fs::write(path, &bytes).expect("writing a header");
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("reopening");
    file.set_len((bytes.len() + offset) as u64).expect("extending the file");
}

/// The JSON fixture at `relative` (a reference script's recorded inputs and outputs).
pub(crate) fn json(relative: &str) -> serde_json::Value {
    let path = fixture(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON list of token ids.
pub(crate) fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|id| id.as_u64().expect("an id") as u32).collect()
}

/// The fixture `file`'s tensors with its token table `table` (a tiny network's first rows) tiled to `vocab` rows, so
/// that row `id % rows` answers every real id as the reference read it, written to a scratch file.
pub(crate) fn tiled_table(file: &str, table: &str, vocab: usize) -> TempTensors {
    let mut tensors = read_tensors(file);
    let (shape, values) = tensors.remove(table).expect("the token table");
    let (rows, width) = (shape[0], shape[1]);
    let tiled: Vec<f32> =
        (0..vocab).flat_map(|id| values[(id % rows) * width..][..width].to_vec()).collect();
    tensors.insert(table.to_owned(), (vec![vocab, width], tiled));
    TempTensors::new(file.replace('/', "-").trim_end_matches(".safetensors"), tensors)
}

/// A fixture's tensors by name, each with its shape (what [`read_tensors`] returns).
pub(crate) type Io = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Fixture tensor `name` on the CPU.
pub(crate) fn input(b: &Cpu, io: &Io, name: &str) -> Tensor<Cpu> {
    let (shape, values) = &io[name];
    b.from_f32(shape, values, DType::F32).expect(name)
}

/// ‖got − want‖∞ / ‖want‖∞.
pub(crate) fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let worst = got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    worst / want.iter().fold(0f32, |m, w| m.max(w.abs()))
}

/// ComfyUI's `rope_options` as a fixture's case records them (absent keys, or `null`: the identity).
pub(crate) fn rope_options(v: &serde_json::Value) -> kiln_models::RopeOptions {
    let get =
        |k: &str, default: f64| v.get(k).and_then(serde_json::Value::as_f64).unwrap_or(default);
    kiln_models::RopeOptions {
        scale: [get("scale_t", 1.0), get("scale_y", 1.0), get("scale_x", 1.0)],
        shift: [get("shift_t", 0.0), get("shift_y", 0.0), get("shift_x", 0.0)],
    }
}

/// Fixture tensor `name` `[1, C, 1, H, W]` as an image `[1, C, H, W]`.
pub(crate) fn image(b: &Cpu, io: &Io, name: &str) -> Tensor<Cpu> {
    let (shape, values) = &io[name];
    b.from_f32(&[shape[0], shape[1], shape[3], shape[4]], values, DType::F32).expect("an image")
}

/// Checks `got` against fixture `want`: shape, dtype and values within 1e-4.
pub(crate) fn check(b: &Cpu, what: &str, got: &Tensor<Cpu>, io: &Io, want: &str) {
    let (shape, values) = &io[want];
    assert_eq!(got.shape(), shape.as_slice(), "{what} {want}");
    assert_eq!(got.dtype(), DType::F32, "{what} {want}");
    assert_close(&format!("{what} {want}"), &b.to_f32(got).expect("read"), values, 1e-4);
}

/// Gathers the chunks a `*_with` call hands out, in order, into one clip `[1, C, T, H, W]`.
pub(crate) fn gather(
    b: &Cpu,
    run: impl FnOnce(&mut dyn FnMut(Tensor<Cpu>) -> kiln_models::Result<()>) -> kiln_models::Result<()>,
) -> Tensor<Cpu> {
    let mut chunks: Vec<Tensor<Cpu>> = Vec::new();
    run(&mut |t| {
        chunks.push(t);
        Ok(())
    })
    .expect("a streamed pass");
    let frames = b.concat(&chunks.iter().collect::<Vec<_>>(), 0).expect("frames");
    let &[t, c, h, w] = frames.shape() else { panic!("frames {:?}", frames.shape()) };
    b.permute(&frames.reshape(&[1, t, c, h, w]).expect("reshape"), &[0, 2, 1, 3, 4]).expect("clip")
}

/// The clip decode of `z` by `vae`, `per` latent frames asked for a chunk.
pub(crate) fn decode_clip<V: ClipVae>(
    b: &Cpu,
    vae: &V,
    z: &Tensor<Cpu>,
    per: usize,
) -> Tensor<Cpu> {
    gather(b, |out| vae.decode_video_with(b, z, per, out))
}

/// The clip encode of `x` by `vae`, `per` frames asked for a chunk.
pub(crate) fn encode_clip<V: ClipVae>(
    b: &Cpu,
    vae: &V,
    x: &Tensor<Cpu>,
    per: usize,
) -> Tensor<Cpu> {
    gather(b, |out| vae.encode_video_with(b, x, per, out))
}

/// The tiny VAE of fixture `weights` on the CPU: its weights loaded by the plan `plan` makes of its header.
pub(crate) fn load_weights(
    weights: &str,
    plan: impl FnOnce(&Header) -> LoadPlan,
) -> (Arc<Cpu>, Model) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(weights)).expect("open");
    let weights = manager.load(&plan(&Header::new(&file, "")), &mut |_, _| {});
    (b, weights.expect("load"))
}

/// Every case of the fixture `cases` (`count` of them, each an `op` on `{name}.x` giving `{name}.out` in `io`),
/// chunked as ComfyUI does (8 frames, 2 latent frames) and as Kiln's nodes ask (4, 1), and through the
/// whole-clip conveniences.
pub(crate) fn check_cases<V: ClipVae>(b: &Cpu, vae: &V, io: &Io, cases: &str, count: usize) {
    let cases = json(cases);
    let cases = cases["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), count);
    for case in cases {
        let name = case["name"].as_str().expect("a name");
        let x = input(b, io, &format!("{name}.x"));
        let want = format!("{name}.out");
        match case["op"].as_str().expect("an op") {
            "encode" => {
                for per in [8, 4] {
                    check(b, &format!("per {per}"), &encode_clip(b, vae, &x, per), io, &want);
                }
                check(b, "encode_video", &vae.encode_video(b, &x).expect("encode"), io, &want);
            }
            "decode" => {
                for per in [2, 1] {
                    check(b, &format!("per {per}"), &decode_clip(b, vae, &x, per), io, &want);
                }
                check(b, "decode_video", &vae.decode_video(b, &x).expect("decode"), io, &want);
            }
            other => panic!("{name}: an op {other}"),
        }
    }
}

/// Checks that an image takes the one-frame clip's operations exactly (fixtures `encode_image` and `decode_1f`
/// of `io`; the image's latent of shape `latent`), and that each image of a batch of two (the fixture and
/// another input) comes out as if alone, within `batch_tol`.
pub(crate) fn check_images_are_one_frame_clips<V: ClipVae>(
    b: &Cpu,
    vae: &V,
    io: &Io,
    latent: [usize; 4],
    batch_tol: f32,
) {
    let x = image(b, io, "encode_image.x");
    let picture = vae.encode(b, &x).expect("encode an image");
    assert_eq!(picture.shape(), latent);
    let clip = encode_clip(b, vae, &input(b, io, "encode_image.x"), 4);
    let picture = b.to_f32(&picture).expect("read");
    assert_eq!(picture, b.to_f32(&clip).expect("read"), "encode");
    assert_close("image encode", &picture, &io["encode_image.out"].1, 1e-4);

    let z = image(b, io, "decode_1f.x");
    let picture = vae.decode(b, &z).expect("decode an image");
    assert_eq!(picture.shape(), [1, 3, 32, 48]);
    let clip = decode_clip(b, vae, &input(b, io, "decode_1f.x"), 1);
    let picture = b.to_f32(&picture).expect("read");
    assert_eq!(picture, b.to_f32(&clip).expect("read"), "decode");
    assert_close("image decode", &picture, &io["decode_1f.out"].1, 1e-4);

    type Run<'a> = &'a dyn Fn(&Tensor<Cpu>) -> kiln_models::Result<Tensor<Cpu>>;
    let (enc, dec) = (|t: &Tensor<Cpu>| vae.encode(b, t), |t: &Tensor<Cpu>| vae.decode(b, t));
    let runs: [(&str, Tensor<Cpu>, Run<'_>); 2] = [("encode", x, &enc), ("decode", z, &dec)];
    for (what, x, run) in runs {
        let other = b.affine(&x, -0.5, 0.1).expect("another input");
        let batch = b.concat(&[&x, &other], 0).expect("a batch");
        let together = b.to_f32(&run(&batch).expect("a batch")).expect("read");
        let alone: Vec<f32> = [&x, &other]
            .into_iter()
            .flat_map(|t| b.to_f32(&run(t).expect("alone")).expect("read"))
            .collect();
        assert_close(&format!("batched {what}"), &together, &alone, batch_tol);
    }
}

/// Checks that `vae` (downscale `r`, `z` latent channels) refuses as input errors: chunks of 3 or 0 frames, frames
/// r/2 rows high, an image as a clip, no latent frames a chunk, and a latent of `wide` channels as a clip or an
/// image.
pub(crate) fn check_refusals<V: ClipVae>(b: &Cpu, vae: &V, r: usize, z: usize, wide: usize) {
    let invalid = |res: kiln_models::Result<()>, what: &str| {
        assert!(matches!(res, Err(Error::Invalid(_))), "{what}: {res:?}");
    };
    let clip = b.full(&[1, 3, 5, r, r], 0.0, DType::F32).expect("a clip");
    invalid(vae.encode_video_with(b, &clip, 3, &mut |_| Ok(())), "3 frames a chunk");
    invalid(vae.encode_video_with(b, &clip, 0, &mut |_| Ok(())), "no frames a chunk");
    let small = b.full(&[1, 3, 5, r / 2, r], 0.0, DType::F32).expect("a clip");
    invalid(vae.encode_video_with(b, &small, 4, &mut |_| Ok(())), &format!("{} rows", r / 2));
    let image = b.full(&[1, 3, r, r], 0.0, DType::F32).expect("an image");
    invalid(vae.encode_video_with(b, &image, 4, &mut |_| Ok(())), "an image as a clip");
    let latent = b.full(&[1, z, 2, 1, 1], 0.0, DType::F32).expect("a latent");
    invalid(vae.decode_video_with(b, &latent, 0, &mut |_| Ok(())), "no latent frames a chunk");
    let wide_latent = b.full(&[1, wide, 2, 1, 1], 0.0, DType::F32).expect("a latent");
    invalid(
        vae.decode_video_with(b, &wide_latent, 1, &mut |_| Ok(())),
        &format!("{wide} channels"),
    );
    assert!(matches!(vae.decode(b, &wide_latent), Err(Error::Invalid(_))), "a clip as an image");
}

/// A fresh directory `kiln-{name}-{pid}-{test}` in the temporary folder for a test's files.
pub(crate) fn scratch_dir(name: &str, test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-{name}-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// `detect` on a header-only file of `shapes`, written as `file` under `dir`.
pub(crate) fn detect_header_only<T>(
    dir: &Path,
    file: &str,
    shapes: &[(String, Vec<usize>)],
    detect: impl FnOnce(&Header) -> T,
) -> T {
    let path = dir.join(file);
    write_header_only(&path, shapes);
    let sf = SafetensorsFile::open(&path).expect("open");
    detect(&Header::new(&sf, ""))
}
